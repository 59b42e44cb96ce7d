"""`kv_cache: static`: fixed slots and columns give each request's own logits, and compile once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo

from llmd.config import load_profile
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import Request
from tests.helpers.configs import eager_profile
from tests.helpers.engine import PROMPT, greedy, record_logits, staggered_batch, static_profile, unique_graphs

# Five prompts of 18, 40, 24, 32 and 20 tokens: the second is longer than the column it joins at.
WORDS = [1, 12, 4, 8, 2]
# With a 48-token cache the column reaches capacity three times in 30 steps (see test below).
LEAVE = {3: "b1", 14: "b3", 20: "b2"}


def prompts_of(tiny_model: Path, words: list[int]) -> list[list[int]]:
    tokenizer = ChatTokenizer(tiny_model)
    return [tokenizer.encode_chat([{"role": "user", "content": "word " * count}]) for count in words]


def static_batch(runner: ModelRunner) -> StaticDecodeBatch:
    assert isinstance(runner.batch, StaticDecodeBatch)
    return runner.batch


def each_alone(tiny_model: Path, prompts: list[list[int]], counts: dict[str, int]) -> dict[str, list[int]]:
    """Each prompt decoded on its own on the dynamic path; logits recorded under 200 + k."""
    runner = ModelRunner(tiny_model, eager_profile())
    tokens = {}
    for k, prompt in enumerate(prompts):
        alone = Request(f"a{k}", prompt, greedy(200 + k))
        count = counts[f"b{k}"]
        tokens[f"b{k}"] = [runner.first_token(alone)] + [runner.decode([alone])[0] for _ in range(count - 1)]
        runner.release(alone.request_id)
    return tokens


def assert_same_as_alone(
    tiny_model: Path, prompts: list[list[int]], together: dict[str, list[int]],
    seen: dict[int, list[torch.Tensor]],
) -> None:
    batched = {k: list(v) for k, v in seen.items()}
    alone = each_alone(tiny_model, prompts, {name: len(ids) for name, ids in together.items()})
    for k in range(len(prompts)):
        assert together[f"b{k}"] == alone[f"b{k}"], k
        torch.testing.assert_close(torch.stack(batched[100 + k]), torch.stack(seen[200 + k]),
                                   rtol=1e-4, atol=1e-4)


def test_a_static_cache_without_compile_is_a_valid_profile(tmp_path: Path) -> None:
    path = tmp_path / "static.yaml"
    path.write_text("kv_cache: static\ncompile: none\n")
    profile = load_profile(str(path))
    assert profile.kv_cache == "static" and profile.compile == "none"


def test_static_batch_equals_each_request_alone(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, static_profile(max_running=8))
    tokenizer = ChatTokenizer(tiny_model)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": "word " * (3 * k + 1)}]) for k in range(8)]
    batch = [Request(f"b{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    together = staggered_batch(runner, batch, steps=20, leave={9: "b3"})
    assert runner.active_sequences == 7 and len(together["b3"]) == 7
    assert static_batch(runner).input_ids.shape == (8, 1)  # free slots ran too
    assert runner.model.config._attn_implementation == "sdpa"  # decode_attention only inside the step
    assert_same_as_alone(tiny_model, prompts, together, seen)


def test_compaction_when_the_column_reaches_capacity(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, static_profile(max_running=4, max_context=48))
    prompts = prompts_of(tiny_model, WORDS)
    requests = [Request(f"b{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    together = staggered_batch(runner, requests, steps=30, leave=LEAVE)
    batch = static_batch(runner)
    assert batch.capacity == 48 and batch.compactions == 3
    assert all(torch.isfinite(logits).all() for row in seen.values() for logits in row)
    assert_same_as_alone(tiny_model, prompts, together, seen)


def test_a_prompt_that_fills_the_cache_is_refused_and_released(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, static_profile(max_running=2, max_context=16))
    request = Request("long", list(range(5, 21)), greedy(1))
    with pytest.raises(ValueError, match="16-token prompt leaves no room in a 16-token cache"):
        runner.first_token(request)
    runner.release("long")
    assert runner.active_sequences == 0 and static_batch(runner).request_ids == []


def test_kv_tensors_show_a_slot_as_the_dynamic_path_holds_it(tiny_model: Path) -> None:
    prompt = ChatTokenizer(tiny_model).encode_chat(PROMPT)
    runners = [ModelRunner(tiny_model, static_profile(max_running=2)),
               ModelRunner(tiny_model, eager_profile())]
    for runner in runners:
        runner.first_token(Request("neighbour", prompt + [9] * 7, greedy(3)))  # so the row is padded
        runner.first_token(Request("r", prompt, greedy(3)))
    static, dynamic = (runner.kv_tensors("r") for runner in runners)
    assert [keys.shape[2] for keys, _ in static] == [len(prompt)] * len(static)
    assert all(keys.is_inference() for keys, _ in static)  # what `llmd check` looks for
    torch.testing.assert_close(static, dynamic, rtol=1e-5, atol=1e-5)
    assert runners[0].kv_tensors("nobody") == []


@pytest.fixture(scope="module")
def compiled_runner(tiny_model: Path) -> Iterator[ModelRunner]:
    """One runner whose decode step is compiled (inductor on the CPU) and warmed up: compiling is slow."""
    runner = ModelRunner(tiny_model, static_profile(max_running=4, max_context=48, compile="default"))
    before = unique_graphs()
    assert runner.warm_up_decode() > 0
    assert unique_graphs() == before + 1, "the decode step compiles to one graph"
    yield runner
    torch._dynamo.reset()


def test_compiled_decode_equals_eager_and_never_recompiles(
    tiny_model: Path, compiled_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_logits(monkeypatch)
    graphs = unique_graphs()
    prompts = prompts_of(tiny_model, WORDS)
    requests = [Request(f"b{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = staggered_batch(compiled_runner, requests, steps=30, leave=LEAVE)
    assert unique_graphs() == graphs and static_batch(compiled_runner).compactions == 3
    for request in requests:
        compiled_runner.release(request.request_id)
    compiled_logits = {k: list(v) for k, v in seen.items()}
    eager = ModelRunner(tiny_model, static_profile(max_running=4, max_context=48))
    again = [Request(f"b{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    seen.clear()
    assert staggered_batch(eager, again, steps=30, leave=LEAVE) == compiled
    for k in range(len(prompts)):
        torch.testing.assert_close(torch.stack(compiled_logits[100 + k]), torch.stack(seen[100 + k]),
                                   rtol=1e-4, atol=1e-4)


def test_bursts_chunks_and_penalties_do_not_recompile(tiny_model: Path, compiled_runner: ModelRunner) -> None:
    graphs = unique_graphs()
    prompts = prompts_of(tiny_model, [3, 9, 5, 1, 6, 2])
    with torch._dynamo.config.patch(error_on_recompile=True):
        burst = [Request(f"c{k}", p, greedy(6, frequency_penalty=k / 2)) for k, p in enumerate(prompts[:3])]
        compiled_runner.prefill_many([(r, len(r.prompt_ids)) for r in burst])
        for _ in range(3):
            compiled_runner.decode(burst)
        compiled_runner.retire(burst[1])
        running = [burst[0], burst[2]]
        chunked = Request("chunked", prompts[3], greedy(4))
        for upto in range(5, len(chunked.prompt_ids), 5):
            assert compiled_runner.prefill(chunked, upto) is None
            compiled_runner.decode(running)
        compiled_runner.prefill(chunked)
        running.append(chunked)
        for _ in range(3):
            compiled_runner.decode(running)
        for request in running:
            compiled_runner.release(request.request_id)
        lone = Request("lone", prompts[4], greedy(4))
        compiled_runner.first_token(lone)
        compiled_runner.decode([lone])
        compiled_runner.release("lone")
    assert unique_graphs() == graphs and compiled_runner.active_sequences == 0
