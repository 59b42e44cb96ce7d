"""The one place that frames Server-Sent Events.

Every event is `data: <json>\\n\\n`, JSON encoded by msgspec, written the moment it exists. A
failure after the first byte becomes one error event (counted, as an error response would be);
`[DONE]` always ends an OpenAI stream.

Chat and text completions are pushed (`pushed_sse_response`): each engine event is framed in the
callback that delivers it and written straight to the connection, so a token costs no task
switch, no async generator and no ASGI message. Other streams are async iterators of payloads
(`sse_response`, `named_sse_response`), one body write per item.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, cast

import msgspec
from litestar import Request
from litestar.response import Stream

from llmd.api.choices import closing_all
from llmd.api.errors import ErrorCounter, error_body
from llmd.engine.client import TokenStream
from llmd.engine.types import TokenEvent
from llmd.errors import EngineFailure, LlmdError

log = logging.getLogger("llmd.api")

DONE = b"data: [DONE]\n\n"
HEADERS = {
    "Cache-Control": "no-cache",
    # Tells nginx-style proxies not to buffer the stream (see shared/reference notes).
    "X-Accel-Buffering": "no",
}

# The ASGI scope extension through which the server (api/connection.py) lets a response write
# a body chunk now, outside ASGI: `{"write": BodyWriter}`.
BODY_WRITER = "llmd.body_writer"
# Writes bytes as the next part of the body at once: True; False, writing nothing, when they
# cannot go now (headers not out, the client gone or not reading): then they go through ASGI.
BodyWriter = Callable[[bytes], bool]

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


class Chunker(Protocol):
    """What a pushed response makes of its choices' events (`pushed_sse_response`)."""

    def opening(self) -> Sequence[Payload]:
        """The chunks sent before any event."""
        ...

    def feed(self, index: int, event: TokenEvent) -> Sequence[Payload]:
        """The chunks choice `index`'s next event makes."""
        ...

    def closing(self) -> Sequence[Payload]:
        """The chunks sent once every choice has finished (before `[DONE]`)."""
        ...


def pushed_sse_response(request: Request, streams: Sequence[TokenStream], chunker: Chunker,
                        count_error: ErrorCounter | None = None) -> Stream:
    """A `text/event-stream` written by `streams`' events as the engine delivers them
    (`PushedEvents`); `chunker` makes the chunks, `count_error` hears of an in-stream error."""
    offered = request.scope.get("extensions") or {}
    write = cast(BodyWriter | None, offered.get(BODY_WRITER, {}).get("write"))
    pushed = PushedEvents(streams, chunker, write, count_error)
    return Stream(pushed.body(), media_type="text/event-stream", headers=HEADERS)


class PushedEvents:
    """A streamed response that its streams' events write as they are delivered (`listen`).

    Each event is framed in the callback that delivers it. While the response's task waits for
    more, the bytes go straight to the connection (`write`, the server's `BODY_WRITER`); what
    cannot go at once (before the task first waits, while a slow client holds a write back, on
    a server with no writer) is kept, and the task sends all of it as one body write. A failure
    midway ends the response with one error event (counted), then `[DONE]`; leaving it closes
    every stream, aborting those not finished.
    """

    def __init__(self, streams: Sequence[TokenStream], chunker: Chunker, write: BodyWriter | None,
                 count_error: ErrorCounter | None) -> None:
        self._streams = streams
        self._chunker = chunker
        self._write = write
        self._count_error = count_error
        self._running = len(streams)  # choices not finished
        self._kept: list[bytes] = []
        self._waiting: asyncio.Future[None] | None = None  # set while the task waits for more
        self._ended = False

    async def body(self) -> AsyncIterator[bytes]:
        """The bytes the response's task sends: the opening, then whatever was kept by each wake."""
        with closing_all(self._streams):
            try:
                self._push(frames(self._chunker.opening()))
                for index, stream in enumerate(self._streams):
                    stream.listen(functools.partial(self._take, index))
                while self._kept or not self._ended:
                    if self._kept:
                        kept, self._kept = b"".join(self._kept), []
                        yield kept
                    else:
                        await self._more()
            finally:
                self._ended = True

    async def _more(self) -> None:
        self._waiting = asyncio.get_running_loop().create_future()
        try:
            await self._waiting
        finally:
            self._waiting = None

    def _take(self, index: int, item: TokenEvent | LlmdError) -> None:
        """Choice `index`'s next event (or the error that ended it), framed and pushed."""
        if self._ended:
            return
        if isinstance(item, LlmdError):
            self._fail(item)
            return
        try:
            data = frames(self._chunker.feed(index, item))
            if item.finish_reason is not None:
                self._running -= 1
                if not self._running:
                    data += frames(self._chunker.closing()) + DONE
                    self._ended = True
        except Exception as exc:
            log.exception("stream failed")
            self._fail(EngineFailure(f"stream failed: {type(exc).__name__}"))
            return
        self._push(data)

    def _fail(self, error: LlmdError) -> None:
        if self._count_error is not None:
            self._count_error(error.code or error.error_type)
        self._ended = True
        self._push(event(error_body(error)) + DONE)

    def _push(self, data: bytes) -> None:
        """Write `data` now if the task waits and nothing is kept before it; else keep it. Wake
        the task when there is something for it to send, or the end."""
        waiting = self._waiting
        if data and (waiting is None or self._kept or self._write is None or not self._write(data)):
            self._kept.append(data)
        if waiting is not None and not waiting.done() and (self._kept or self._ended):
            waiting.set_result(None)


def frames(payloads: Sequence[Payload]) -> bytes:
    """`payloads` as consecutive SSE events."""
    return b"".join(event(payload) for payload in payloads)
