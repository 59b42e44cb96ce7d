"""`llmd bench` whole runs against a fake OpenAI server (real uvicorn on loopback, real client).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from llmd.bench import command
from tests.helpers.uvicorn_thread import served_on_loopback

Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]
Capture = pytest.CaptureFixture[str]

@dataclass
class FakeOpenAI:
    """A raw-ASGI OpenAI-shaped server; the requested model name picks its behaviour.

    fake-ok: max_tokens tokens, two per content chunk, plus a usage chunk.
    fake-nousage: the same, never reporting usage.
    fake-flaky: streamed request k is ok (k%4==0), HTTP 503, a data error, an error event.
    fake-stall: sends one chunk, then waits for the client to leave.
    Under a `response_format`, fake-ok streams `{"ok": true}` (fake-badjson `{"ok": `) instead.
    On /v1/completions (streamed): the first request for a file (no prefix shared with the
    previous prompt) streams to its end; fake-stall's later ones send one chunk, then wait
    for the client to leave. /stats counts streams in flight (plus `stuck_running`) and a
    prefix hit per prompt sharing 64+ characters with the previous one.
    """

    delay: float = 0.005
    overhead: int = 11
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    streamed: int = 0
    running: int = 0
    stuck_running: int = 0
    has_stats: bool = True
    stats_reads: int = 0
    disconnects: int = 0
    prefix_hits: int = 0
    prefix_tokens_reused: int = 0
    last_prompt: str = ""

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/stats":
            await self._stats(send)
            return
        if scope["path"] == "/v1/completions":
            await self._completions(receive, send, json.loads(await _read_body(receive)))
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
        if "response_format" in body:
            reply = '{"ok": ' if model == "fake-badjson" else '{"ok": true}'
            texts = [_chunk({"content": reply[start:start + 4]}) for start in range(0, len(reply), 4)]
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


    async def _stats(self, send: Send) -> None:
        self.stats_reads += 1
        if not self.has_stats:
            await _send_json(send, 404, {"detail": "Not Found"})
            return
        await _send_json(send, 200, {
            "steps": 0, "running": self.running + self.stuck_running, "waiting": 0, "finished": 0,
            "aborted": self.disconnects, "generated_tokens": 0, "prefix_hits": self.prefix_hits,
            "prefix_tokens_reused": self.prefix_tokens_reused})

    async def _completions(self, receive: Receive, send: Send, body: Message) -> None:
        self.bodies.append(body)
        prompt = body["prompt"] + (body.get("suffix") or "")
        if not body.get("stream"):
            usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": 1}
            await _send_json(send, 200, {"object": "text_completion", "usage": usage,
                                         "choices": [{"text": "a", "index": 0}]})
            return
        hit = self._count_prefix_hit(prompt)
        self.running += 1
        try:
            await self._stream_text(receive, send, body, stall=hit and body["model"] == "fake-stall")
        finally:
            self.running -= 1

    def _count_prefix_hit(self, prompt: str) -> bool:
        shared = _shared_prefix(prompt, self.last_prompt)
        self.last_prompt = prompt
        if shared < 64:
            return False
        self.prefix_hits += 1
        self.prefix_tokens_reused += shared // 4
        return True

    async def _stream_text(self, receive: Receive, send: Send, body: Message, stall: bool) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        tokens = body["max_tokens"]
        texts = [_text_chunk("ab"[: min(2, tokens - t)]) for t in range(0, tokens, 2)]
        if stall:
            await self._events(send, texts[:1])
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnects += 1
            return
        counts = {"prompt_tokens": len(body["prompt"] + (body.get("suffix") or "")) // 4,
                  "completion_tokens": tokens}
        usage = b"data: " + json.dumps({"object": "text_completion", "choices": [],
                                        "usage": counts}).encode() + b"\n\n"
        await self._events(send, [*texts, usage, b"data: [DONE]\n\n"])
        await send({"type": "http.response.body", "body": b""})


def _shared_prefix(first: str, second: str) -> int:
    return next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                min(len(first), len(second)))


def _text_chunk(text: str) -> bytes:
    chunk = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


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


@contextlib.contextmanager
def serving(app: FakeOpenAI) -> Iterator[Served]:
    """`app` served by real uvicorn on a loopback port until the block ends."""
    with served_on_loopback(app, http="h11", loop="asyncio") as port:
        yield Served(f"http://127.0.0.1:{port}/v1", app)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving(FakeOpenAI()) as running:
        yield running


@pytest.fixture
def fake(served: Served) -> Served:
    served.app.bodies.clear()
    served.app.headers.clear()
    app = served.app
    app.streamed = app.running = app.stuck_running = app.stats_reads = app.disconnects = 0
    app.prefix_hits = app.prefix_tokens_reused = 0
    app.has_stats, app.last_prompt = True, ""
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


def test_a_staggered_run_says_so(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-ok", "-c", "3",
                               "-n", "1", "--max-tokens", "4", "--stagger-ms", "20")
    assert code == 0 and report["stagger_ms"] == 20 and report["runs"][0]["ok"] == 3
    assert command.run(_args("--base-url", fake.base_url, "--model", "fake-ok", "-c", "2", "-n", "1",
                             "--max-tokens", "4", "--stagger-ms", "20", "--timeout", "30")) == 0
    assert "clients started 20 ms apart" in capsys.readouterr().out


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


# ---------------------------------------------------------------------- structured output


def _schema_names(bodies: list[dict[str, Any]]) -> list[str]:
    return [body["response_format"]["json_schema"]["name"] for body in bodies if "response_format" in body]


def test_constrained_clients_send_schemas_and_their_json_is_judged(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-ok", "-c", "4",
                               "-n", "2", "--max-tokens", "8", "--constrained", "2")
    assert code == 0
    streamed = _streamed(fake.app)
    warm, measured = streamed[1:13], streamed[13:]  # after the plain warmup: each schema once
    assert _schema_names(warm) == report["schemas"] and {b["max_tokens"] for b in warm} == {1}
    assert len(measured) == 8 and sorted(_schema_names(measured)) == sorted(report["schemas"][:4])
    assert all(body["response_format"]["json_schema"]["strict"] is True
               for body in measured if "response_format" in body)
    whole, schema, plain = report["runs"]
    assert [run["label"] for run in report["runs"]] == ["http", "http schema", "http plain"]
    assert (whole["ok"], schema["ok"], plain["ok"]) == (8, 4, 4)
    assert schema["json"] == {"parsed": 4, "unparseable": 0, "cut": 0} and plain["json"] is None
    assert set(report["median_output_tokens_per_s"]) == {"http", "http schema", "http plain"}


def test_unparseable_json_fails_the_run(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-badjson", "-c", "2",
                               "-n", "2", "--max-tokens", "8", "--constrained", "1")
    assert code == 1
    assert report["runs"][1]["json"] == {"parsed": 0, "unparseable": 2, "cut": 0}
    assert report["runs"][0]["errors"] == 0  # the streams were whole; their JSON was not


def test_schemas_workload_times_first_use_and_cached(fake: Served, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--base-url", fake.base_url, "--model", "fake-ok",
                               "--workload", "schemas", "--repeats", "2")
    assert code == 0
    assert report["setup"]["error"] is None and report["setup"]["first_ms"] > 0
    assert [len(run["timings"]) for run in report["runs"]] == [12, 12]
    assert all(run["errors"] == 0 and run["first_cost_ms_p50"] is not None for run in report["runs"])
    streamed = _streamed(fake.app)
    assert len(streamed) == 1 + 3 + 2 * 36 and {body["max_tokens"] for body in streamed} == {1}
    titles = [body["response_format"]["json_schema"]["schema"]["title"]
              for body in streamed if "response_format" in body]
    assert titles[2:4] == [titles[2]] * 2 and titles[2].startswith("CalendarEvent ")  # first use, cached
    assert len(set(titles)) == 1 + 2 * 12  # setup, then new to the server in every repeat
    prompts = [body["messages"][0]["content"] for body in streamed]
    assert len(set(prompts)) == len(prompts)  # no prefix reused between them
    assert set(report["medians"]) >= {"first_cost_ms_p50", "cached_cost_ms_max"}


# ---------------------------------------------------------------------- autocomplete


def _autocomplete(capsys: Capture, fake: Served, *argv: str) -> tuple[int, dict[str, Any]]:
    return _bench_json(capsys, "--base-url", fake.base_url, "--workload", "autocomplete",
                       "--file-tokens", "300", "--edit-interval-ms", "40", "--warmup", "0",
                       *argv)


def _completion_bodies(app: FakeOpenAI) -> list[dict[str, Any]]:
    return [body for body in app.bodies if body.get("stream") and "prompt" in body]


def test_autocomplete_closes_superseded_requests(fake: Served, capsys: Capture) -> None:
    code, report = _autocomplete(capsys, fake, "--model", "fake-stall", "--edits", "5")
    assert code == 0
    (run,) = report["runs"]
    assert run["requests"] == 5 and run["errors"] == 0 and run["empty"] == 0
    assert run["kept"] + run["superseded"] == 5  # every edit's request was closed by the next
    assert run["closed_after_first_token"] == run["kept"]
    assert fake.app.disconnects == 5  # the fake saw each one go
    assert run["cold_error"] is None and run["cold_ttft_ms"] is not None
    assert run["cold_prefix_tokens_reused"] == 0  # a fresh file
    assert abs(run["prompt_tokens"] - 300) <= 40  # the cold request's usage, file calibrated
    assert run["prefix_hit_rate"] == 1.0 and run["prefix_tokens_reused_per_request"] > 0
    assert run["drained"] is True and run["drain_s"] >= 0
    assert fake.app.running == 0 and fake.app.stats_reads >= 5  # probe, around cold and edits, drain
    assert report["medians"]["prefix_hit_rate"] == 1.0


def test_autocomplete_pauses_until_the_suggestion_shows(fake: Served, capsys: Capture) -> None:
    code, report = _autocomplete(capsys, fake, "--model", "fake-stall", "--edits", "6",
                                 "--edit-interval-ms", "1", "--pause-every", "2")
    assert code == 0 and report["pause_every"] == 2
    (run,) = report["runs"]
    assert run["requests"] == 6 and run["kept"] >= 2  # the requests before edits 2 and 4 were awaited
    assert run["paused_ttft_ms_p50"] is not None and run["paused_p50_over_cold"] is not None
    assert run["kept"] + run["superseded"] == 6


def test_autocomplete_sends_what_an_editor_sends(fake: Served, capsys: Capture) -> None:
    code, report = _autocomplete(capsys, fake, "--model", "fake-stall", "--edits", "4")
    assert code == 0 and report["fim"] == "client" and report["max_tokens"] == 64
    cold, *edits = _completion_bodies(fake.app)
    assert len(edits) == 4
    assert all(len(body["stop"]) == 12 and body["max_tokens"] == 64 for body in edits)
    assert all(body["prompt"].startswith("<|fim_prefix|>") for body in edits)
    assert all(body["prompt"].endswith("<|fim_middle|>") and "suffix" not in body for body in edits)
    lengths = [len(body["prompt"]) for body in [cold, *edits]]
    assert all(abs(after - before) == 1 for before, after in itertools.pairwise(lengths))


def test_autocomplete_server_fim_counts_add_up(fake: Served, capsys: Capture) -> None:
    code, report = _autocomplete(capsys, fake, "--model", "fake-ok", "--fim", "server",
                                 "--edits", "6", "--max-tokens", "4", "--repeats", "2",
                                 "--warmup", "1")
    assert code == 0
    bodies = _completion_bodies(fake.app)
    assert len(bodies) == 1 + 2 * (1 + 6)  # warmup, then per repeat a cold request and the edits
    assert all("suffix" in body and "<|fim_prefix|>" not in body["prompt"] for body in bodies)
    for run in report["runs"]:
        assert run["kept"] + run["superseded"] + run["empty"] + run["errors"] == run["requests"] == 6
        assert run["drained"] is True
    assert [run["repeat"] for run in report["runs"]] == [1, 2]


def test_autocomplete_fails_when_requests_keep_running(fake: Served, capsys: Capture) -> None:
    fake.app.stuck_running = 1
    code, report = _autocomplete(capsys, fake, "--model", "fake-ok", "--edits", "2",
                                 "--max-tokens", "2", "--drain-timeout", "0.2")
    assert code == 1
    (run,) = report["runs"]
    assert run["drained"] is False and run["drain_s"] is None
    assert "1 running" in run["error_messages"][-1]


def test_autocomplete_without_stats_and_as_a_table(fake: Served, capsys: Capture) -> None:
    fake.app.has_stats = False
    code = command.run(_args("--base-url", fake.base_url, "--model", "fake-ok", "--workload",
                             "autocomplete", "--edits", "3", "--max-tokens", "2", "--warmup", "0",
                             "--file-tokens", "200", "--edit-interval-ms", "20", "--timeout", "30"))
    table = capsys.readouterr().out
    assert code == 0
    for text in ("llmd bench autocomplete", "TTFT p50", "p50/cold", "hit rate", "autocomplete #1",
                 "medians over 1 repeat(s)", "no llmd /stats"):
        assert text in table
    (row,) = [line for line in table.splitlines() if line.startswith("autocomplete #")]
    assert row.split()[-3:] == ["-", "-", "-"]  # no hit rate, reuse or drain without /stats
