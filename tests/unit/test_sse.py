"""SSE framing: one `data:` event per chunk, an in-band error after the first byte, `[DONE]`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import msgspec

from llmd.api.sse import DONE, frame
from llmd.errors import EngineFailure, ShuttingDown


class Piece(msgspec.Struct):
    text: str


async def pieces(fail_after: int | None, error: Exception) -> AsyncIterator[Piece]:
    for i in range(3):
        if fail_after is not None and i == fail_after:
            raise error
        yield Piece(f"p{i}")


def framed(fail_after: int | None, error: Exception | None = None, counted: list[str] | None = None
           ) -> list[bytes]:
    failure = error if error is not None else EngineFailure("boom")
    count = counted.append if counted is not None else None

    async def collect() -> list[bytes]:
        return [event async for event in frame(pieces(fail_after, failure), count)]

    return asyncio.run(collect())


def test_each_chunk_is_one_data_event_then_done() -> None:
    events = framed(None)
    assert events[:-1] == [b'data: {"text":"p0"}\n\n', b'data: {"text":"p1"}\n\n', b'data: {"text":"p2"}\n\n']
    assert events[-1] == DONE == b"data: [DONE]\n\n"


def test_failure_midway_sends_one_error_event_then_done() -> None:
    events = framed(2)
    assert len(events) == 4 and events[-1] == DONE
    error = json.loads(events[2].removeprefix(b"data: "))["error"]
    assert error == {"message": "boom", "type": "server_error", "param": None, "code": "engine_error"}


def test_unexpected_exception_is_reported_without_internals() -> None:
    events = framed(1, KeyError("secret"))
    error = json.loads(events[1].removeprefix(b"data: "))["error"]
    assert error["type"] == "server_error" and "secret" not in error["message"]
    assert events[-1] == DONE


def test_an_in_stream_error_is_counted_by_its_code_and_a_clean_stream_is_not() -> None:
    counted: list[str] = []
    framed(None, counted=counted)
    assert counted == []
    events = framed(1, ShuttingDown("the drain timeout ran out"), counted)
    assert counted == ["shutting_down"]
    assert json.loads(events[1].removeprefix(b"data: "))["error"]["code"] == "shutting_down"
    framed(0, KeyError("secret"), counted)
    assert counted == ["shutting_down", "engine_error"]
