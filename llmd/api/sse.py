"""The one place that frames Server-Sent Events.

Every event is `data: <json>\\n\\n`, JSON encoded by msgspec, written the moment it exists. A
failure after the first byte becomes one error event (counted, as an error response would be);
`[DONE]` always ends an OpenAI stream.

Every stream is pushed (`pushed_sse_response`): each engine event is framed in the callback that
delivers it and written straight to the connection, so a token costs no task switch, no async
generator and no ASGI message. Where the server offers its socket (`BODY_SOCKET`), a token is
framed and written on the engine's own thread, so it costs the event loop not even a wake. What
a response makes of its events is its endpoint's `Chunker` (chat, text completions, the Responses
API, `/infill`); how they become bytes is a `Framing`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import msgspec
from litestar import Request
from litestar.response import Stream

from llmd.api.choices import closing_all
from llmd.api.errors import ErrorCounter, error_body
from llmd.engine.client import TokenStream
from llmd.engine.types import TokenEvent
from llmd.errors import EngineFailure, LlmdError
from llmd.protocol import ErrorResponse

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
# The same extension's `socket`: a `BodySocket` for writing body chunks from another thread.
BODY_SOCKET = "socket"


class BodySocket(Protocol):
    """A chunked body's socket, written from the engine's thread (api/connection.py's `SocketWriter`).

    `open` (on the loop) makes it writable from other threads until `close` (on the loop, under
    `lock`); `ready` and `write` run under `lock`, on any thread.
    """

    lock: threading.Lock

    def open(self) -> bool:
        """Make the socket writable from other threads; False when it cannot be (closing)."""
        ...

    def ready(self) -> bool:
        """Whether a chunk may be written now: headers out, nothing of the server's own waiting
        to go, the client reading and not gone."""
        ...

    def write(self, data: bytes) -> None:
        """`data` as the body's next chunk, now; what the socket does not take at once goes
        after, in order, from the loop."""
        ...

    def close(self) -> None:
        """No more writes from other threads."""
        ...

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


def named_events(batch: Sequence[TypedEvent]) -> bytes:
    """Events made together (a token's delta and the item it opens), as one body write."""
    return b"".join(named_event(payload) for payload in batch)


class Chunker(Protocol):
    """What a pushed response makes of its choices' events (`pushed_sse_response`)."""

    def opening(self) -> Sequence[Any]:
        """The chunks sent before any event."""
        ...

    def feed(self, index: int, event: TokenEvent) -> Sequence[Any]:
        """The chunks choice `index`'s next event makes."""
        ...

    async def closing(self) -> Sequence[Any]:
        """Once every choice has finished: the chunks that follow the last event's, which wait
        for it (a stored response is saved here, before its client hears it is complete)."""
        ...

    def failed(self, error: LlmdError) -> Sequence[Any]:
        """The chunks that end the response when `error` stops it midway."""
        ...

    @property
    def stopped(self) -> bool:
        """Whether the response is over before its streams are (a limit cut it short, read after
        each `feed`): it closes at once, and leaving it aborts them."""
        ...


def error_events(error: LlmdError) -> list[ErrorResponse]:
    """What ends an OpenAI or llama.cpp stream that `error` stopped midway: one error event (a
    chunker's `failed`)."""
    return [error_body(error)]


@dataclass(frozen=True, slots=True)
class Framing:
    """How a pushed response's chunks become bytes (`encode`), and what always ends it (`last`)."""

    encode: Callable[[Sequence[Any]], bytes]
    last: bytes = b""


def frames(payloads: Sequence[Payload]) -> bytes:
    """`payloads` as consecutive `data:` events."""
    return b"".join(event(payload) for payload in payloads)


OPENAI_EVENTS = Framing(frames, DONE)  # chat and text completions: `data:` events, then `[DONE]`
NAMED_EVENTS = Framing(named_events)  # the Responses API: named events, nothing after the last
LLAMA_EVENTS = Framing(frames)  # llama.cpp's own (`/infill`): `data:` events, the last says `stop: true`


def pushed_sse_response(request: Request, streams: Sequence[TokenStream], chunker: Chunker,
                        count_error: ErrorCounter | None = None, framing: Framing = OPENAI_EVENTS) -> Stream:
    """A `text/event-stream` written by `streams`' events as the engine delivers them
    (`PushedEvents`); `chunker` makes the chunks, `count_error` hears of an in-stream error."""
    offered = (request.scope.get("extensions") or {}).get(BODY_WRITER, {})
    write = cast(BodyWriter | None, offered.get("write"))
    socket = cast(BodySocket | None, offered.get(BODY_SOCKET))
    pushed = PushedEvents(streams, chunker, framing, write, count_error, socket)
    return Stream(pushed.body(), media_type="text/event-stream", headers=HEADERS)


class PushedEvents:
    """A streamed response that its streams' events write as they are delivered (`listen`).

    Each event is framed in the callback that delivers it. While the response's task waits for
    more, the bytes go straight to the connection (`write`, the server's `BODY_WRITER`); what
    cannot go at once (before the task first waits, while a slow client holds a write back, on
    a server with no writer) is kept, and the task sends all of it as one body write. The last
    event's chunks wait for the chunker's `closing`, run by the task. A failure midway ends the
    response with the chunker's `failed` chunks (counted); leaving it closes every stream,
    aborting those not finished.

    With the server's `socket`, a token event that ends nothing is taken on the engine's thread
    (`_take_direct`) while the task waits with nothing kept: fed, framed and written there, the
    loop not woken. Everything else (ends, errors, a client not keeping up) goes by the loop as
    above; `_lock` (the socket's) keeps the two threads off the chunker and the connection at once.
    """

    def __init__(self, streams: Sequence[TokenStream], chunker: Chunker, framing: Framing,
                 write: BodyWriter | None, count_error: ErrorCounter | None,
                 socket: BodySocket | None = None) -> None:
        self._streams = streams
        self._chunker = chunker
        self._framing = framing
        self._write = write
        self._count_error = count_error
        self._socket = socket
        self._lock = socket.lock if socket is not None else threading.Lock()  # the socket's writes too
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = len(streams)  # choices not finished
        self._kept: list[bytes] = []
        self._final: bytes | None = None  # the last event's bytes, waiting for `closing`
        self._waiting: asyncio.Future[None] | None = None  # set while the task waits for more
        self._ended = False

    async def body(self) -> AsyncIterator[bytes]:
        """The bytes the response's task sends: the opening, whatever was kept by each wake, and
        the end once `closing` has run."""
        with closing_all(self._streams):
            try:
                self._loop = asyncio.get_running_loop()
                self._push(self._framing.encode(self._chunker.opening()))
                direct = self._socket is not None and self._socket.open()
                for index, stream in enumerate(self._streams):
                    stream.listen(functools.partial(self._take, index),
                                  functools.partial(self._take_direct, index) if direct else None)
                while self._kept or not self._ended:
                    if self._kept:
                        kept, self._kept = b"".join(self._kept), []
                        yield kept
                    elif self._final is not None:
                        await self._close()
                    else:
                        await self._more()
            finally:
                with self._lock:
                    self._ended = True
                    if self._socket is not None:
                        self._socket.close()

    async def _more(self) -> None:
        self._waiting = asyncio.get_running_loop().create_future()
        try:
            await self._waiting
        finally:
            self._waiting = None

    async def _close(self) -> None:
        final, self._final = self._final or b"", None
        try:
            tail = self._framing.encode(await self._chunker.closing())
        except Exception as exc:
            self._fail(failure(exc))
            return
        self._ended = True
        self._kept.append(final + tail + self._framing.last)

    def _take(self, index: int, item: TokenEvent | LlmdError) -> None:
        """Choice `index`'s next event (or the error that ended it), framed and pushed."""
        with self._lock:
            self._take_locked(index, item)

    def _take_locked(self, index: int, item: TokenEvent | LlmdError) -> None:
        if self._ended or not self._running:
            return
        if isinstance(item, LlmdError):
            self._fail(item)
            return
        try:
            data = self._framing.encode(self._chunker.feed(index, item))
        except Exception as exc:
            self._fail(failure(exc))
            return
        if item.finish_reason is not None:
            self._running -= 1
        if self._running and not self._chunker.stopped:
            self._push(data)
        else:
            self._running = 0
            self._final = data
            self._wake()

    def _take_direct(self, index: int, item: TokenEvent, account: Callable[[TokenEvent], object]) -> bool:
        """On the engine's thread: choice `index`'s token event (one that ends nothing), framed
        and written to the socket, when the task waits with nothing kept or due; else False,
        nothing done. What the loop must still do (a failure to send, a limit's end) is handed
        to it, after which the stream's later events go by the loop."""
        with self._lock:
            waiting, socket, loop = self._waiting, self._socket, self._loop
            if self._ended or self._kept or self._final is not None or not self._running or waiting is None \
                    or waiting.done() or socket is None or loop is None or not socket.ready():
                return False
            account(item)
            try:
                data = self._framing.encode(self._chunker.feed(index, item))
            except Exception as exc:
                self._running = 0  # nothing more is fed; the loop sends the failure
                loop.call_soon_threadsafe(self._fail_later, failure(exc))
                return True
            if self._chunker.stopped:  # cut short: the loop sends it and its end
                self._running = 0
                self._final = data
                loop.call_soon_threadsafe(self._wake)
            elif data:
                socket.write(data)
            return True

    def _fail_later(self, error: LlmdError) -> None:
        with self._lock:
            if not self._ended:
                self._fail(error)

    def _fail(self, error: LlmdError) -> None:
        if self._count_error is not None:
            self._count_error(error.code or error.error_type)
        self._ended = True
        self._push(self._framing.encode(self._chunker.failed(error)) + self._framing.last)

    def _push(self, data: bytes) -> None:
        """Write `data` now if the task waits and nothing is kept before it; else keep it."""
        if data and (self._waiting is None or self._kept or self._write is None or not self._write(data)):
            self._kept.append(data)
        self._wake()

    def _wake(self) -> None:
        """Wake the waiting task when it has something to do: send, close, or end."""
        waiting, due = self._waiting, self._kept or self._ended or self._final is not None
        if waiting is not None and not waiting.done() and due:
            waiting.set_result(None)


def failure(exc: Exception) -> LlmdError:
    """`exc` as the error a stream ends with: itself when it is one, else an `EngineFailure` that
    names only its type (logged in full)."""
    if isinstance(exc, LlmdError):
        return exc
    log.exception("stream failed", exc_info=exc)
    return EngineFailure(f"stream failed: {type(exc).__name__}")
