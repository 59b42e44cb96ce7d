"""The engine on the tiny real model: runner, worker thread and async client together."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from msgspec.structs import replace
from transformers import AutoModelForCausalLM

from llmd.bench.decoder import InProcessDecoder
from llmd.engine.burst import Arrival, carry
from llmd.engine.client import EngineClient
from llmd.engine.model.dynamic_batch import DynamicDecodeBatch
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.sampling import sample
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import Request, SamplingParams, StepResult
from llmd.engine.worker import EngineWorker
from llmd.errors import ContextLengthExceeded, EngineFailure, Overloaded
from tests.helpers.configs import eager_profile
from tests.helpers.engine import PROMPT, greedy, record_logits, run_with_engine, staggered_batch, text_of
from tests.helpers.waiting import wait_until

T = TypeVar("T")



def test_runner_greedy_equals_model_generate(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, eager_profile())
    prompt = ChatTokenizer(tiny_model).encode_chat(PROMPT)
    request = Request("r", prompt, greedy(64))
    ours = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(63)]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    ids = torch.tensor([prompt])
    reference = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=64, min_new_tokens=64, pad_token_id=0)
    assert ours == reference[0, len(prompt):].tolist()


def test_runner_logits_with_kv_cache_equal_a_full_forward_pass(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo model's argmax barely depends on context, so compare logits, not tokens."""
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, eager_profile())
    prompt = ChatTokenizer(tiny_model).encode_chat(PROMPT)
    request = Request("r", prompt, greedy(24))
    generated = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(23)]
    with torch.inference_mode():
        full = runner.model(input_ids=torch.tensor([prompt + generated])).logits[0]
    expected = full[len(prompt) - 1 : len(prompt) + 23]
    torch.testing.assert_close(torch.stack(seen[24]), expected, rtol=1e-4, atol=1e-4)


def test_penalized_requests_count_their_own_tokens(tiny_model: Path) -> None:
    counted: list[float] = []

    def recording_sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None,
                         counts: torch.Tensor | None) -> int:
        counted.append(-1.0 if counts is None else float(counts.sum()))
        return sample(logits, params, gen, counts)

    runner = ModelRunner(tiny_model, eager_profile())  # before: its load-time probe samples too
    runner.sampler = recording_sample
    prompt = ChatTokenizer(tiny_model).encode_chat(PROMPT)
    penalized = Request("p", prompt, greedy(5, frequency_penalty=0.5))
    plain = Request("q", prompt, greedy(5))
    runner.first_token(penalized)
    runner.first_token(plain)
    for _ in range(4):
        runner.decode([penalized, plain])
    assert counted[0::2] == [0.0, 1.0, 2.0, 3.0, 4.0]  # before each of its 5 tokens
    assert set(counted[1::2]) == {-1.0}


def test_in_process_decoder_runner_and_generate_agree(tiny_model: Path) -> None:
    decoder = InProcessDecoder(tiny_model)
    prompt = decoder.prompt_ids(PROMPT)
    ours = decoder.decode(prompt, 20, "runner")
    theirs = decoder.decode(prompt, 20, "generate")
    assert ours.token_ids == theirs.token_ids and len(ours.token_times) == 20 == len(theirs.token_times)
    assert ours.start <= ours.token_times[0] <= ours.token_times[-1]


