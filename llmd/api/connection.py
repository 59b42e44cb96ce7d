"""The HTTP connection: uvicorn's httptools protocol with llmd's limits.

uvicorn times out only idle keep-alive connections and httptools caps nothing, so one client
could hold a connection open with half a request head, send an endless header, or open
connections until the descriptors run out. This protocol adds, per connection:

- the request head must arrive within `header_timeout`, the body within `body_timeout`
  (408, then close);
- the head may not exceed `max_header_bytes` (431, then close);
- past `max_connections` open connections a request is answered 503 + Retry-After;
- a client that half-closes after its request still gets the whole response;
- an HTTP/1.0 response without Content-Length is close-delimited, never chunked;
- every error the connection itself sends is in the OpenAI shape;
- a request counts as arriving at the engine from its connection's accept or its first byte
  (`engine.burst.Arrival`), so an idle engine gathering a burst sees requests not yet parsed;
- an HTTP/1.1 request's scope offers the `BODY_WRITER` extension (api/sse.py): a streamed
  response writes each event to the socket from the callback that makes it, not by ASGI message,
  or from the engine's thread (`SocketWriter`), waking no event loop.

A refusal is written, the sending side shut, and the rest of what the client sends is read
and dropped for a moment before the close, so the client reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import os
import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import msgspec
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from llmd.api.errors import error_body
from llmd.api.sse import BODY_SOCKET, BODY_WRITER, BodyWriter
from llmd.config import Settings
from llmd.engine.client import BOUND_SECONDS, Arrival, carry
from llmd.errors import HeaderTooLarge, InvalidRequest, LlmdError, Overloaded, RequestTimeout

log = logging.getLogger("llmd.api")

LINGER_SECONDS = 2.0  # how long a refused connection reads and drops input before it closes
# When the writes that tell a half-closed client from a gone one go out, in seconds after its
# EOF. A gone client's kernel answers the first with a reset, which fails the next: on loopback
# that takes microseconds, so an editor's superseded completion is aborted within ~20 ms; the
# later probes cover slower links. A present client skips them all (1xx lines, SSE comments).
PROBE_DELAYS = (0.02, 0.2, 1.0)
FD_RESERVE = 64  # descriptors kept for the model files, the log, the loop and the listener

Phase = Literal["idle", "head", "body"]
Headers = list[tuple[bytes, bytes]]

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one connection may take: time for the head and the body, head bytes, and company."""

    header_timeout: float
    body_timeout: float
    max_header_bytes: int
    max_connections: int


