"""The HTTP/1.1 client `llmd bench` measures with: keep-alive connections, httptools' parser.

On a machine with few cores the bench client shares the CPU with the server it measures,
so every cycle it spends per streamed event is taken from the decode it is timing. httpx
(h11, httpcore and anyio, all in Python) spent ~0.48 ms of CPU per SSE event on the 2-core
box llmd was tuned on. Here an `asyncio.Protocol` feeds bytes to httptools' C parser and
hands the body to the caller's sink inside `data_received`: no task wakes per event, and
each event is stamped the moment its bytes arrive.

Proxies, redirects, compression and cookies are deliberately absent: the bench talks to
one OpenAI-compatible base URL directly.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import httptools

# Called with each piece of a successful response's body as it arrives; returning True
# ends the exchange there (the connection is closed, as its rest is left unread).
BodySink = Callable[[bytes], bool]

DEFAULT_PORTS = {"http": 80, "https": 443}


class TransportError(OSError):
    """The connection failed, or the server's reply was not valid HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class Reply:
    """A finished exchange. `body` is empty where a sink took it."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        """The body as text, undecodable bytes replaced."""
        return self.body.decode(errors="replace")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests go: scheme, host, port and the base URL's path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        """The origin of an `http://` or `https://` base URL; anything else is refused."""
        parts = urlsplit(base_url)
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        port = parts.port or DEFAULT_PORTS[parts.scheme]
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        """The Host header: the port only where it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


@dataclass(slots=True)
class _Exchange:
    """One request's response as it is parsed: status, then body to a sink or a buffer."""

    done: asyncio.Future[Reply]
    sink: BodySink | None
    status: int = 0  # set once the headers are in
    framed: bool = False  # Content-Length or chunked; otherwise the close ends the body
    body: bytearray = field(default_factory=bytearray)

    def take(self, piece: bytes) -> bool:
        """Deliver body bytes; True when the sink wants no more."""
        if self.sink is not None and self.status < 400:
            return self.sink(piece)
        self.body += piece
        return False

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(Reply(self.status, bytes(self.body)))

    def fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one exchange at a time."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: _Exchange | None = None
        self._keep_alive = False
        self.closed = False
        self.reused = False
        self.answered = False  # the last exchange saw a response byte: no silent retry

    async def send(self, request: bytes, sink: BodySink | None) -> Reply:
        """Write one request and wait for its whole response (or for the sink to stop)."""
        assert self._transport is not None and self._exchange is None
        if self.closed:
            raise TransportError("connection closed")
        exchange = _Exchange(asyncio.get_running_loop().create_future(), sink)
        self._exchange, self._keep_alive, self.answered = exchange, False, False
        try:
            self._transport.write(request)
            return await exchange.done
        finally:
            self._exchange = None
            if not (exchange.done.done() and not exchange.done.cancelled() and self._keep_alive):
                self.close()  # failed, cancelled or cut short: its rest must not reach the next

    def close(self) -> None:
        """Drop the connection now."""
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None or exchange.done.done():
            self.close()  # bytes nobody asked for
            return
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            exchange.fail(exc.__context__ or exc)
        except httptools.HttpParserError as exc:
            exchange.fail(TransportError(f"invalid HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self._exchange
        if exchange is None:
            return
        if exchange.status and not exchange.framed:
            exchange.finish()  # a body without a length ends where the connection does
        else:
            exchange.fail(TransportError(f"connection closed mid-response ({exc or 'by peer'})"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding") and self._exchange:
            self._exchange.framed = True

    def on_headers_complete(self) -> None:
        if self._exchange is not None:
            self._exchange.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        exchange = self._exchange
        if exchange is not None and not exchange.done.done() and exchange.take(body):
            self._keep_alive = False
            exchange.finish()

    def on_message_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()
        if self._exchange is not None:
            self._exchange.finish()


class StreamClient:
    """Requests to one origin over a pool of keep-alive connections, one per caller at a time."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None) -> None:
        self.origin = Origin.parse(base_url)
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if self.origin.scheme == "https" else None

    async def request(
        self, method: str, path: str, body: bytes = b"", sink: BodySink | None = None
    ) -> Reply:
        """`method` `path` (under the base URL's prefix); a sink streams a 2xx/3xx body."""
        request = self._encode(method, path, body)
        connection = await self._checkout()
        try:
            reply = await connection.send(request, sink)
        except TransportError:
            if not connection.reused or connection.answered:
                raise
            # The server closed an idle connection as we reused it: nothing was answered.
            connection = await self._connect()
            reply = await connection.send(request, sink)
        if not connection.closed:
            connection.reused = True
            self._idle.append(connection)
        return reply

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every idle connection (one in use closes when its exchange ends)."""
        while self._idle:
            self._idle.pop().close()

    def _encode(self, method: str, path: str, body: bytes) -> bytes:
        head = (
            f"{method} {self.origin.prefix}{path} HTTP/1.1\r\n"
            f"Host: {self.origin.host_header}\r\n"
            "User-Agent: llmd-bench\r\n"
            "Accept: application/json, text/event-stream\r\n"
            f"{self._headers}"
        )
        if body or method in ("POST", "PUT"):
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        return head.encode() + b"\r\n" + body

    async def _checkout(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        origin = self.origin
        _, connection = await loop.create_connection(
            _Connection, origin.host, origin.port, ssl=self._ssl,
            server_hostname=origin.host if self._ssl else None,
        )
        return connection

