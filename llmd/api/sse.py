"""The one place that frames Server-Sent Events.

Every event is `data: <json>\\n\\n`, JSON encoded by msgspec, handed to the server as
its own body write so it is flushed the moment it exists. A failure after the first
byte becomes one error event (counted, as an error response would be); `[DONE]` always
ends an OpenAI stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import msgspec
from litestar.response import Stream

from llmd.api.errors import ErrorCounter, error_body
from llmd.errors import EngineFailure, LlmdError

log = logging.getLogger("llmd.api")

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Cache-Control": "no-cache",
    # Tells nginx-style proxies not to buffer the stream (see shared/reference notes).
    "X-Accel-Buffering": "no",
}

_encoder = msgspec.json.Encoder()
Payload = msgspec.Struct | dict[str, Any]  # a wire Struct, or llama.cpp's `response_fields` pick of one


class TypedEvent(Protocol):
    """A Responses stream event: a wire Struct whose `type` names it."""

    @property
    def type(self) -> str: ...


def event(payload: Payload) -> bytes:
    """One SSE `data:` event carrying `payload` as JSON."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def named_event(payload: TypedEvent) -> bytes:
    """One SSE event named by the payload's `type`, carrying it as JSON."""
    return b"event: " + payload.type.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


def frame(chunks: AsyncIterator[Payload], count_error: ErrorCounter | None = None,
          done: bool = True) -> AsyncIterator[bytes]:
    """SSE bytes for `chunks`, ending in `[DONE]` (unless not `done`) whether or not they fail midway."""
    return framed(chunks, event, error_body, count_error, DONE if done else None)


async def framed(chunks: AsyncIterator[Any], encode: Callable[[Any], bytes],
                 failed: Callable[[LlmdError], Any], count_error: ErrorCounter | None,
                 last: bytes | None = None) -> AsyncIterator[bytes]:
    """`chunks` encoded one by one; a failure midway ends them with `failed`'s event (counted);
    `last`, when given, always closes the stream. One generator: every chunk is one step of it."""
    failure: LlmdError | None = None
    try:
        async for chunk in chunks:
            yield encode(chunk)
    except LlmdError as exc:
        failure = exc
    except Exception as exc:
        log.exception("stream failed")
        failure = EngineFailure(f"stream failed: {type(exc).__name__}")
    if failure is not None:
        if count_error is not None:
            count_error(failure.code or failure.error_type)
        yield encode(failed(failure))
    if last is not None:
        yield last


def sse_response(chunks: AsyncIterator[Payload], count_error: ErrorCounter | None = None,
                 done: bool = True) -> Stream:
    """A `text/event-stream` response streaming `chunks`; `count_error` hears of an in-stream error.

    `done=False` leaves out the closing `[DONE]`: llama.cpp's own endpoints (`/infill`) end
    with their last event (`stop: true`), and its clients do not expect one.
    """
    return Stream(frame(chunks, count_error, done), media_type="text/event-stream", headers=HEADERS)


def named_events(batch: Sequence[TypedEvent]) -> bytes:
    """Events made together (a token's delta and the item it opens), as one body write."""
    return b"".join(named_event(payload) for payload in batch)


def named_sse_response(events: AsyncIterator[Sequence[TypedEvent]],
                       failed: Callable[[LlmdError], Sequence[TypedEvent]],
                       count_error: ErrorCounter | None = None) -> Stream:
    """A `text/event-stream` of named events (the Responses API's), each batch of events made
    together sent as one write; a failure midway ends it with `failed`'s events, and nothing
    follows the last event."""
    body = framed(events, named_events, failed, count_error)
    return Stream(body, media_type="text/event-stream", headers=HEADERS)
