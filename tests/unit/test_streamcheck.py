"""Unit tests for the soak harness's stream checker (llmd/bench/streamcheck.py)."""

from __future__ import annotations

import json

import pytest

from llmd.bench.streamcheck import StreamVerdict, check_stream, is_error_body

DONE = b"data: [DONE]\n\n"


def chunk(content: str | None = "hi", finish: str | None = None, usage: bool = False,
          index: int = 0) -> bytes:
    choices = [] if usage else [{"index": index, "delta": {"content": content}, "finish_reason": finish}]
    payload = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


ERROR = (b'data: {"error": {"message": "boom", "type": "server_error", "param": null, '
         b'"code": "engine_error"}}\n\n')


@pytest.mark.parametrize(("body", "outcome"), [
    (chunk() + chunk(None, "stop") + DONE, "stop"),
    (chunk() + chunk("", "length") + chunk(usage=True) + DONE, "length"),
    (chunk() + ERROR + DONE, "error:engine_error"),
    (ERROR + DONE, "error:engine_error"),
])
def test_whole_streams_report_how_they_ended(body: bytes, outcome: str) -> None:
    check = check_stream(body)
    assert check.verdict is StreamVerdict.WHOLE
    assert check.outcome == outcome


@pytest.mark.parametrize("body", [
    b"",
    chunk(),
    chunk() + chunk(None, "stop"),
    chunk() + chunk(None, "stop") + b"data: [DO",
])
def test_a_stream_that_stops_before_done_is_lost(body: bytes) -> None:
    assert check_stream(body).verdict is StreamVerdict.LOST


@pytest.mark.parametrize("body", [
    chunk() + DONE,  # no finish_reason and no error
    chunk() + b'data: {"choices": [\n\n' + chunk(None, "stop") + DONE,  # bad JSON
    chunk() + b"event: x\n\n" + chunk(None, "stop") + DONE,  # not a data line
    ERROR + chunk(None, "stop") + DONE,  # an error that is not last
    chunk(None, "stop") + chunk() + DONE,  # content after the finish
    chunk(None, "stop") + DONE + chunk(),  # bytes after [DONE]
    b'data: {"object": "chat.completion"}\n\n' + DONE,  # not a chunk
])
def test_a_malformed_stream_is_garbled(body: bytes) -> None:
    check = check_stream(body)
    assert check.verdict is StreamVerdict.GARBLED
    assert check.problem


def test_an_error_event_reports_its_type() -> None:
    assert check_stream(chunk() + ERROR + DONE).error_type == "server_error"
    assert check_stream(chunk(None, "stop") + DONE).error_type is None


def test_error_bodies_must_have_the_openai_shape() -> None:
    assert is_error_body(ERROR[6:-2])
    assert not is_error_body(b'{"error": "boom"}')
    assert not is_error_body(b"Internal Server Error")


def test_a_stream_of_several_choices_ends_when_every_choice_has_finished() -> None:
    two = chunk(index=0) + chunk(index=1) + chunk(None, "length", index=1)
    assert check_stream(two + chunk(None, "stop", index=0) + chunk(usage=True) + DONE).outcome == "stop"
    assert check_stream(two + DONE).verdict is StreamVerdict.GARBLED  # choice 0 never finished
    late = two + chunk(index=1) + chunk(None, "stop", index=0) + DONE
    assert "choice 1 after its finish_reason" in check_stream(late).problem

