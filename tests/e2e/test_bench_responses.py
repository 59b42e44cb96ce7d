"""`llmd bench --api responses` whole runs against a fake server streaming OpenAI's Responses events
(real uvicorn on loopback, real client); the fake's chat side is test_bench_http.py's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from llmd.bench import command
from tests.e2e.test_bench_http import (
    Capture,
    FakeOpenAI,
    Message,
    Receive,
    Send,
    Served,
    _read_body,
    _send_json,
    serving,
)

Event = tuple[str, dict[str, Any]]
PART = {"item_id": "msg_1", "output_index": 0, "content_index": 0}


@dataclass
class FakeResponses(FakeOpenAI):
    """FakeOpenAI plus POST /v1/responses, streaming in OpenAI's event order, one text delta a token.

    fake-ok: max_output_tokens deltas, then response.completed with usage.
    fake-length: the same, ending in response.incomplete (max_output_tokens).
    fake-flaky: streamed request k is ok (k%4==0), HTTP 503, response.failed after one delta,
    an `error` event after one delta.
    fake-truncated: the deltas, then the body ends with no terminal event.
    fake-reasoning: a reasoning summary delta before the text deltas.
    Under `text.format`, fake-ok streams `{"ok": true}`, fake-length a cut `{"ok": `.
    """

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/responses":
            await super().__call__(scope, receive, send)
            return
        body = json.loads(await _read_body(receive))
        self.bodies.append(body)
        index = self.streamed
        self.streamed += 1
        if body["model"] == "fake-flaky" and index % 4 == 1:
            await _send_json(send, 503, {"error": {"message": "overloaded"}})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        script = self._response_script(body, index)
        await self._events(send, [_sse(kind, n, fields) for n, (kind, fields) in enumerate(script)])
        await send({"type": "http.response.body", "body": b""})

    def _response_script(self, body: Message, index: int) -> list[Event]:
        model, tokens = body["model"], body["max_output_tokens"]
        pieces = ["a"] * tokens
        if "text" in body:
            reply = '{"ok": ' if model == "fake-length" else '{"ok": true}'
            pieces = [reply[start : start + 4] for start in range(0, len(reply), 4)]
        deltas = [("response.output_text.delta", {**PART, "delta": p, "logprobs": []}) for p in pieces]
        if model == "fake-reasoning":
            deltas.insert(
                0,
                (
                    "response.reasoning_summary_text.delta",
                    {"item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "hm"},
                ),
            )
        head = _opening(model)
        if model == "fake-flaky" and index % 4 == 2:
            failed = _response(model, "failed", error={"code": "server_error", "message": "decode failed"})
            return [*head, deltas[0], ("response.failed", {"response": failed})]
        if model == "fake-flaky" and index % 4 == 3:
            return [*head, deltas[0], ("error", {"code": "oom", "message": "out of memory", "param": None})]
        if model == "fake-truncated":
            return [*head, *deltas]
        return [*head, *deltas, *_closing("".join(pieces)), self._terminal(body, tokens)]

    def _terminal(self, body: Message, tokens: int) -> Event:
        usage = {
            "input_tokens": self.overhead + len(body["input"][0]["content"].split()),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        usage["total_tokens"] = usage["input_tokens"] + tokens
        if body["model"] == "fake-length":
            cut = _response(
                body["model"], "incomplete", usage=usage, incomplete_details={"reason": "max_output_tokens"}
            )
            return "response.incomplete", {"response": cut}
        return "response.completed", {"response": _response(body["model"], "completed", usage=usage)}


def _response(model: str, status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "model": model, "status": status, "output": [], **fields}


def _opening(model: str) -> list[Event]:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    return [
        ("response.created", {"response": _response(model, "in_progress")}),
        ("response.in_progress", {"response": _response(model, "in_progress")}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        ("response.content_part.added", {**PART, "part": part}),
    ]


def _closing(text: str) -> list[Event]:
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    return [
        ("response.output_text.done", {**PART, "text": text, "logprobs": []}),
        ("response.content_part.done", {**PART, "part": part}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
    ]


def _sse(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    payload = {"type": kind, **fields, "sequence_number": sequence}
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving(FakeResponses()) as running:
        yield running


@pytest.fixture
def fake(served: Served) -> Served:
    served.app.bodies.clear()
    served.app.streamed = 0
    return served


def _bench(capsys: Capture, fake: Served, *argv: str, api: str = "responses") -> tuple[int, dict[str, Any]]:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args([*argv, "--base-url", fake.base_url, "--api", api, "--json", "--timeout", "30"])
    code = command.run(args)
    return code, json.loads(capsys.readouterr().out)


def _responses_bodies(app: FakeOpenAI) -> list[dict[str, Any]]:
    return [body for body in app.bodies if "input" in body]


def test_responses_streams_are_measured_as_chat_ones(fake: Served, capsys: Capture) -> None:
    code, report = _bench(
        capsys, fake, "--model", "fake-ok", "-c", "2", "-n", "3", "--max-tokens", "8", "--prompt-tokens", "40"
    )
    assert code == 0 and report["api"] == "responses"
    (run,) = report["runs"]
    assert (run["requests"], run["ok"], run["errors"], run["missing_done"]) == (6, 6, 0, 0)
    assert run["completion_tokens"] == 48 and run["usage_source"] == "reported"
    assert run["chunks_per_token"] == 1.0  # one output_text delta per token
    assert run["prompt_tokens"] == report["prompt_tokens"]  # usage.input_tokens, as calibrated
    assert 0 < run["ttft_ms_p50"] <= run["ttft_ms_p99"] < 30_000
    assert 0 <= run["gap_ms_p50"] <= run["gap_ms_max"] < 30_000 and run["output_tokens_per_s"] > 0
    assert any("calibrated on /chat/completions" in note for note in report["notes"])


@pytest.mark.parametrize(("clients", "requests"), [(4, 2), (1, 6)])
def test_both_apis_in_one_run_are_reported_apart(
    fake: Served, capsys: Capture, clients: int, requests: int
) -> None:
    code, report = _bench(
        capsys,
        fake,
        "--model",
        "fake-ok",
        "-c",
        str(clients),
        "-n",
        str(requests),
        "--max-tokens",
        "5",
        "--warmup",
        "0",
        api="both",
    )
    assert code == 0 and report["api"] == "both"
    whole, chat, responses = report["runs"]
    assert (whole["share"], chat["share"], responses["share"]) == ("all", "chat", "responses")
    assert chat["requests"] == responses["requests"] == clients * requests // 2
    assert chat["completion_tokens"] == responses["completion_tokens"] == 5 * clients * requests // 2
    streamed = [body for body in fake.app.bodies if body.get("stream")]
    assert sum("input" in body for body in streamed) == sum("messages" in body for body in streamed)


def test_responses_requests_carry_the_chat_requests_settings(fake: Served, capsys: Capture) -> None:
    code, _ = _bench(
        capsys,
        fake,
        "--model",
        "fake-ok",
        "-n",
        "2",
        "--warmup",
        "1",
        "--max-tokens",
        "6",
        "--temperature",
        "0.5",
        "--ignore-eos",
    )
    assert code == 0
    sent = _responses_bodies(fake.app)
    assert len(sent) == 3 and all(body.get("stream") for body in sent)  # warmup + 2 measured
    assert [sorted(body) for body in sent] == [
        sorted(["model", "input", "max_output_tokens", "temperature", "stream", "store", "ignore_eos"])
    ] * 3
    assert all(body["max_output_tokens"] == 6 and body["temperature"] == 0.5 for body in sent)
    assert all(body["store"] is False and body["ignore_eos"] is True for body in sent)
    assert all(body["input"][0]["role"] == "user" for body in sent)
    chat = [body for body in fake.app.bodies if "messages" in body]
    assert chat and not any(body["stream"] for body in chat)  # only the calibration probes


def test_responses_failures_are_counted_as_errors(fake: Served, capsys: Capture) -> None:
    code, report = _bench(
        capsys, fake, "--model", "fake-flaky", "-c", "2", "-n", "4", "--warmup", "0", "--max-tokens", "6"
    )
    assert code == 1
    (run,) = report["runs"]
    assert (run["requests"], run["ok"], run["errors"]) == (8, 2, 6)
    assert run["completion_tokens"] == 12
    messages = " | ".join(run["error_messages"])
    assert "HTTP 503" in messages and "overloaded" in messages
    assert "response.failed" in messages and "decode failed" in messages
    assert "stream error event" in messages and "out of memory" in messages


def test_a_stream_without_its_terminal_event_is_an_error(fake: Served, capsys: Capture) -> None:
    code, report = _bench(capsys, fake, "--model", "fake-truncated", "-n", "2", "--max-tokens", "4")
    (run,) = report["runs"]
    assert code == 1 and run["errors"] == 2
    assert "before its response.completed" in run["error_messages"][0]


def test_incomplete_is_finished_by_length(fake: Served, capsys: Capture) -> None:
    code, report = _bench(
        capsys,
        fake,
        "--model",
        "fake-length",
        "-c",
        "2",
        "-n",
        "2",
        "--max-tokens",
        "8",
        "--constrained",
        "1",
    )
    assert code == 0
    whole, schema, plain = report["runs"]
    assert (whole["ok"], whole["errors"], whole["completion_tokens"]) == (4, 0, 32)
    assert schema["json"] == {"parsed": 0, "unparseable": 0, "cut": 2}  # cut, not broken JSON
    assert plain["ok"] == 2 and plain["missing_done"] == 0


def test_schemas_travel_as_text_format(fake: Served, capsys: Capture) -> None:
    code, report = _bench(
        capsys, fake, "--model", "fake-ok", "-c", "2", "-n", "2", "--max-tokens", "8", "--constrained", "1"
    )
    assert code == 0 and report["runs"][1]["json"] == {"parsed": 2, "unparseable": 0, "cut": 0}
    formats = [body["text"]["format"] for body in _responses_bodies(fake.app) if "text" in body]
    assert len(formats) == 12 + 2  # each schema warmed once, then the constrained client's two
    assert all(set(f) <= {"type", "name", "schema", "strict"} and f["type"] == "json_schema" for f in formats)
    assert [f["name"] for f in formats[:12]] == report["schemas"]
    assert formats[0]["strict"] is True and "response_format" not in str(fake.app.bodies)


def test_reasoning_deltas_count_as_arriving_tokens(fake: Served, capsys: Capture) -> None:
    code, report = _bench(capsys, fake, "--model", "fake-reasoning", "-n", "1", "--max-tokens", "4")
    (run,) = report["runs"]
    assert code == 0 and run["completion_tokens"] == 4
    assert run["chunks_per_token"] == 1.25  # the summary delta, then the four text deltas


def test_schemas_workload_drives_responses(fake: Served, capsys: Capture) -> None:
    code, report = _bench(capsys, fake, "--model", "fake-ok", "--workload", "schemas")
    assert code == 0 and report["api"] == "responses"
    assert all(run["errors"] == 0 for run in report["runs"])
    assert len(_responses_bodies(fake.app)) == 1 + 3 + 36


def test_the_table_names_the_api(fake: Served, capsys: Capture) -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    argv = ["--base-url", fake.base_url, "--model", "fake-ok", "-n", "1", "--max-tokens", "2"]
    assert command.run(parser.parse_args([*argv, "--api", "responses"])) == 0
    assert "model fake-ok  via /responses" in capsys.readouterr().out.splitlines()[0]
    assert command.run(parser.parse_args(argv)) == 0
    assert "via /chat/completions" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("argv", [("--workload", "autocomplete"), ("--in-process", "/nowhere")])
def test_workloads_without_a_responses_form_refuse_it(argv: tuple[str, ...], capsys: Capture) -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args([*argv, "--api", "responses"])) == 2
    assert "drop --api" in capsys.readouterr().err
