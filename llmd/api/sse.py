"""The one place that frames Server-Sent Events.

Every event is `data: <json>\\n\\n`, JSON encoded by msgspec, handed to the server as
its own body write so it is flushed the moment it exists. A failure after the first
byte becomes one error event; `[DONE]` always ends the stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
from litestar.response import Stream

from llmd.errors import EngineFailure, LlmdError
from llmd.protocol import ErrorDetail, ErrorResponse

log = logging.getLogger("llmd.api")

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Cache-Control": "no-cache",
    # Tells nginx-style proxies not to buffer the stream (see shared/reference notes).
    "X-Accel-Buffering": "no",
}

_encoder = msgspec.json.Encoder()


def event(payload: msgspec.Struct) -> bytes:
    """One SSE `data:` event carrying `payload` as JSON."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def error_body(error: LlmdError) -> ErrorResponse:
    """The OpenAI error object for `error`."""
    return ErrorResponse(ErrorDetail(error.message, error.error_type, error.param, error.code))


async def frame(chunks: AsyncIterator[msgspec.Struct]) -> AsyncIterator[bytes]:
    """SSE bytes for `chunks`, ending in `[DONE]` whether or not they fail midway."""
    try:
        async for chunk in chunks:
            yield event(chunk)
    except LlmdError as exc:
        yield event(error_body(exc))
    except Exception as exc:
        log.exception("stream failed")
        yield event(error_body(EngineFailure(f"stream failed: {type(exc).__name__}")))
    yield DONE


def sse_response(chunks: AsyncIterator[msgspec.Struct]) -> Stream:
    """A `text/event-stream` response streaming `chunks`."""
    return Stream(frame(chunks), media_type="text/event-stream", headers=HEADERS)