def error_response(error: LlmdError) -> tuple[int, Headers, bytes]:
    """Status, headers and OpenAI-shaped JSON body for `error`, closing the connection."""
    body = _encoder.encode(error_body(error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    headers += [(name.lower().encode(), value.encode()) for name, value in error.headers().items()]
    return error.status, headers, body


def raw_response(error: LlmdError, default_headers: Headers) -> bytes:
    """`error` as the bytes of a whole HTTP/1.1 response, for writing straight to the socket."""
    status, headers, body = error_response(error)
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
    lines += [name + b": " + value + b"\r\n" for name, value in [*default_headers, *headers]]
    return b"".join([*lines, b"\r\n", body])


def refusal_app(error: LlmdError) -> ASGI3Application:
    """An ASGI app that answers every request with `error`."""
    status, headers, body = error_response(error)

    async def refuse(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return refuse


def carried(app: ASGI3Application, arrival: Arrival) -> ASGI3Application:
    """`app` serving the request `arrival` counts: its encode takes the count over, else its end ends it."""
    async def run(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        carry(arrival)
        try:
            await app(scope, receive, send)
        finally:
            arrival.end()

    return run


def close_delimited(app: ASGI3Application, cycle: RequestResponseCycle) -> ASGI3Application:
    """`app` answering an HTTP/1.0 request: an unsized body is not chunked; the close ends it.

    uvicorn writes a body either chunked or against a Content-Length, so each body message is
    declared as the next part of a sized body (one byte more while more follow), and the
    connection, which HTTP/1.0 never keeps alive, closes after the last.
    """
    unsized = False

    async def send_close_delimited(message: ASGISendEvent, send: ASGISendCallable) -> None:
        nonlocal unsized
        if message["type"] == "http.response.start":
            unsized = all(name.lower() != b"content-length" for name, _ in message.get("headers", ()))
            if unsized:
                cycle.chunked_encoding = False
        elif message["type"] == "http.response.body" and unsized:
            more_body = bool(message.get("more_body", False))
            cycle.expected_content_length = len(message.get("body", b"")) + more_body
        await send(message)

    async def run(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        await app(scope, receive, lambda message: send_close_delimited(message, send))

    return run


def body_writer(cycle: RequestResponseCycle) -> BodyWriter:
    """Writes bytes at once as the next chunk of `cycle`'s chunked body, as uvicorn's `send` of a
    body message would, or returns False having written nothing: the response not started, not
    chunked (HTTP/1.0) or complete, the client gone, or its socket full (uvicorn's flow control
    paused writing; the caller's ASGI send then waits for the client like any other)."""

    def write(data: bytes) -> bool:
        if not body_open(cycle):
            return False
        cycle.transport.write(chunk_frame(data))
        return True

    return write


def body_open(cycle: RequestResponseCycle) -> bool:
    """Whether a chunk may go now: the headers out, the body chunked and not ended, the client
    there and reading (uvicorn's flow control not paused)."""
    return bool(cycle.response_started and cycle.chunked_encoding and not cycle.response_complete
                and not cycle.disconnected and not cycle.flow.write_paused)


def chunk_frame(data: bytes) -> bytes:
    """`data` framed as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class SocketWriter:
    """A chunked body written from another thread straight to the connection's socket (api/sse.py's
    `BodySocket`): a streamed token costs the event loop nothing.

    The descriptor is a duplicate, so it stays the same connection's even when uvicorn closes
    its own and the number is reused (a late write meets a closed connection, never another
    client's); a streamed response holds it, one descriptor more, until it ends. A chunk goes
    only when uvicorn has nothing of its own waiting to go (its buffer empty, not paused, the
    connection not half-closed and probed) and the response is between its headers and its end.
    What the socket does not take at once goes from the loop, first (`_catch_up`); until then
    nothing else is written here.
    """

    def __init__(self, cycle: RequestResponseCycle, protocol: LimitedHttpProtocol) -> None:
        self.lock = threading.Lock()
        self._cycle = cycle
        self._protocol = protocol
        self._fd: int | None = None
        self._behind = False

    def open(self) -> bool:
        transport = self._cycle.transport
        sock = transport.get_extra_info("socket")
        # (a TLS connection's socket carries records, not the body: its chunks go by the loop)
        if self._fd is None and not transport.is_closing() and sock is not None \
                and transport.get_extra_info("sslcontext") is None:
            try:
                self._fd = os.dup(sock.fileno())
            except OSError:  # out of descriptors: this response is written by the loop
                return False
            self._protocol.socket_writer = self
        return self._fd is not None

    def ready(self) -> bool:
        return self._fd is not None and not self._behind and not self._protocol.half_closed \
            and body_open(self._cycle) and self._cycle.transport.get_write_buffer_size() == 0

    def write(self, data: bytes) -> None:
        assert self._fd is not None
        frame = chunk_frame(data)
        try:
            written = os.write(self._fd, frame)
        except BlockingIOError:
            written = 0
        except OSError:  # the client is gone: the loop hears it from the connection and ends the response
            return
        if written < len(frame):
            self._behind = True
            self._protocol.loop.call_soon_threadsafe(self._catch_up, frame[written:])

    def _catch_up(self, rest: bytes) -> None:
        with self.lock:
            if not self._cycle.transport.is_closing():
                self._cycle.transport.write(rest)
            self._behind = False

    @property
    def behind(self) -> bool:
        """Whether part of a chunk waits for `_catch_up`."""
        return self._behind

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._protocol.socket_writer is self:
            self._protocol.socket_writer = None


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, held to `limits` (see the module docstring)."""

    limits: ClassVar[ConnectionLimits]
    arrivals: ClassVar[Callable[[], Arrival] | None] = None  # the engine's count of requests on their way
    arrival: Arrival | None = None  # this connection's request being read, or the connection itself
    arrival_bound_s: ClassVar[float] = BOUND_SECONDS  # counted no longer than a gathering waits
    phase: Phase = "idle"
    head_bytes = 0
    deadline: asyncio.TimerHandle | None = None
    lingering = False
    over_limit = False
    half_closed = False  # the client sent EOF and the connection is being probed
    socket_writer: SocketWriter | None = None  # the streamed response writing from another thread

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.over_limit = len(self.connections) > self.limits.max_connections
        self._arm(self.limits.header_timeout)  # a connection that never sends a byte is closed too
        self._arriving()  # clients that start together open connections together

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._arrived()
        super().connection_lost(exc)

    def _arriving(self) -> None:
        """Count what this connection reads next as a request arriving, for `arrival_bound_s` at most."""
        arrivals = type(self).arrivals  # read off the class: a function there is no method
        if arrivals is not None and (self.arrival is None or not self.arrival.counted):
            self.arrival = arrivals()
            self.loop.call_later(self.arrival_bound_s, self.arrival.end)

    def _arrived(self) -> None:
        """This connection's request (if still counted here) will not reach an encode: no longer count it."""
        arrival, self.arrival = self.arrival, None
        if arrival is not None:
            arrival.end()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        if self.phase != "body":
            self.head_bytes += len(data)
        super().data_received(data)
        if self.phase == "head" and self.head_bytes > self.limits.max_header_bytes:
            self.refuse(self._head_too_large())
        elif self.deadline is None and self.phase != "idle" and not self.lingering:
            self._arm(self.limits.header_timeout if self.phase == "head" else self.limits.body_timeout)

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's contract; uvicorn says None
        """The client half-closed: finish the response to its whole request, then close.

        A client that closed outright looks the same until we write, so the connection is
        probed (`_probe`, now and at `PROBE_DELAYS`): a gone client's kernel answers the first
        write with a reset, the next then fails, and the request is aborted as before.
        HTTP/1.0 has no 1xx to probe with, so its EOF still means gone.
        """
        cycle = self.cycle
        if self.lingering or self.phase != "idle" or cycle is None or cycle.response_complete or \
                cycle.scope["http_version"] == "1.0":
            return False
        cycle.keep_alive = False
        self.half_closed = True
        self._probe()
        for delay in PROBE_DELAYS:
            self.loop.call_later(delay, self._probe)
        return True  # keeps our sending side open

    def _probe(self) -> None:
        """Write something the client skips: a 1xx before the response, an SSE comment in a stream.

        A stream that writes nothing for a while (one waiting in the queue) would otherwise
        keep a gone client's place. llmd's only chunked bodies are SSE, where a `:` line is
        a comment; it goes between the app's writes, each of which is whole events.
        """
        cycle, writer = self.cycle, self.socket_writer
        with writer.lock if writer is not None else contextlib.nullcontext():  # not inside its chunk
            if self.transport.is_closing() or cycle is None or cycle.response_complete or \
                    (writer is not None and writer.behind):
                return
            if not cycle.response_started:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            elif cycle.chunked_encoding:
                self.transport.write(b"3\r\n:\n\n\r\n")

    def send_400_response(self, msg: str) -> None:
        if not self.lingering:  # else a refusal made inside a parser callback already answered
            self.refuse(InvalidRequest("invalid HTTP request: the server could not parse it",
                                       code="invalid_http_request"))

    def on_message_begin(self) -> None:
        self.phase = "head"
        self._arriving()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > \
                self.limits.max_header_bytes:
            error = self._head_too_large()
            self.refuse(error)
            raise error  # stops the parser; its error handler sees that we have answered
        self.phase = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self.phase, self.head_bytes = "idle", 0
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        if self.arrival is not None and cycle.scope["method"] == "POST" and not self.over_limit:
            app, self.arrival = carried(app, self.arrival), None  # every POST generates: its encode counts on
        self._arrived()  # anything else is counted no longer
        if self.over_limit:
            app = refusal_app(Overloaded(f"more than {self.limits.max_connections} connections are "
                                         "open; retry shortly", retry_after=1, code="too_many_connections"))
        elif cycle.scope["http_version"] == "1.0":
            app = close_delimited(app, cycle)
        else:
            cycle.scope.setdefault("extensions", {})[BODY_WRITER] = {
                "write": body_writer(cycle), BODY_SOCKET: SocketWriter(cycle, self)}
        super()._start_asgi_task(cycle, app)

    def refuse(self, error: LlmdError) -> None:
        """Answer `error` on the raw connection, then drop its input for a moment and close."""
        if self.lingering or self.transport.is_closing():
            return
        log.info("%s: %s %s", self._peer(), error.status, error.message)
        self.lingering = True
        self._arrived()
        self._disarm()
        self.transport.write(raw_response(error, self.server_state.default_headers))
        self.transport.write_eof()
        self.deadline = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _deadline_passed(self) -> None:
        self.deadline = None
        if self.phase == "head":
            self.refuse(RequestTimeout(
                f"the request head did not arrive within {self.limits.header_timeout:g} s"))
        elif self.phase == "body" and not self.cycle.response_started:
            self.refuse(RequestTimeout(
                f"the request body did not arrive within {self.limits.body_timeout:g} s"))
        else:
            self.transport.close()

    def _head_too_large(self) -> HeaderTooLarge:
        return HeaderTooLarge(f"the request line and headers exceed {self.limits.max_header_bytes} bytes")

    def _arm(self, seconds: float) -> None:
        self.deadline = self.loop.call_later(seconds, self._deadline_passed)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "client"


def connection_protocol(settings: Settings, arrivals: Callable[[], Arrival] | None = None
                        ) -> type[LimitedHttpProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, carrying the settings' limits and the
    engine's count of requests on their way (`arrivals`: `ServedEngine.arrival`).

    uvicorn builds one protocol per connection and passes it no options of ours, so they
    ride on a subclass. The soft descriptor limit is raised to the hard one first, and
    `max_connections` is held under it, so connections cannot take the descriptors the
    daemon itself needs.
    """
    limits = ConnectionLimits(settings.header_timeout, settings.body_timeout,
                              settings.max_header_bytes, min(settings.max_connections, connection_room()))
    if limits.max_connections < settings.max_connections:
        log.warning("max_connections %d lowered to %d: the descriptor limit (ulimit -n) is %d",
                    settings.max_connections, limits.max_connections, limits.max_connections + FD_RESERVE)
    return type("LlmdHttpProtocol", (LimitedHttpProtocol,), {"limits": limits, "arrivals": arrivals})


def connection_room() -> int:
    """How many connections fit under the descriptor limit, after raising it as far as allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # e.g. an unlimited hard limit the kernel will not grant; keep the soft one
    return max(1, soft - FD_RESERVE)
