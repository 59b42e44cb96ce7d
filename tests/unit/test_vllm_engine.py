"""The vLLM engine against a typed fake `AsyncLLM`: one event per token however vLLM groups them,
finish reasons, aborts (a stop string, a client gone), error mapping, the tokenizer check,
admission, drain and shutdown, `n` choices, health. No vLLM, no torch, no clock: every wait is on
an event the engine or the fake sets (with a generous guard only against a hang)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from llmd.engine.stream import GenerationStream
from llmd.engine.types import FinishReason, GrammarRequest, SamplingParams, TokenEvent
from llmd.engine.vllm.counters import SchedulerFeed
from llmd.engine.vllm.engine import VllmEngine
from llmd.errors import (
    ConfigError,
    ContextLengthExceeded,
    EngineFailure,
    InvalidRequest,
    Overloaded,
    ShuttingDown,
)
from tests.helpers.fake_vllm import (
    EOS,
    FakeAsyncLLM,
    FakeCompletion,
    FakeDeadError,
    FakeLogprob,
    FakeOutput,
    FakeVllmTokenizer,
    Preemption,
    fake_engine,
    ids,
    output,
    vllm_profile,
)

T = TypeVar("T")
CHAT = [{"role": "user", "content": "hi"}]
PROMPT = ids("hi")
HANG_GUARD = 30.0  # seconds: only a hung test ever waits this long


def run(body: Callable[[VllmEngine, FakeAsyncLLM], Awaitable[T]], llm: FakeAsyncLLM,
        max_running: int = 4, max_queue: int = 4) -> T:
    """`body` on a started engine over `llm` (ready, or failed at start), shut down after."""
    async def main() -> T:
        engine = fake_engine(llm, vllm_profile(max_running, max_queue))
        await engine.start()
        await started(engine)
        try:
            return await body(engine, llm)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


async def started(engine: VllmEngine) -> None:
    """Until the engine is ready or has failed."""
    assert engine.failed is not None
    ready: asyncio.Future[object] = asyncio.ensure_future(engine.ready.wait())
    failed: asyncio.Future[object] = asyncio.ensure_future(asyncio.shield(engine.failed))
    await asyncio.wait([ready, failed], return_when=asyncio.FIRST_COMPLETED)
    ready.cancel()
    failed.cancel()


async def read(stream: GenerationStream) -> list[TokenEvent]:
    """Every event of a stream, closing it after."""
    async def events() -> list[TokenEvent]:
        return [event async for event in stream]

    with stream:
        return await asyncio.wait_for(events(), HANG_GUARD)


async def next_abort(llm: FakeAsyncLLM) -> str:
    """The next request id aborted in the fake vLLM."""
    return await asyncio.wait_for(llm.aborts.get(), HANG_GUARD)


def test_several_ids_in_one_delta_still_make_one_event_per_token() -> None:
    llm = FakeAsyncLLM([[output("hel", cached=16), output("lo"), output("", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[TokenEvent]:
        prompt = await engine.encode_chat(CHAT)
        return await read(engine.submit(prompt, SamplingParams(max_tokens=16)))

    events = run(body, llm)
    assert [e.text for e in events] == ["h", "e", "l", "l", "o", ""]
    assert [e.completion_tokens for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[0].cached_tokens == 16 and events[-1].finish_reason is FinishReason.STOP
    (prompt, kwargs, _), = llm.requests
    assert prompt == {"prompt_token_ids": PROMPT}
    assert kwargs["max_tokens"] == 16 and kwargs["detokenize"] is False and kwargs["n"] == 1
    assert llm.aborted == [] and llm.closed_early == []


def test_the_budget_ends_with_length_and_vllm_ends_nothing_early() -> None:
    llm = FakeAsyncLLM([[output("ab"), output("cd", "length")]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[TokenEvent]:
        return await read(engine.submit(PROMPT, SamplingParams(max_tokens=4)))

    events = run(body, llm)
    assert "".join(e.text for e in events) == "abcd" and events[-1].finish_reason is FinishReason.LENGTH
    assert len(events) == 4 and llm.aborted == []


def test_a_stop_string_ends_the_reply_and_aborts_vllms_request() -> None:
    llm = FakeAsyncLLM([[output("abcx"), output("yz")]])  # vLLM would go on

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[list[TokenEvent], str, str]:
        stream = engine.submit(PROMPT, SamplingParams(max_tokens=16, stop=("cx",)))
        return await read(stream), stream.request_id, await next_abort(llm)

    events, request_id, aborted = run(body, llm)
    assert "".join(e.text for e in events) == "ab" and events[-1].finish_reason is FinishReason.STOP
    assert aborted == request_id and llm.closed_early == [request_id]


def test_a_stop_string_that_is_a_special_token_reaches_vllm_as_a_stop_id() -> None:
    llm = FakeAsyncLLM([[output("a", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[TokenEvent]:
        params = SamplingParams(max_tokens=4, stop=("<eos>",), ignore_eos=True)
        return await read(engine.submit(PROMPT, params))

    events = run(body, llm)
    assert events[-1].finish_reason is FinishReason.STOP and llm.requests[0][1]["stop_token_ids"] == [EOS]


def test_a_client_that_leaves_mid_reply_aborts_the_request_and_frees_its_place() -> None:
    llm = FakeAsyncLLM([[output("ab")]])  # then generating on

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[str, str, str]:
        stream = engine.submit(PROMPT, SamplingParams(max_tokens=16))
        with stream:
            first = await anext(stream)
        left = engine.stats()
        assert (left.running, left.waiting, left.aborted) == (0, 0, 1)  # at once, before vLLM hears of it
        return first.text, stream.request_id, await next_abort(llm)

    first, request_id, aborted = run(body, llm)
    assert first == "a" and aborted == request_id and llm.closed_early == [request_id]


def test_a_client_gone_before_vllm_answered_aborts_too() -> None:
    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[str, str, int, int]:
        stream = engine.submit(PROMPT, SamplingParams(max_tokens=16))
        stream.close()
        stats = engine.stats()
        return stream.request_id, await next_abort(llm), stats.aborted, stats.running + stats.waiting

    request_id, aborted, counted, still_open = run(body, FakeAsyncLLM([[output("a")]]))
    assert aborted == request_id and counted == 1 and still_open == 0


def test_vllms_validation_error_is_the_requests_400() -> None:
    llm = FakeAsyncLLM([[ValueError("prompt_logprobs must be at most 20")]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[InvalidRequest, bool]:
        with pytest.raises(InvalidRequest) as caught:
            await read(engine.submit(PROMPT, SamplingParams(max_tokens=4)))
        return caught.value, engine.alive()

    error, alive = run(body, llm)
    assert error.status == 400 and "prompt_logprobs must be at most 20" in error.message and alive


def test_sampling_parameters_vllm_refuses_are_refused_at_submit() -> None:
    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> InvalidRequest:
        with pytest.raises(InvalidRequest) as caught:
            engine.submit(PROMPT, SamplingParams(max_tokens=4, top_p=1.5))
        assert engine.stats().waiting == 0 and await engine.drain(0.0) == 0  # nothing was opened
        return caught.value

    error = run(body, FakeAsyncLLM())
    assert error.status == 400 and "top_p must be in (0, 1]" in error.message


def test_logprobs_come_from_vllms_ranked_scores_with_llmds_token_text() -> None:
    b, c, e = ids("b")[0], ids("c")[0], ids("e")[0]
    first = FakeCompletion(ids("b"), logprobs=[{b: FakeLogprob(-0.5, 2), c: FakeLogprob(-0.2, 1),
                                               e: FakeLogprob(-3.0, 3)}])
    sampled_low = FakeCompletion(ids("e"), logprobs=[{e: FakeLogprob(-4.0, 9), b: FakeLogprob(-0.1, 1),
                                                     c: FakeLogprob(-2.5, 2)}])
    llm = FakeAsyncLLM([[FakeOutput([first]), FakeOutput([sampled_low]), output("", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[TokenEvent]:
        return await read(engine.submit(PROMPT, SamplingParams(max_tokens=8, logprobs=2)))

    events = run(body, llm)
    assert llm.requests[0][1]["logprobs"] == 2
    chosen = events[0].logprobs
    assert chosen is not None and (chosen.chosen.text, chosen.chosen.logprob) == ("b", -0.5)
    assert [(t.text, t.logprob) for t in chosen.top] == [("c", -0.2), ("b", -0.5)]  # by rank, 2 of them
    low = events[1].logprobs
    assert low is not None and low.chosen.logprob == -4.0  # sampled outside the top: not among them
    assert [t.text for t in low.top] == ["b", "c"]
    assert events[2].logprobs is None  # EOS ended the reply: its text is not output, nor scored


def test_unasked_logprobs_are_none() -> None:
    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[TokenEvent]:
        return await read(engine.submit(PROMPT, SamplingParams(max_tokens=8)))

    events = run(body, FakeAsyncLLM([[output("ab", "stop", eos=True)]]))
    assert all(event.logprobs is None and event.prompt_logprobs is None for event in events)


def test_the_prompts_logprobs_come_on_the_first_event_however_vllm_splits_them() -> None:
    h, i, a = ids("hia")  # PROMPT is "hi"; vLLM scores "i" after "h" (the first token: nothing does)
    prefill = FakeOutput([FakeCompletion([])], prompt_logprobs=[None])  # a first chunk: no token yet
    first = FakeOutput([FakeCompletion(ids("b"))],
                       prompt_logprobs=[{i: FakeLogprob(-1.5, 2), a: FakeLogprob(-0.3, 1)}])
    llm = FakeAsyncLLM([[prefill, first, output("", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[TokenEvent]:
        return await read(engine.submit(PROMPT, SamplingParams(max_tokens=8, prompt_logprobs=1)))

    events = run(body, llm)
    assert llm.requests[0][1]["prompt_logprobs"] == 1
    prompt = events[0].prompt_logprobs
    assert prompt is not None and [(p.chosen.token_id, p.chosen.text, p.chosen.logprob) for p in prompt] == [
        (h, "h", None), (i, "i", -1.5)]
    assert prompt[0].top == () and [(t.text, t.logprob) for t in prompt[1].top] == [("a", -0.3)]
    assert all(event.prompt_logprobs is None for event in events[1:])


def test_another_failure_of_one_request_is_a_500_and_the_engine_serves_on() -> None:
    llm = FakeAsyncLLM([[output("a"), RuntimeError("a detokenizer hiccup")], [output("b", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[EngineFailure, list[TokenEvent]]:
        with pytest.raises(EngineFailure) as caught:
            await read(engine.submit(PROMPT, SamplingParams(max_tokens=4)))
        return caught.value, await read(engine.submit(PROMPT, SamplingParams(max_tokens=4)))

    error, after = run(body, llm)
    assert error.status == 500 and after[-1].finish_reason is FinishReason.STOP


def test_a_dead_engine_fails_the_daemon_and_ends_every_request_with_a_503() -> None:
    llm = FakeAsyncLLM([[output("a")], [FakeDeadError("EngineCore encountered an issue")]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[BaseException]:
        running = engine.submit(PROMPT, SamplingParams(max_tokens=16))
        assert (await anext(running)).text == "a"
        errors: list[BaseException] = []
        for stream in (engine.submit(PROMPT, SamplingParams(max_tokens=16)), running):
            with pytest.raises(ShuttingDown) as caught, stream:
                await anext(stream)
            errors.append(caught.value)
        assert engine.failed is not None and isinstance(engine.failed.result(), FakeDeadError)
        assert not engine.alive()
        with pytest.raises(ShuttingDown):
            engine.submit(PROMPT, SamplingParams(max_tokens=4))
        return errors

    errors = run(body, llm)
    assert all(isinstance(e, ShuttingDown) and e.status == 503 for e in errors)
    assert llm.aborted == []  # a dead engine is not asked to abort


def test_a_failed_health_probe_fails_the_engine() -> None:
    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[bool, bool, bool]:
        healthy = await engine.check_health()
        llm.dead = True
        return healthy, await engine.check_health(), engine.alive()

    assert run(body, FakeAsyncLLM()) == (True, False, False)


def test_a_health_probe_in_progress_shows_on_the_heartbeat_the_watchdog_reads() -> None:
    llm = FakeAsyncLLM(health_gate=asyncio.Event())

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[bool, bool, bool]:
        await asyncio.wait_for(llm.probing.wait(), HANG_GUARD)  # the engine's own probe, held by vLLM
        busy = engine.heartbeat.busy_since is not None
        assert llm.health_gate is not None
        llm.health_gate.set()
        return busy, await engine.check_health(), engine.heartbeat.busy_since is None

    assert run(body, llm) == (True, True, True)


def test_the_engine_refuses_to_start_when_vllms_tokenizer_differs() -> None:
    llm = FakeAsyncLLM(tokenizer=FakeVllmTokenizer(size=33, eos_token_id=2, all_special_ids=[1, 2]))

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[BaseException, bool]:
        assert engine.failed is not None
        return engine.failed.result(), engine.ready.is_set()

    error, ready = run(body, llm)
    assert isinstance(error, ConfigError) and not ready and llm.shutdowns == 1
    assert "vocabulary size 32 in llmd, 33 in vLLM" in error.message
    assert "EOS ids 1 in llmd, 2 in vLLM" in error.message
    assert "special token ids 1 in llmd, [1, 2] in vLLM" in error.message


def test_requests_wait_for_the_engine_then_are_bounded_by_the_profile() -> None:
    loading = fake_engine(FakeAsyncLLM())
    with pytest.raises(Overloaded) as caught:
        loading.submit(PROMPT, SamplingParams(max_tokens=4))
    assert caught.value.code == "not_ready"

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> Overloaded:
        held = [engine.submit(PROMPT, SamplingParams(max_tokens=4)) for _ in range(2)]
        with pytest.raises(Overloaded) as full:
            engine.submit(PROMPT, SamplingParams(max_tokens=4))
        for stream in held:
            stream.close()
        return full.value

    full = run(body, FakeAsyncLLM(), max_running=1, max_queue=1)
    assert full.code == "queue_full" and full.status == 503 and "Retry-After" in full.headers()


def test_a_drain_lets_requests_finish_then_refuses_new_ones() -> None:
    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[int, list[TokenEvent]]:
        reader = asyncio.ensure_future(read(engine.submit(PROMPT, SamplingParams(max_tokens=4))))
        cut = await engine.drain(HANG_GUARD)
        with pytest.raises(ShuttingDown):
            engine.submit(PROMPT, SamplingParams(max_tokens=4))
        return cut, await reader

    cut, events = run(body, FakeAsyncLLM([[output("ab", "stop", eos=True)]]))
    assert cut == 0 and events[-1].finish_reason is FinishReason.STOP


def test_a_drain_past_its_timeout_cuts_open_requests_and_aborts_them_then_shutdown_stops_vllm() -> None:
    llm = FakeAsyncLLM([[output("a")]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[int, str, str]:
        stream = engine.submit(PROMPT, SamplingParams(max_tokens=16))
        reader = asyncio.ensure_future(read(stream))
        cut = await engine.drain(0.0)
        with pytest.raises(ShuttingDown):
            await reader
        return cut, stream.request_id, await next_abort(llm)

    cut, request_id, aborted = run(body, llm)
    assert cut == 1 and aborted == request_id and llm.shutdowns == 1


def test_n_choices_are_n_vllm_requests_seeded_in_turn() -> None:
    llm = FakeAsyncLLM([[output(text, "stop", eos=True)] for text in ("a", "b", "c")])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> list[str]:
        streams = engine.submit_choices(PROMPT, SamplingParams(max_tokens=4, seed=7), 3)
        with pytest.raises(InvalidRequest) as caught:
            engine.submit_choices(PROMPT, SamplingParams(max_tokens=4), 5)
        assert caught.value.param == "n"
        return ["".join(e.text for e in await read(stream)) for stream in streams]

    assert run(body, llm) == ["a", "b", "c"]
    assert [kwargs["seed"] for _, kwargs, _ in llm.requests] == [7, 8, 9]
    assert len({request_id for _, _, request_id in llm.requests}) == 3


def test_the_context_is_the_one_vllm_serves_and_ids_are_checked_against_its_vocabulary() -> None:
    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> int:
        with pytest.raises(ContextLengthExceeded):
            engine.check_context(40, 16)
        with pytest.raises(InvalidRequest) as caught:
            engine.submit(PROMPT, SamplingParams(max_tokens=4, logit_bias=((40, 1.0),)))
        assert caught.value.param == "logit_bias"
        return engine.max_context

    assert run(body, FakeAsyncLLM()) == 48  # the fake vLLM's max_model_len, not the 64 planned


def test_a_constrained_request_reaches_vllm_as_a_lark_grammar() -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> str:
        constraint = await engine.constrain(GrammarRequest(schema, "response_format"))
        await read(engine.submit(PROMPT, SamplingParams(max_tokens=4, constraint=constraint)))
        return str(llm.requests[0][1]["structured_outputs"]["grammar"])

    grammar = run(body, FakeAsyncLLM([[output("a", "stop", eos=True)]]))
    assert grammar.startswith('start: %json {"type": "object"') and '"x-guidance"' in grammar


def test_stats_count_what_llmd_saw() -> None:
    llm = FakeAsyncLLM([[output("a", cached=8)], [output("ab", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[int, int, int, int, int]:
        producing = engine.submit(PROMPT, SamplingParams(max_tokens=16))
        assert (await anext(producing)).text == "a"
        queued = engine.submit(PROMPT, SamplingParams(max_tokens=16))  # closed before vLLM sees it
        during = engine.stats()
        producing.close()
        queued.close()
        await read(engine.submit(PROMPT, SamplingParams(max_tokens=16)))
        after = engine.stats()
        return during.running, during.waiting, after.aborted, after.finished, after.prefix_tokens_reused

    assert run(body, llm) == (1, 1, 2, 1, 8)


def test_steps_come_from_vllms_scheduler_reports() -> None:
    llm = FakeAsyncLLM([[output("a"), output("b"), output("", "stop", eos=True)]])

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> int:
        before = engine.stats().steps
        await read(engine.submit(PROMPT, SamplingParams(max_tokens=16)))
        return engine.stats().steps - before

    assert run(body, llm) == 3  # one report a step, as vLLM's stat loggers get them


def test_the_feed_counts_every_cores_steps_and_averages_their_kv_cache_use() -> None:
    feed = SchedulerFeed()
    assert feed.kv_cache_usage is None  # no report yet: no figure, not a zero
    feed.record(engine=0, kv_cache_usage=0.5)  # data parallel: two engine cores report in turn
    feed.record(engine=1, kv_cache_usage=0.25)
    feed.record(engine=0, kv_cache_usage=0.75)  # a core's latest report replaces its last
    feed.preempted(2)
    feed.preempted(0)
    assert (feed.steps, feed.kv_cache_usage, feed.preemptions) == (3, 0.5, 2)


def test_vllms_scheduler_reports_reach_the_engines_stats() -> None:
    llm = FakeAsyncLLM([[output("a"), Preemption(), output("", "stop", eos=True)]], kv_cache_usage=0.375)

    async def body(engine: VllmEngine, llm: FakeAsyncLLM) -> tuple[float | None, int]:
        await read(engine.submit(PROMPT, SamplingParams(max_tokens=16)))
        stats = engine.stats()
        return stats.kv_cache_usage, stats.preemptions

    assert run(body, llm) == (0.375, 1)


def test_a_stop_during_vllms_start_cuts_the_start_short() -> None:
    llm = FakeAsyncLLM(start_gate=threading.Event())  # vLLM still loading: only a stop ends it

    async def main() -> tuple[bool, bool, int, int]:
        engine = fake_engine(llm)
        await engine.start()
        await asyncio.wait_for(engine.shutdown(), HANG_GUARD)
        assert engine.failed is not None
        return engine.ready.is_set(), engine.failed.done(), llm.processes_told, llm.shutdowns

    # never ready, and a stop is not a failure (exit 0); vLLM's processes were told to stop
    assert asyncio.run(main()) == (False, False, 1, 0)


def test_a_start_that_outruns_the_stop_is_shut_down_not_served() -> None:
    llm = FakeAsyncLLM(start_gate=threading.Event(), stoppable=False)  # no process to stop yet

    async def main() -> tuple[bool, bool, int]:
        engine = fake_engine(llm)
        await engine.start()
        stopping = asyncio.ensure_future(engine.shutdown())

        async def looked_twice() -> None:  # the stop keeps looking for processes while the start runs
            while llm.processes_told < 2:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(looked_twice(), HANG_GUARD)
        assert llm.start_gate is not None
        llm.start_gate.set()  # the start completes after all
        await asyncio.wait_for(stopping, HANG_GUARD)
        assert engine.failed is not None
        return engine.ready.is_set(), engine.failed.done(), llm.shutdowns

    assert asyncio.run(main()) == (False, False, 1)  # what it started is shut down