def test_engine_stream_matches_full_decode(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        text, reason = await text_of(engine, greedy(50))
        tokenizer = ChatTokenizer(tiny_model)
        runner_ids = InProcessDecoder(tiny_model).decode(await engine.encode_chat(PROMPT), 50).token_ids
        assert (text, reason) == (tokenizer.decode(runner_ids), "length")

    run_with_engine(tiny_model, body)


def test_seeded_sampling_is_reproducible_and_per_request(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        params = SamplingParams(max_tokens=30, temperature=1.0, seed=1234)
        first = await text_of(engine, params)
        # A concurrent unseeded request must not disturb the seeded one.
        noise = asyncio.ensure_future(text_of(engine, SamplingParams(max_tokens=30)))
        second = await text_of(engine, params)
        await noise
        assert first == second
        assert torch.initial_seed() != 1234  # the process-global generator was never touched

    run_with_engine(tiny_model, body)


def test_abort_frees_the_slot_within_one_step(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        prompt = await engine.encode_chat(PROMPT)
        with engine.submit(prompt, greedy(4000)) as stream:
            async for event in stream:
                if event.completion_tokens >= 5:
                    break
        steps_at_abort = engine.stats().steps
        for _ in range(200):
            await asyncio.sleep(0.01)
            if engine.stats().aborted == 1:
                break
        stats = engine.stats()
        assert stats.aborted == 1 and stats.running == 0
        assert stats.steps <= steps_at_abort + 1
        assert worker.runner is not None and worker.runner.active_sequences == 0

    run_with_engine(tiny_model, body)


def test_requests_wait_beyond_max_running_and_overflow_is_refused(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        prompt = await engine.encode_chat(PROMPT)
        first = engine.submit(prompt, greedy(3))
        second = engine.submit(prompt, greedy(3))
        with pytest.raises(Overloaded) as refused:
            engine.submit(prompt, greedy(3))
        assert refused.value.code == "queue_full" and 1 <= refused.value.retry_after <= 120
        for stream in (first, second):
            with stream:
                assert [e.completion_tokens async for e in stream] == [1, 2, 3]

    run_with_engine(tiny_model, body, max_running=1, max_queue=1)


def test_requests_that_arrive_together_start_in_one_step(tiny_model: Path) -> None:
    async def one(engine: EngineClient, k: int) -> list[int]:
        prompt = await engine.encode_chat([{"role": "user", "content": f"question {k}: " + "why " * k}])
        with engine.submit(prompt, greedy(3)) as stream:
            return [event.completion_tokens async for event in stream]

    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        assert engine._tokenizer is not None
        render = engine._tokenizer.encode_chat

        def slow_but_the_first(messages: list[dict[str, Any]], *template: Any) -> list[int]:
            if "question 0" not in messages[0]["content"]:
                time.sleep(0.05)  # the first reaches the worker well before the rest
            return render(messages, *template)

        engine._tokenizer.encode_chat = slow_but_the_first  # type: ignore[method-assign]
        worker.burst.bound_s = 30.0  # generous: a loaded CI machine must not flake
        before = engine.stats().steps
        counts = await asyncio.gather(*(one(engine, k) for k in range(6)))
        assert counts == [[1, 2, 3]] * 6
        # One step prefills all six (each gets its first token), two more decode them.
        assert engine.stats().steps - before == 3
        assert worker.burst.bursty  # six admitted with one wake: the next wake waits

        worker.burst.bound_s = 0.2
        worker.arriving(+1)  # a straggler that never comes: the wait is bounded
        started = time.monotonic()
        assert await one(engine, 7) == [1, 2, 3]
        assert time.monotonic() - started < 10
        worker.arriving(-1)

    run_with_engine(tiny_model, body)


def test_lone_requests_turn_the_burst_window_off(tiny_model: Path) -> None:
    """The worker's wiring of `BurstGate`: what it admits after each wake feeds the verdict.
    (When the window is waited and for how long: test_burst.py, on a fake clock.)"""
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        gate = worker.burst
        prompt = await engine.encode_chat(PROMPT)
        assert gate.bursty and gate.quiet_s() == 2.0  # nothing seen yet: the first wake waits
        for _ in range(2):  # one request per wake
            with engine.submit(prompt, greedy(3)) as alone:
                assert [e.completion_tokens async for e in alone][-1] == 3
        assert not gate.bursty and gate.quiet_s() == 0.0

    run_with_engine(tiny_model, body, burst_window_ms=2000.0)


def test_a_request_still_being_read_joins_the_first_prefill_after_lone_requests(tiny_model: Path) -> None:
    """A request counts as arriving while its connection reads it (`arrival`, handed over to its
    encode): after lone requests, with no quiet window in force, the worker still waits for it
    instead of prefilling the request already here alone."""
    async def one(engine: EngineClient, k: int, read: Arrival | None = None) -> list[int]:
        if read is not None:
            carry(read)  # this task serves the request that connection was reading
        prompt = await engine.encode_chat([{"role": "user", "content": f"question {k}"}])
        with engine.submit(prompt, greedy(3)) as stream:
            return [event.completion_tokens async for event in stream]

    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        for k in range(2):
            await one(engine, k)
        assert not worker.burst.bursty  # lone wakes: only requests on their way are waited for
        worker.burst.bound_s = 30.0  # generous: a loaded CI machine must not flake
        read = engine.arrival()  # another client's request, still on the wire
        before = engine.stats().steps
        first = asyncio.create_task(one(engine, 2))
        await asyncio.to_thread(wait_until, "the first request held at the worker", lambda: worker._inbox)
        assert await one(engine, 3, read) == await first == [1, 2, 3]
        assert engine.stats().steps - before == 3  # one step prefilled both, two decoded them
        assert not read.counted

    run_with_engine(tiny_model, body, burst_window_ms=2000.0)


def test_context_check(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        assert engine.check_context(500, None) == 12
        assert engine.check_context(500, 12) == 12
        with pytest.raises(ContextLengthExceeded, match=r"512 tokens.*513"):
            engine.check_context(500, 13)

    run_with_engine(tiny_model, body)


def test_a_failing_step_ends_only_its_requests_and_the_engine_keeps_serving(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        runner = worker.runner
        assert runner is not None
        real_step = runner.step
        calls = {"n": 0}

        def flaky(decode: list[Request], chunks: list[tuple[Request, int]]) -> StepResult:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("simulated device fault")
            return real_step(decode, chunks)

        monkeypatch.setattr(runner, "step", flaky)
        prompt = await engine.encode_chat(PROMPT)
        received: list[str] = []
        with pytest.raises(EngineFailure, match="simulated device fault"), engine.submit(
            prompt, greedy(20)
        ) as stream:
            async for event in stream:
                received.append(event.text)
        assert received, "the failure came after streaming began"
        text, reason = await text_of(engine, greedy(5))
        assert reason == "length" and text

    run_with_engine(tiny_model, body)


def assert_each_alone_gives(
    runner: ModelRunner, prompts: list[list[int]], tokens: dict[str, list[int]], prefix: str,
    batched_logits: dict[int, list[torch.Tensor]], seen: dict[int, list[torch.Tensor]],
) -> None:
    """Prompt k run alone (greedy, max_tokens 100 + k) gives request `{prefix}{k}`'s tokens and logits."""
    for k, prompt in enumerate(prompts):
        alone = Request(f"a{k}", prompt, greedy(100 + k))
        count = len(tokens[f"{prefix}{k}"])
        solo = [runner.first_token(alone)] + [runner.decode([alone])[0] for _ in range(count - 1)]
        runner.release(alone.request_id)
        assert solo == tokens[f"{prefix}{k}"], k
        torch.testing.assert_close(torch.stack(batched_logits[100 + k]), torch.stack(seen[100 + k]),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_batched_decode_equals_each_request_alone(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, kv_cache: str
) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, replace(eager_profile(), kv_cache=kv_cache))
    tokenizer = ChatTokenizer(tiny_model)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": "word " * (3 * k + 1)}]) for k in range(8)]
    assert len({len(p) for p in prompts}) == 8, "prompt lengths must differ to exercise padding"
    batch = [Request(f"b{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    together = staggered_batch(runner, batch, steps=20, leave={9: "b3"})
    batched_logits = {k: list(v) for k, v in seen.items()}
    assert runner.active_sequences == 7 and len(together["b3"]) == 7
    for request in batch:
        runner.release(request.request_id)
    seen.clear()
    assert_each_alone_gives(runner, prompts, together, "b", batched_logits, seen)


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_a_burst_prefilled_together_equals_each_request_alone(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, kv_cache: str
) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, replace(eager_profile(), kv_cache=kv_cache))
    tokenizer = ChatTokenizer(tiny_model)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": "word " * (5 * k + 1)}]) for k in range(5)]
    early = Request("early", prompts[0], greedy(99))
    runner.first_token(early)  # already decoding when the burst arrives
    burst = [Request(f"b{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    firsts = runner.prefill_many([(r, len(r.prompt_ids)) for r in burst])
    together = {r.request_id: [first] for r, first in zip(burst, firsts, strict=True)}
    for _ in range(8):
        for request, token in zip(burst, runner.decode([early, *burst])[1:], strict=True):
            together[request.request_id].append(token)
    batched_logits = {k: list(v) for k, v in seen.items()}
    stored = next(runner.prefix_cache.index.payloads())
    keys = stored[0][0]
    assert keys.untyped_storage().nbytes() == keys.numel() * keys.element_size(), "a view of the batch"
    for request in (early, *burst):
        runner.release(request.request_id)
    seen.clear()
    runner.prefix_cache = type(runner.prefix_cache)(0, 1)  # no reuse: each alone computes its prompt
    assert all(len(t) == 9 for t in together.values())
    assert_each_alone_gives(runner, prompts, together, "b", batched_logits, seen)


def test_batch_shrinks_back_to_no_padding(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, replace(eager_profile(), kv_cache="dynamic"))
    tokenizer = ChatTokenizer(tiny_model)
    short = Request("s", tokenizer.encode_chat([{"role": "user", "content": "hi"}]), greedy(50))
    long = Request("l", tokenizer.encode_chat([{"role": "user", "content": "word " * 40}]), greedy(50))
    staggered_batch(runner, [long, short], steps=4, leave={3: "l"})
    batch = runner.batch
    assert isinstance(batch, DynamicDecodeBatch)
    assert batch.request_ids == ["s"] and batch.mask is not None and bool(batch.mask.all())
    assert batch.cache is not None  # two decode steps since the short prompt's prefill:
    assert batch.cache.get_seq_length() == len(short.prompt_ids) + 2
    runner.release("s")
    assert batch.cache is None and runner.active_sequences == 0


def test_chunked_prefill_equals_whole_prefill(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, eager_profile())
    prompt = ChatTokenizer(tiny_model).encode_chat([{"role": "user", "content": "word " * 30}])
    whole = Request("w", prompt, greedy(101))
    chunked = Request("c", prompt, greedy(102))
    whole_tokens = [runner.first_token(whole)] + [runner.decode([whole])[0] for _ in range(5)]
    runner.release("w")
    firsts = [runner.prefill(chunked, upto) for upto in range(7, len(prompt), 7)]
    assert firsts == [None] * len(firsts) and not chunked.prefill_done
    chunked_tokens = [runner.prefill(chunked)] + [runner.decode([chunked])[0] for _ in range(5)]
    assert chunked_tokens == whole_tokens
    torch.testing.assert_close(torch.stack(seen[102]), torch.stack(seen[101]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "transformers"])
def test_fused_steps_equal_each_request_alone(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """Decode rows and prompt chunks in one pass: joins, split prompts, a reused prefix, a leave."""
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, eager_profile())
    assert runner.fused and (runner.fast_paths.direct_problem is None)
    if not direct:  # what a model the direct step does not take runs
        monkeypatch.setattr(runner.batch, "direct", None)
    passes = count_forward_passes(runner, monkeypatch)
    tokenizer = ChatTokenizer(tiny_model)
    prompts = [tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "word " * (4 * k + 1)}])
               for k in range(5)]
    requests = [Request(f"f{k}", p, greedy(100 + k)) for k, p in enumerate(prompts)]
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    runner.reuse_prefix(requests[0])
    tokens["f0"].append(runner.first_token(requests[0]))
    running = [requests[0]]
    for joining in requests[1:]:
        runner.reuse_prefix(joining)  # the shared system prompt is cached after the first
        stops = [*range(joining.prefilled + 9, len(joining.prompt_ids), 9), len(joining.prompt_ids)]
        for stop in stops:  # each chunk shares a pass with a decode step of everyone running
            passes.clear()
            step = runner.step(running, [(joining, stop)])
            decoded, firsts = step.tokens, step.firsts
            assert len(passes) == 1
            for request, token in zip(running, decoded, strict=True):
                tokens[request.request_id].append(token)
            if firsts[0] is not None:
                tokens[joining.request_id].append(firsts[0])
        running.append(joining)
        if joining.request_id == "f2":
            runner.release("f1")
            running = [r for r in running if r.request_id != "f1"]
    assert runner.prefix_cache.hits >= 4
    for _ in range(3):
        for request, token in zip(running, runner.step(running, []).tokens, strict=True):
            tokens[request.request_id].append(token)
    batched = {k: list(v) for k, v in seen.items()}
    for request in running:
        runner.release(request.request_id)
    seen.clear()
    alone_runner = ModelRunner(tiny_model, replace(eager_profile(), prefix_cache_tokens=0))
    assert_each_alone_gives(alone_runner, prompts, tokens, "f", batched, seen)


def count_forward_passes(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets one entry per forward pass of the runner's model, through transformers'
    forward or through the direct decode step."""
    passes: list[int] = []
    decoder = getattr(runner.batch, "direct", None)
    for owner in (runner.model, decoder) if decoder is not None else (runner.model,):
        real_forward = owner.forward

        def counting_forward(*args: object, real: Any = real_forward, **kwargs: object) -> object:
            passes.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, "forward", counting_forward)
    return passes


def test_abort_mid_prefill_frees_the_cache(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, eager_profile())
    prompt = ChatTokenizer(tiny_model).encode_chat([{"role": "user", "content": "word " * 30}])
    request = Request("r", prompt, greedy(5))
    assert runner.prefill(request, 10) is None and runner.active_sequences == 1
    runner.release("r")
    assert runner.active_sequences == 0


SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 12}


def test_prefix_reuse_gives_the_same_logits_as_a_full_prefill(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, eager_profile())
    tokenizer = ChatTokenizer(tiny_model)
    first = tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "first question"}])
    second = tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "another one entirely"}])
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared > 40

    def run(request: Request) -> list[int]:
        runner.reuse_prefix(request)
        tokens = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(5)]
        runner.release(request.request_id)
        return tokens

    run(Request("warm", first, greedy(100)))
    reused = Request("reused", second, greedy(101))
    assert runner.reuse_prefix(reused) is not None and reused.prefilled == shared
    assert runner.prefix_cache.hits == 1 and runner.prefix_cache.reused_tokens == shared
    with_reuse = run(reused)
    runner.prefix_cache = type(runner.prefix_cache)(max_tokens=0, min_match=16)
    fresh = Request("fresh", second, greedy(102))
    without = run(fresh)
    assert fresh.prefilled == len(second) and with_reuse == without
    torch.testing.assert_close(torch.stack(seen[101]), torch.stack(seen[102]), rtol=1e-4, atol=1e-4)


def test_an_identical_prompt_still_computes_its_last_token(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, eager_profile())
    prompt = ChatTokenizer(tiny_model).encode_chat([SYSTEM, {"role": "user", "content": "again"}])
    first = runner.first_token(Request("a", prompt, greedy(3)))
    again = Request("b", prompt, greedy(3))
    runner.reuse_prefix(again)
    assert again.prefilled == len(prompt) - 1
    assert runner.first_token(again) == first


def test_prefix_cache_is_bounded_and_evicts_the_oldest(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, eager_profile())
    tokenizer = ChatTokenizer(tiny_model)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": f"{k} " + "word " * 30}]) for k in range(3)]
    runner.prefix_cache = type(runner.prefix_cache)(max_tokens=2 * len(prompts[0]) + 1, min_match=8)
    for k, prompt in enumerate(prompts):
        runner.first_token(Request(f"p{k}", prompt, greedy(3)))
    probe = Request("probe", prompts[0] + [5], greedy(3))
    runner.reuse_prefix(probe)
    assert probe.prefilled < len(prompts[0])  # the first prompt was evicted: only a short match
    probe = Request("probe2", prompts[2] + [5], greedy(3))
    runner.reuse_prefix(probe)
    assert probe.prefilled == len(prompts[2])


def test_an_end_of_sequence_token_finishes_with_stop_and_adds_no_text(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo model never emits EOS, so the runner is made to, on its third step."""

    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        runner = worker.runner
        assert runner is not None
        eos = min(worker.eos_token_ids)
        real_step = runner.step
        calls = {"n": 0}

        def ends_soon(decode: list[Request], chunks: list[tuple[Request, int]]) -> StepResult:
            result = real_step(decode, chunks)
            calls["n"] += len(result.tokens)
            if calls["n"] == 3:
                result.tokens = [eos] * len(result.tokens)
            return result

        monkeypatch.setattr(runner, "step", ends_soon)
        prompt = await engine.encode_chat(PROMPT)
        with engine.submit(prompt, greedy(50)) as stream:
            events = [event async for event in stream]
        assert events[-1].finish_reason is not None and events[-1].finish_reason.value == "stop"
        assert events[-1].completion_tokens == 4 and events[-1].text == ""
        assert "".join(e.text for e in events) == "Hello! I"  # three tokens, then EOS
        assert engine.stats().running == 0

    run_with_engine(tiny_model, body)


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_a_finished_exchange_is_reused_by_the_next_turn(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, kv_cache: str
) -> None:
    seen = record_logits(monkeypatch)
    runner = ModelRunner(tiny_model, replace(eager_profile(), kv_cache=kv_cache, max_running=2))
    prompt = ChatTokenizer(tiny_model).encode_chat([{"role": "user", "content": "start a chat"}])
    other = Request("other", ChatTokenizer(tiny_model).encode_chat(PROMPT), greedy(50))
    runner.first_token(other)  # a longer batch neighbour, so the finished row sits behind padding
    turn = Request("turn", prompt, greedy(10))
    turn.output_ids.append(runner.first_token(turn))
    for _ in range(9):
        turn.output_ids.append(runner.decode([other, turn])[1])
    runner.retire(turn)
    follow_up = prompt + turn.output_ids + [7, 8, 9]
    reused = Request("next", follow_up, greedy(201))
    runner.reuse_prefix(reused)
    assert reused.prefilled == len(prompt) + 9  # all but the last reply token, never fed back
    runner.first_token(reused)
    ModelRunner(tiny_model, eager_profile()).first_token(Request("fresh", follow_up, greedy(202)))
    torch.testing.assert_close(seen[201][0], seen[202][0], rtol=1e-4, atol=1e-4)
