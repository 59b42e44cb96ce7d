"""Tests for `llmd bench`: statistics, the SSE parser, and whole runs against a fake server."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from llmd.bench import command
from llmd.bench.http import client_cpu_note, record_event, record_events
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


# -------------------------------------------------------------------- fake server


@dataclass
class FakeOpenAI:
    """A raw-ASGI OpenAI-shaped server; the requested model name picks its behaviour.

    fake-ok: max_tokens tokens, two per content chunk, plus a usage chunk.
    fake-nousage: the same, never reporting usage.
    fake-flaky: streamed request k is ok (k%4==0), HTTP 503, a data error, an error event.
    fake-stall: sends one chunk, then waits for the client to leave.
    """

    delay: float = 0.005
    overhead: int = 11
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    streamed: int = 0

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/models":
            models = {"object": "list", "data": [{"id": "fake-ok"}, {"id": "other"}]}
            await _send_json(send, 200, models)
            return
        body = json.loads(await _read_body(receive))
        self.bodies.append(body)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if not body.get("stream"):
            await self._complete(send, body)
        else:
            await self._stream(receive, send, body)

    async def _complete(self, send: Send, body: Message) -> None:
        reply: Message = {"object": "chat.completion", "choices": [{"message": {"content": "a"}}]}
        if body["model"] != "fake-nousage":
            reply["usage"] = {"prompt_tokens": self._prompt_tokens(body), "completion_tokens": 1}
        await _send_json(send, 200, reply)

    def _prompt_tokens(self, body: Message) -> int:
        return self.overhead + len(body["messages"][0]["content"].split())

    async def _stream(self, receive: Receive, send: Send, body: Message) -> None:
        model, index = body["model"], self.streamed
        self.streamed += 1
        if model == "fake-flaky" and index % 4 == 1:
            await _send_json(send, 503, {"error": {"message": "overloaded"}})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await self._events(send, self._script(body, index))
        if model == "fake-stall":
            while (await receive())["type"] != "http.disconnect":
                pass
        await send({"type": "http.response.body", "body": b""})

    def _script(self, body: Message, index: int) -> list[bytes]:
        tokens, model = body["max_tokens"], body["model"]
        role = _chunk({"role": "assistant", "content": ""})
        texts = [_chunk({"content": "ab"[: min(2, tokens - t)]}) for t in range(0, tokens, 2)]
        if model == "fake-stall":
            return [role, texts[0]]
        if model == "fake-flaky" and index % 4 == 2:
            return [role, texts[0], b'data: {"error": {"message": "decode failed"}}\n\n']
        if model == "fake-flaky" and index % 4 == 3:
            return [role, texts[0], b"event: error\ndata: {\"message\": \"oom\"}\n\n"]
        counts = {"prompt_tokens": self._prompt_tokens(body), "completion_tokens": tokens}
        usage = {"object": "chat.completion.chunk", "choices": [], "usage": counts}
        tail = [] if model == "fake-nousage" else [b"data: " + json.dumps(usage).encode() + b"\n\n"]
        if model == "fake-nodone":
            finish = {"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {}, "finish_reason": "length"}]}
            return [role, *texts, b"data: " + json.dumps(finish).encode() + b"\n\n", *tail]
        if model == "fake-truncated":
            return [role, *texts]
        return [b": ping\n\n", role, *texts, *tail, b"data: [DONE]\n\n"]

    async def _events(self, send: Send, events: list[bytes]) -> None:
        for event in events:
            # Halves in separate writes: the client must reassemble events across reads.
            middle = len(event) // 2
            for piece in (event[:middle], event[middle:]):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(self.delay)


def _chunk(delta: dict[str, str]) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _read_body(receive: Receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def _send_json(send: Send, status: int, payload: Any) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


@dataclass
class Served:
    base_url: str
    app: FakeOpenAI


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    app = FakeOpenAI()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", ws="none", http="h11", loop="asyncio",
                            log_level="critical", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "fake server did not start"
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def fake(served: Served) -> Served:
    served.app.bodies.clear()
    served.app.headers.clear()
    served.app.streamed = 0
    return served


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def _bench_json(capsys: Capture, *argv: str) -> tuple[int, dict[str, Any]]:
    code = command.run(_args(*argv, "--json", "--timeout", "30"))
    return code, json.loads(capsys.readouterr().out)


def _streamed(app: FakeOpenAI) -> list[dict[str, Any]]:
    return [body for body in app.bodies if body.get("stream")]


# ---------------------------------------------------------------------- end to end


def test_bench_measures_what_the_server_did(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(
        capsys, "--base-url", fake.base_url, "--model", "fake-ok", "-c", "2", "-n", "3",
        "--max-tokens", "8", "--prompt-tokens", "40",
    )
    assert code == 0
    assert abs(report["prompt_tokens"] - 40) <= 2
    (run,) = report["runs"]
    assert (run["requests"], run["ok"], run["errors"]) == (6, 6, 0)
    assert run["completion_tokens"] == 48
    assert run["usage_source"] == "reported"
    assert run["chunks_per_token"] == 0.5  # the server sent two tokens per chunk
    assert run["prompt_tokens"] == report["prompt_tokens"]
    assert 0 < run["ttft_ms_p50"] <= run["ttft_ms_p99"] < 30_000
    assert 0 <= run["gap_ms_p50"] <= run["gap_ms_p99"] <= run["gap_ms_max"] < 30_000
    assert run["output_tokens_per_s"] > 0 and run["wall_s"] > 0
    assert report["median_output_tokens_per_s"] == {"http": run["output_tokens_per_s"]}
    assert report["notes"] and "calibrated" in report["notes"][0]
    (cpu,) = [note for note in report["notes"] if note.startswith("client CPU")]
    assert float(cpu.split(", ")[1].split()[0]) > 0  # ms per completion token


def test_client_cpu_note() -> None:
    runs = [summarize("http", k, [_stream(0.0, [0.1, 0.2], n)]) for k, n in ((1, 40), (2, 60))]
    assert client_cpu_note(0.05, runs) == (
        "client CPU while measuring: 0.05 s, 0.500 ms per completion token")
    assert client_cpu_note(0.0, []).endswith("- per completion token")


def test_bench_sends_the_requests_it_promises(fake: Served, capsys: Capture) -> None:
    _bench_json(
        capsys, "--base-url", fake.base_url, "-n", "4", "--warmup", "2", "--max-tokens", "6",
        "--temperature", "0.5", "--api-key", "sekrit",
    )
    streamed = _streamed(fake.app)
    assert len(streamed) == 6  # 2 warmup + 4 measured
    assert {body["model"] for body in fake.app.bodies} == {"fake-ok"}  # from GET /models
    assert all(body["stream_options"] == {"include_usage": True} for body in streamed)
    assert all(body["max_tokens"] == 6 and body["temperature"] == 0.5 for body in streamed)
    assert all("ignore_eos" not in body for body in fake.app.bodies)
    first_words = [body["messages"][0]["content"].split()[0] for body in fake.app.bodies]
    assert len(set(first_words)) == len(first_words)
    assert all(h["authorization"] == "Bearer sekrit" for h in fake.app.headers)


def test_shared_prompt_and_ignore_eos(fake: Served, capsys: Capture) -> None:
    code, _ = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-ok", "-n", "3",
                          "--max-tokens", "4", "--shared-prompt", "--ignore-eos")
    assert code == 0
    prompts = {body["messages"][0]["content"] for body in _streamed(fake.app)}
    assert len(prompts) == 1
    assert all(body["ignore_eos"] is True for body in fake.app.bodies)
    assert all("authorization" not in h for h in fake.app.headers)


def test_errors_are_counted_not_raised(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(
        capsys, "--base-url", fake.base_url, "--model", "fake-flaky", "-c", "2", "-n", "4",
        "--warmup", "0", "--max-tokens", "6",
    )
    assert code == 1
    (run,) = report["runs"]
    assert (run["requests"], run["ok"], run["errors"]) == (8, 2, 6)
    assert run["completion_tokens"] == 12
    messages = " | ".join(run["error_messages"])
    assert "HTTP 503" in messages and "overloaded" in messages
    assert "decode failed" in messages and "error event" in messages


def test_missing_usage_falls_back_to_counting(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-nousage",
                               "-n", "2", "--max-tokens", "8", "--prompt-tokens", "30")
    assert code == 0
    (run,) = report["runs"]
    assert run["usage_source"] == "counted"
    assert run["completion_tokens"] == 8  # 4 chunks per stream, counted
    assert run["chunks_per_token"] is None
    assert report["prompt_tokens"] is None
    assert any("not calibrated" in note for note in report["notes"])
    assert any("no usage" in note for note in report["notes"])


def test_finished_stream_without_done_is_noted_not_failed(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-nodone",
                               "-n", "2", "--max-tokens", "8", "--prompt-tokens", "30")
    (run,) = report["runs"]
    assert code == 0 and run["ok"] == 2 and run["missing_done"] == 2
    assert any("without `data: [DONE]`" in note for note in report["notes"])


def test_stream_cut_before_its_finish_is_an_error(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-truncated",
                               "-n", "2", "--max-tokens", "8", "--prompt-tokens", "30")
    (run,) = report["runs"]
    assert code == 1 and run["errors"] == 2 and "before data: [DONE]" in run["error_messages"][0]


def test_timeout_is_an_error(fake: Served, capsys: Capture) -> None:
    code = command.run(_args("--base-url", fake.base_url, "--model", "fake-stall", "-n", "1",
                           "--warmup", "0", "--max-tokens", "4", "--timeout", "0.5", "--json"))
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert code == 1
    assert run["errors"] == 1 and "timed out" in run["error_messages"][0]


def test_repeats_and_table(fake: Served, capsys: Capture) -> None:
    code = command.run(_args("--base-url", fake.base_url, "--model", "fake-ok", "-c", "2", "-n", "1",
                           "--max-tokens", "4", "--repeats", "3"))
    table = capsys.readouterr().out
    assert code == 0
    for text in ("TTFT p50", "gap max", "chunk/tok", "http #1", "http #3", "median out tok/s"):
        assert text in table
    rows = [line for line in table.splitlines() if line.startswith("http #")]
    assert len(rows) == 3 and all(row.split()[3] == "0" for row in rows)  # err column


def test_unreachable_server(capsys: Capture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    assert command.run(_args("--base-url", base_url)) == 1
    assert "pass --model" in capsys.readouterr().err
    code, report = _bench_json(capsys, "--base-url", base_url, "--model", "m", "-n", "2")
    assert code == 1
    (run,) = report["runs"]
    assert run["errors"] == 2 and "ConnectionRefusedError" in run["error_messages"][0]
