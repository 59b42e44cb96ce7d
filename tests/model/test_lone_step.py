"""The compiled decode steps (one row, and two or more): proven at load, the eager walk's logits, never a
recompile after."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from llmd.config import ConfigError, Profile, load_profile
from llmd.engine.client import EngineClient
from llmd.engine.model import lone_step
from llmd.engine.model.checklist import batch_step_check, lone_step_check
from llmd.engine.model.int8 import Int8Linear
from llmd.engine.model.lone_step import (
    MIN_ROWS,
    MIN_WINDOW,
    BatchStep,
    CompiledStep,
    LoneStep,
)
from llmd.engine.model.onednn import replace_module
from llmd.engine.model.probes import FastPaths, check_compiled, float32_logits, further_than_eager
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.types import Request
from llmd.engine.worker import EngineWorker
from tests.helpers.configs import eager_profile
from tests.helpers.engine import (
    greedy,
    record_logits,
    staggered_batch,
    static_profile,
    text_of,
    unique_graphs,
)
from tests.model.test_static_cache import prompts_of

# A 48-token cache: the column reaches capacity while the first request is alone again, so a
# lone window also starts after a compaction; b1 joins at step 1 and leaves at 9.
WORDS = [1, 3, 2]
LEAVE = {9: "b1", 12: "b2"}


@pytest.fixture(scope="module")
def lone_runner(tiny_model: Path) -> Iterator[ModelRunner]:
    profile = static_profile(lone_step="compiled", batch_step="compiled", max_running=4, max_context=48)
    runner = ModelRunner(tiny_model, profile)
    yield runner
    torch._dynamo.reset()


def batch_of(runner: ModelRunner) -> StaticDecodeBatch:
    assert isinstance(runner.batch, StaticDecodeBatch)
    return runner.batch


def lone_traffic(runner: ModelRunner, prompts: list[list[int]]) -> dict[str, list[int]]:
    """b0 alone, then beside b1 (and b2 for a while), then alone again past a compaction."""
    requests = [Request(f"b{k}", prompt, greedy(100 + k)) for k, prompt in enumerate(prompts)]
    tokens = staggered_batch(runner, requests, steps=30, leave=LEAVE)
    runner.release("b0")
    return tokens


def counted(monkeypatch: pytest.MonkeyPatch, step: CompiledStep) -> list[tuple[int, bool]]:
    """Each run of `step` from now on: its rows, and whether the graph ran it."""
    runs = []
    real_run = step.run

    def counting_run(*args: Any) -> torch.Tensor | None:
        logits = real_run(*args)
        runs.append((args[2].shape[0], logits is not None))
        return logits

    monkeypatch.setattr(step, "run", counting_run)
    return runs


def test_mixed_traffic_decodes_as_the_eager_walk_does_and_never_recompiles(
    tiny_model: Path, lone_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = batch_of(lone_runner)
    lone, batched = batch.lone, batch.batched
    assert lone_runner.fast_paths.lone_problem is None and lone is not None and batch.direct is not None
    assert lone_runner.fast_paths.batch_problem is None and batched is not None and batched.unguarded
    fast = lone_runner.fast_paths
    for step, seconds in ((lone, fast.lone_seconds), (batched, fast.batch_seconds)):
        assert step.compile_seconds is not None and 0 < step.compile_seconds == seconds
    lone_runs, batch_runs = counted(monkeypatch, lone), counted(monkeypatch, batched)
    # both graphs are called as inductor built them, dynamo's frame never entered
    through_dynamo: list[object] = []
    for step in (lone, batched):
        assert step.direct is not None and step.direct_problem is None
        real_compiled = step._compiled
        monkeypatch.setattr(step, "_compiled",
                            lambda *args, real=real_compiled: through_dynamo.append(args) or real(*args))
    seen = record_logits(monkeypatch)
    prompts = prompts_of(tiny_model, WORDS)
    graphs, compactions = unique_graphs(), batch.compactions
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = lone_traffic(lone_runner, prompts)
    assert unique_graphs() == graphs and lone.retired is None and batched.retired is None
    assert batch.compactions > compactions  # a lone window after the columns moved
    # b0's steps alone went through the lone graph: before b1 joined and after the others left;
    # with b1, and b2 for a while, through the batch graph (2 and 3 rows)
    assert len(lone_runs) >= 15 and all(ran for _, ran in lone_runs)
    assert {rows for rows, _ in batch_runs} == {2, 3} and all(ran for _, ran in batch_runs)
    assert not through_dynamo
    compiled_logits = {k: list(v) for k, v in seen.items()}

    eager = ModelRunner(tiny_model, static_profile(max_running=4, max_context=48))
    assert eager.fast_paths.lone_problem is not None and batch_of(eager).lone is None
    assert eager.fast_paths.batch_problem is not None and batch_of(eager).batched is None
    seen.clear()
    assert lone_traffic(eager, prompts) == compiled
    for k in range(len(prompts)):
        torch.testing.assert_close(torch.stack(compiled_logits[100 + k]), torch.stack(seen[100 + k]),
                                   rtol=1e-4, atol=1e-4)


def test_a_recompile_after_load_retires_the_graph_and_the_step_runs_eager(
    lone_runner: ModelRunner, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = batch_of(lone_runner)
    lone = batch.lone
    assert lone is not None and lone.retired is None
    monkeypatch.setattr(lone, "retired", None)  # back in service for the module's other tests
    layers = batch.layers
    # float64 windows: a guard fails (the tensors' are evaluated even unguarded), and a
    # recompile after load is refused
    keys = [layer.keys[:1, :, :4].double() for layer in layers]
    values = [layer.values[:1, :, :4].double() for layer in layers]
    with caplog.at_level(logging.WARNING, "llmd.engine"), torch.inference_mode():
        # the direct call declines tensors laid out otherwise than it learnt: dynamo's guards decide
        assert lone.direct is not None and lone.direct([batch.input_ids[:1], batch.position_ids[:1],
                                                        *keys, *values]) is None
        assert lone.run(keys, values, batch.input_ids[:1], batch.position_ids[:1]) is None
        assert lone.run(keys, values, batch.input_ids[:1], batch.position_ids[:1]) is None  # stays retired
    assert lone.retired is not None and "retired, eager from now on" in caplog.text
    request = Request("after", [5, 6, 7, 8], greedy(4))
    lone_runner.first_token(request)
    assert len(lone_runner.decode([request])) == 1
    lone_runner.release("after")


def test_their_guards_pass_at_every_shape_they_take_and_they_run_unguarded(lone_runner: ModelRunner) -> None:
    batch = batch_of(lone_runner)
    lone, batched = batch.lone, batch.batched
    assert lone is not None and lone.unguarded and batched is not None and batched.unguarded
    graphs = unique_graphs()
    every = range(MIN_WINDOW, batch.capacity)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert check_compiled(batch, lone, [1], every) is None
        assert check_compiled(batch, batched, range(MIN_ROWS, batch.slots + 1), every) is None
        # a window of the whole row is contiguous: the guards refuse it, so `run` leaves it eager
        assert check_compiled(batch, lone, [1], [batch.capacity]) is not None
        assert check_compiled(batch, batched, [batch.slots], [batch.capacity]) is not None
    assert unique_graphs() == graphs and lone.retired is None and batched.retired is None
    assert not lone.takes(1, MIN_WINDOW - 1) and not lone.takes(1, batch.capacity) and not lone.takes(2, 8)
    assert not batched.takes(1, 8) and not batched.takes(batch.slots + 1, 8)
    assert not batched.takes(2, MIN_WINDOW - 1) and not batched.takes(2, batch.capacity)


def test_a_lone_stream_that_fills_its_row_keeps_the_graph(
    lone_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = batch_of(lone_runner)
    lone = batch.lone
    assert lone is not None and lone.retired is None and not batch.request_ids
    windows = []
    real_run = lone.run

    def watching_run(keys: list[torch.Tensor], *rest: Any) -> torch.Tensor | None:
        windows.append(keys[0].shape[2])
        return real_run(keys, *rest)

    monkeypatch.setattr(lone, "run", watching_run)
    request = Request("long", [5, 6, 7, 8], greedy(60))
    lone_runner.first_token(request)
    with torch._dynamo.config.patch(error_on_recompile=True):
        # alone from an empty batch: its window grows by a column a step, to the whole row
        for _ in range(batch.capacity - len(request.prompt_ids)):
            lone_runner.decode([request])
    lone_runner.release(request.request_id)
    assert batch.capacity in windows and lone.retired is None


def test_max_autotune_compiles_gemm_template_matmuls_that_decode_as_the_eager_walk_does(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Which kernel autotuning picks depends on this host's timings: the test leaves the template
    # the only choice, so that it knows what it checks; the graph cache is off so that the
    # kernels are generated (and counted) here.
    monkeypatch.setattr(lone_step, "AUTOTUNE", {**lone_step.AUTOTUNE, "max_autotune_gemm_backends": "CPP"})
    with torch._inductor.config.patch(fx_graph_cache=False):
        runner = ModelRunner(tiny_model, static_profile(lone_step="max-autotune", max_running=2,
                                                        max_context=48))
    lone = batch_of(runner).lone
    assert runner.fast_paths.lone_problem is None and lone is not None and lone.autotune
    assert lone.templated == 2 * 4 + 1  # per layer: q/k/v, o, gate/up and down as one kernel each; the head
    seen = record_logits(monkeypatch)
    request = Request("tuned", [5, 6, 7, 8], greedy(200))
    tokens = [runner.first_token(request)]
    tokens += [runner.decode([request])[0] for _ in range(30)]
    runner.release("tuned")
    tuned_logits = list(seen[200])

    eager = ModelRunner(tiny_model, static_profile(max_running=2, max_context=48))
    seen.clear()
    request = Request("eager", [5, 6, 7, 8], greedy(200))
    assert [eager.first_token(request)] + [eager.decode([request])[0] for _ in range(30)] == tokens
    torch.testing.assert_close(torch.stack(tuned_logits), torch.stack(seen[200]), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()


@pytest.mark.slow
def test_max_autotune_takes_int8_layers_onto_the_gemm_template_too(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an int8 layer's weight and scales reach the graph as constants, which the template needs
    monkeypatch.setattr(lone_step, "AUTOTUNE", {**lone_step.AUTOTUNE, "max_autotune_gemm_backends": "CPP"})
    profile = msgspec.structs.replace(load_profile("cpu-int8"), lone_step="max-autotune", max_running=2,
                                      max_context=48)
    with torch._inductor.config.patch(fx_graph_cache=False):
        runner = ModelRunner(tiny_model, profile)
    lone = batch_of(runner).lone
    assert runner.fast_paths.lone_problem is None and lone is not None
    assert lone.templated == 2 * 7 + 1  # int8 layers are not grouped: q, k, v, o, gate, up, down; the head
    request = Request("int8", [5, 6, 7, 8], greedy(8))
    runner.first_token(request)
    assert all(len(runner.decode([request])) == 1 for _ in range(6))
    runner.release("int8")
    torch._dynamo.reset()


def test_the_float32_reference_is_the_int8_model_evaluated_in_float32(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, msgspec.structs.replace(load_profile("cpu-int8"), lone_step="eager"))
    float32 = copy.deepcopy(runner.model)
    for name, module in list(float32.named_modules()):
        if isinstance(module, Int8Linear):
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear.weight.data = module.qweight.float() * module.scales.float().unsqueeze(1)
            replace_module(float32, name, linear)
    float32.float()
    tokens = [5, 6, 7, 8, 9, 10]
    with torch.inference_mode():
        expected = float32(input_ids=torch.tensor([tokens])).logits[0, -1]
    got = float32_logits(runner.model, tokens)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():  # not what the model gives in its own dtype, which rounds
        assert not torch.equal(runner.model(input_ids=torch.tensor([tokens])).logits[0, -1].float(), got)


def test_a_compiled_step_no_further_from_float32_than_eager_is_kept() -> None:
    exact = torch.tensor([8.0, -2.0, 1.0])
    eager, compiled = exact + torch.tensor([0.2, 0.0, 0.0]), exact + torch.tensor([0.0, -0.1, 0.0])
    assert further_than_eager(exact, eager, compiled, tolerance=0.001) is None  # 1.25 % vs 2.5 %
    assert further_than_eager(exact, compiled, eager, tolerance=0.001) == (
        "logits 2.50% from float32's, the eager step's 1.25%")
    assert further_than_eager(exact, exact, compiled, tolerance=0.016) is None  # within the tolerance


@pytest.mark.parametrize(("profile", "message"), [
    (static_profile(lone_step="compiled", max_running=2, max_context=48), "logits differ by up to"),
    # with int8 layers the refused step is measured against float32, and is further from it
    (msgspec.structs.replace(load_profile("cpu-int8"), lone_step="compiled", max_running=2, max_context=48),
     "logits "),
])
def test_a_step_that_fails_its_probe_leaves_lone_streams_eager(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, profile: Profile,
    message: str
) -> None:
    real_step = LoneStep._step

    def wrong(self: LoneStep, *inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return real_step(self, *inputs).flip(-1)  # type: ignore[arg-type]

    monkeypatch.setattr(LoneStep, "_step", wrong)
    with caplog.at_level(logging.WARNING, "llmd.engine"):
        runner = ModelRunner(tiny_model, profile)
    problem = runner.fast_paths.lone_problem
    assert problem is not None and problem.startswith(message)
    if profile.quantization == "int8":
        assert "from float32's, the eager step's" in problem
    assert batch_of(runner).lone is None and batch_of(runner).direct is not None
    assert "the compiled step failed its probe" in caplog.text
    request = Request("eager", [5, 6, 7, 8], greedy(3))
    runner.first_token(request)
    assert len(runner.decode([request])) == 1


def test_a_batch_step_that_fails_its_probe_leaves_batches_eager(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def wrong(self: BatchStep, *inputs: Any) -> torch.Tensor:
        return CompiledStep._walk(self, *inputs).flip(-1)

    monkeypatch.setattr(BatchStep, "_step", wrong)
    with caplog.at_level(logging.WARNING, "llmd.engine"):
        runner = ModelRunner(tiny_model, static_profile(batch_step="compiled", max_running=2, max_context=48))
    problem = runner.fast_paths.batch_problem
    assert problem is not None and problem.startswith("logits differ by up to")
    assert batch_of(runner).batched is None and batch_of(runner).direct is not None
    assert "the decode steps of two or more streams run eager" in caplog.text
    requests = [Request(f"eager-{n}", [5, 6, 7, 8 + n], greedy(3)) for n in range(2)]
    for request in requests:
        runner.first_token(request)
    assert len(runner.decode(requests)) == 2


@pytest.mark.parametrize("key", ["lone_step", "batch_step"])
@pytest.mark.parametrize(("changes", "message"), [
    ({"device": "cuda"}, "needs device: cpu"),
    ({"kv_cache": "dynamic"}, "kv_cache: static"),
    ({"kv_cache": "static", "compile": "default", "onednn_linear": "false"}, "compile: none"),
])
def test_profiles_the_compiled_steps_cannot_serve_are_refused(
    tmp_path: Path, key: str, changes: dict[str, str], message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"{key}: compiled\n" + "".join(f"{k}: {v}\n" for k, v in changes.items()))
    with pytest.raises(ConfigError, match=f"{key}.*{message}"):
        load_profile(str(path))


def test_llmd_check_says_whether_the_compiled_lone_step_it_asked_for_was_proven() -> None:
    tuned = msgspec.structs.replace(load_profile("cpu-int8"), lone_step="max-autotune")
    assert lone_step_check(eager_profile(), FastPaths(None, None, "not asked")) is None  # eager
    proven = lone_step_check(tuned, FastPaths(None, None, None, 21.5, 85))
    assert proven is not None and proven.ok
    assert proven.detail == ("one graph (max-autotune), compiled and proven in 21.5 s, "
                             "85 matmuls on the GEMM template")
    refused = lone_step_check(tuned, FastPaths(None, None, "logits differ by up to 0.3 of 8.1"))
    assert refused is not None and not refused.ok
    assert refused.detail == "runs eager: logits differ by up to 0.3 of 8.1"
    assert "lone_step: eager" in refused.fix


def test_llmd_check_says_whether_the_compiled_batch_step_it_asked_for_was_proven() -> None:
    asked = msgspec.structs.replace(load_profile("cpu"), kv_cache="static", batch_step="compiled")
    assert batch_step_check(eager_profile(), FastPaths(None, None, None)) is None  # eager
    proven = batch_step_check(asked, FastPaths(None, None, None, batch_problem=None, batch_seconds=18.25))
    assert proven is not None and proven.ok and proven.detail == "one graph, compiled and proven in 18.2 s"
    refused = batch_step_check(asked, FastPaths(None, None, None, batch_problem="a window of 2 columns: x"))
    assert refused is not None and not refused.ok and refused.detail == "runs eager: a window of 2 columns: x"
    assert "batch_step: eager" in refused.fix


def test_max_autotune_refuses_nf4_layers_it_has_no_kernels_to_choose_for(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("lone_step: max-autotune\nkv_cache: static\nquantization: nf4\n")
    with pytest.raises(ConfigError, match="nf4 layers have none: use compiled"):
        load_profile(str(path))
    path.write_text("lone_step: max-autotune\nkv_cache: dynamic\n")
    with pytest.raises(ConfigError, match="max-autotune compiles the native CPU batch's eager decode step"):
        load_profile(str(path))


def test_the_engine_is_ready_only_once_the_steps_are_compiled_and_counts_them_as_warm_up(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = msgspec.structs.replace(load_profile("cpu"), lone_step="compiled", batch_step="compiled")

    async def main() -> tuple[float, float, str]:
        worker = EngineWorker(tiny_model, config)
        engine = EngineClient(worker, max_context=512)
        await engine.start()
        await asyncio.wait_for(engine.ready.wait(), 900)  # compiling on two busy cores takes a while
        try:
            assert worker.runner is not None
            fast = worker.runner.fast_paths
            assert fast.batch_seconds > 0
            seconds = fast.lone_seconds + fast.batch_seconds
            text, _ = await text_of(engine, greedy(8))
            return seconds, worker.warmup_seconds, text
        finally:
            await engine.shutdown()

    with caplog.at_level(logging.INFO, "llmd.engine"):
        lone_seconds, warmup_seconds, text = asyncio.run(main())
    assert 0 < lone_seconds <= warmup_seconds and text
    assert ("a lone stream's decode steps: one compiled graph (lone_step: compiled, compiled and proven in"
            in caplog.text)
    assert ("the decode steps of 2 to 8 streams: one compiled graph (batch_step: compiled, compiled and "
            "proven in" in caplog.text)
