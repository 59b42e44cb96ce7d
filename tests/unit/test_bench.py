"""`llmd bench`'s pure parts: statistics, the SSE parser, results, prompts, notes.

Whole runs against a fake OpenAI server on loopback are in tests/e2e/test_bench_http.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from llmd.bench.http import HttpSession, client_cpu_note, measure_once, record_event, record_events
from llmd.bench.prompts import CALIBRATION_PROBES, PromptFactory, calibrate_words, filler_text, fit_prompt_ids
from llmd.bench.results import StreamResult, median_output_rates, run_notes, summarize
from llmd.bench.sse import SSEEvent, SSEParser
from llmd.bench.stats import chunks_per_token, decode_tokens_per_s, gaps, percentile, tokens_per_s

Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]
Capture = pytest.CaptureFixture[str]

# ---------------------------------------------------------------------- statistics


def test_percentile_interpolates_between_ranks() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 25) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_percentile_of_nothing_and_one_value() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0


def test_gaps_are_successive_differences() -> None:
    assert gaps([1.0, 1.5, 1.75, 3.0]) == [0.5, 0.25, 1.25]
    assert gaps([2.0]) == []
    assert gaps([]) == []


def test_chunks_per_token_and_rates() -> None:
    assert chunks_per_token(4, 8) == 0.5
    assert chunks_per_token(3, 0) is None
    assert tokens_per_s(100, 2.0) == 50.0
    assert tokens_per_s(100, 0.0) is None
    # 5 tokens over 4 gaps of 0.25 s: 4 tokens after the first in 1 s.
    assert decode_tokens_per_s([0.0, 0.25, 0.5, 0.75, 1.0], 5) == 4.0
    assert decode_tokens_per_s([0.0, 1.0], 9) == 8.0  # usage says 9 tokens in 2 chunks
    assert decode_tokens_per_s([1.0], 1) is None
    assert decode_tokens_per_s([1.0, 1.0], 2) is None


def _stream(
    sent: float, times: list[float], tokens: int | None, error: str | None = None
) -> StreamResult:
    return StreamResult(
        sent=sent,
        chunk_times=times,
        completion_tokens=tokens,
        finished=times[-1] if times else sent,
        done=error is None,
        error=error,
    )


def test_summarize_known_streams() -> None:
    results = [
        _stream(0.0, [0.1, 0.2, 0.3, 0.4], 8),  # ttft 100 ms, gaps 100 ms, 2 tokens a chunk
        _stream(0.0, [0.3, 0.5, 0.7, 1.0], 4),  # ttft 300 ms, gaps 200, 200, 300 ms
        _stream(0.5, [], None, error="HTTP 503: busy"),
    ]
    run = summarize("http", 1, results)
    assert (run.requests, run.ok, run.errors) == (3, 2, 1)
    assert run.error_messages == ["HTTP 503: busy"]
    assert run.completion_tokens == 12
    assert run.usage_source == "reported"
    assert run.chunks_per_token == pytest.approx(8 / 12, abs=1e-4)
    assert run.ttft_ms_p50 == pytest.approx(200.0)
    assert run.gap_ms_p50 == pytest.approx(150.0)  # pooled: 100,100,100 | 200,200,300
    assert run.gap_ms_max == pytest.approx(300.0)
    assert run.gap_ms_p99 is not None and 200 < run.gap_ms_p99 <= 300
    assert run.wall_s == pytest.approx(1.0)
    assert run.output_tokens_per_s == pytest.approx(12.0)
    # per stream: 7 tokens / 0.3 s and 3 tokens / 0.7 s
    assert run.stream_decode_tokens_per_s_median == pytest.approx((7 / 0.3 + 3 / 0.7) / 2, abs=1e-3)


def test_summarize_counts_chunks_without_usage() -> None:
    run = summarize("http", 1, [_stream(0.0, [0.1, 0.2, 0.3], None)])
    assert run.usage_source == "counted"
    assert run.completion_tokens == 3
    assert run.chunks_per_token is None
    notes = run_notes([run], max_tokens=3)
    assert any("no usage" in note for note in notes)


def test_summarize_all_failed() -> None:
    run = summarize("http", 2, [_stream(0.0, [], None, error=f"e{i}") for i in range(7)])
    assert (run.ok, run.errors, run.usage_source) == (0, 7, "none")
    assert run.error_messages == ["e0", "e1", "e2", "e3", "e4"]
    assert run.ttft_ms_p50 is None and run.output_tokens_per_s is None


def test_median_over_repeats_per_label() -> None:
    runs = [
        summarize("http", k, [_stream(0.0, [0.5, 1.0], tokens)])
        for k, tokens in enumerate([10, 30, 20], start=1)
    ]
    assert median_output_rates(runs) == {"http": 20.0}


# ---------------------------------------------------------------------------- SSE

SSE_SAMPLE = (
    b": ping\r\n\r\n"
    b"data: {\"a\": \"h\xc3\xa9llo \xe2\x9c\x93\"}\r\n\r\n"
    b"event: error\ndata: line one\ndata:line two\n\n"
    b"id: 7\nretry: 10\ndata\n\n"
    b": comment only\n\n"
    b"data: x\rdata: y\r\r"
    b"data: [DONE]\n\n"
)
SSE_EXPECTED = [
    ("message", '{"a": "h\u00e9llo \u2713"}'),
    ("error", "line one\nline two"),
    ("message", ""),
    ("message", "x\ny"),
    ("message", "[DONE]"),
]


def _parse(pieces: list[bytes]) -> list[tuple[str, str]]:
    parser = SSEParser()
    return [(e.event, e.data) for piece in pieces for e in parser.feed(piece)]


def test_sse_whole_stream() -> None:
    assert _parse([SSE_SAMPLE]) == SSE_EXPECTED


def test_sse_split_at_every_byte_boundary() -> None:
    for cut in range(len(SSE_SAMPLE) + 1):
        assert _parse([SSE_SAMPLE[:cut], SSE_SAMPLE[cut:]]) == SSE_EXPECTED, cut


def test_sse_one_byte_at_a_time_and_random_reads() -> None:
    assert _parse([SSE_SAMPLE[i : i + 1] for i in range(len(SSE_SAMPLE))]) == SSE_EXPECTED
    rng = random.Random(1234)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(SSE_SAMPLE)), rng.randint(1, 12)))
        pieces = [SSE_SAMPLE[a:b] for a, b in zip([0, *cuts], [*cuts, len(SSE_SAMPLE)], strict=True)]
        assert _parse(pieces) == SSE_EXPECTED


def test_sse_event_waits_for_its_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: partial\n") == []
    assert [e.data for e in parser.feed(b"\n")] == ["partial"]
    assert parser.feed(b"data: never finished") == []


def test_sse_stamps_events_when_parsed() -> None:
    ticks = iter([10.0, 11.0])
    parser = SSEParser(clock=lambda: next(ticks))
    first = parser.feed(b"data: a\n\ndata: b")
    second = parser.feed(b"\n\n")
    assert [(e.data, e.time) for e in first + second] == [("a", 10.0), ("b", 11.0)]


def _event(data: str, when: float, event: str = "message") -> SSEEvent:
    return SSEEvent(data=data, event=event, time=when)


def test_record_events_builds_a_stream_result() -> None:
    result = StreamResult(sent=0.0)
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
    text = {"choices": [{"delta": {"content": "hi"}}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    timeline = [(role, 0.1), (text, 0.2), (text, 0.4), (usage, 0.5)]
    events = [_event(json.dumps(chunk), when) for chunk, when in timeline]
    record_events(result, [*events, _event("[DONE]", 0.6), _event(json.dumps(text), 0.7)])
    assert result.chunk_times == [0.2, 0.4]
    assert (result.completion_tokens, result.prompt_tokens) == (2, 5)
    assert result.done and result.error is None and result.finished == 0.6
    assert result.ttft == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("data", "event"),
    [('{"error": {"message": "boom"}}', "message"), ("{}", "error"), ("not json", "message")],
)
def test_record_event_errors(data: str, event: str) -> None:
    result = StreamResult(sent=0.0)
    assert record_event(result, _event(data, 1.0, event)) is True
    assert result.error is not None and not result.done


# ------------------------------------------------------------------------ prompts


def test_calibrate_words_lands_near_target() -> None:
    async def measure(words: int) -> int:
        return 17 + round(words * 1.3)

    for target in (20, 64, 100, 500):
        words, tokens, probes = asyncio.run(calibrate_words(target, measure))
        assert abs(tokens - target) <= 1 and tokens == 17 + round(words * 1.3)
        assert probes <= CALIBRATION_PROBES


def test_calibrate_words_target_below_template() -> None:
    async def measure(words: int) -> int:
        return 30 + words

    assert asyncio.run(calibrate_words(5, measure))[:2] == (1, 31)


def test_fit_prompt_ids_is_exact() -> None:
    def ids_for_words(words: int) -> list[int]:
        body = [t for w in range(words) for t in ([w, 1000 + w] if w % 3 == 2 else [w])]
        return [-1, -2, *body, -3, -4]  # template head and tail around two-token words

    for target in range(8, 40):
        ids, words = fit_prompt_ids(ids_for_words, target)
        assert len(ids) == target
        assert ids[:2] == [-1, -2] and ids[-2:] == [-3, -4]
        assert len(ids_for_words(words - 1)) < target <= len(ids_for_words(words))
    assert fit_prompt_ids(ids_for_words, 2) == ([-1, -2, 0, -3, -4], 1)


def test_prompt_factory_tags() -> None:
    distinct = PromptFactory(words=5)
    firsts = {distinct.next().split()[0] for _ in range(50)}
    assert len(firsts) == 50
    shared = PromptFactory(words=5, distinct=False)
    assert len({shared.next() for _ in range(5)}) == 1
    assert len(filler_text(40).split()) == 40


def test_client_cpu_note() -> None:
    runs = [summarize("http", k, [_stream(0.0, [0.1, 0.2], n)]) for k, n in ((1, 40), (2, 60))]
    assert client_cpu_note(0.05, runs) == (
        "client CPU while measuring: 0.05 s, 0.500 ms per completion token")
    assert client_cpu_note(0.0, []).endswith("- per completion token")


# ---------------------------------------------------------------------- the clients' plan


def test_staggered_clients_start_apart() -> None:
    """Client k's first request goes no sooner than k x --stagger-ms after the run starts (a sleep's
    lower bound: no race with a busy host)."""

    class Session:
        api = "chat"

        def __init__(self) -> None:
            self.sent: list[float] = []

        async def stream_chat(self, prompt: str, response_format: Any = None, api: str | None = None
                              ) -> StreamResult:
            self.sent.append(time.perf_counter())
            await asyncio.sleep(0)
            return StreamResult(sent=self.sent[-1])

    def starts(stagger_s: float) -> list[float]:
        session = Session()
        began = time.perf_counter()
        results = asyncio.run(measure_once(cast(HttpSession, session), PromptFactory(words=3, distinct=True),
                                           concurrency=4, requests=2, stagger_s=stagger_s))
        assert len(results) == 8
        return [sent - began for sent in sorted(session.sent)]

    staggered = starts(0.15)
    # the i-th request sent: only clients 0..i/2 may have started by then (two requests each)
    assert all(sent >= 0.15 * (index // 2) for index, sent in enumerate(staggered))
    assert staggered[-1] >= 0.45
