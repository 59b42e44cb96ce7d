"""The connection's body writer (api/connection.py `body_writer`, offered as the `BODY_WRITER`
scope extension): on real uvicorn with llmd's protocol, bytes it writes arrive as the response
body's next chunks, between ASGI's own; it refuses before the headers and after the end, and an
HTTP/1.0 request (close-delimited, not chunked) is not offered one. Its `socket` (`SocketWriter`)
writes chunks from another thread: a client that stops reading fills the socket, and what it did
not take goes from the loop first, every byte in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from llmd.api.connection import SocketWriter, connection_protocol
from llmd.api.sse import BODY_SOCKET, BODY_WRITER, BodySocket
from llmd.config import Settings
from tests.helpers.uvicorn_thread import served_on_loopback
from tests.helpers.waiting import wait_until


class WritingApp:
    """Answers every request with a body written partly through the writer; notes what it said."""

    def __init__(self) -> None:
        self.results: list[tuple[bool, ...]] = []
        self.offered: list[bool] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        writer = (scope.get("extensions") or {}).get(BODY_WRITER)
        self.offered.append(writer is not None)
        write = writer["write"] if writer is not None else (lambda data: False)
        early = write(b"too early\n")
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"one\n", "more_body": True})
        middle = write(b"two\n") and write(b"three\n")
        await send({"type": "http.response.body", "body": b"four\n", "more_body": False})
        self.results.append((early, middle, write(b"too late\n")))


class ThreadWritingApp:
    """Sends its headers and a first chunk by ASGI, then has another thread write numbered chunks
    through the socket, each once the socket is `ready`, until it has found the socket full
    (`filled`) and written `after` more; its last chunk goes by ASGI."""

    def __init__(self, after: int = 50) -> None:
        self.after = after
        self.filled = threading.Event()
        self.chunks: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        sock: BodySocket = scope["extensions"][BODY_WRITER][BODY_SOCKET]
        with sock.lock:
            assert not sock.ready()  # no headers yet
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        assert sock.open()
        await asyncio.to_thread(self._write_all, sock)
        with sock.lock:
            sock.close()
            assert not sock.ready()
        await send({"type": "http.response.body", "body": b"last\n", "more_body": False})

    def _write_all(self, sock: BodySocket) -> None:
        left = self.after
        while left:
            chunk = b"%08d" % len(self.chunks) + b"x" * 4088 + b"\n"
            with sock.lock:
                assert sock.ready()
                sock.write(chunk)
                self.chunks.append(chunk)
                left -= self.filled.is_set()
            if not self._ready(sock):  # what the socket did not take waits for the loop
                self.filled.set()
                wait_until("the socket writable again", lambda: self._ready(sock), timeout=120)

    @staticmethod
    def _ready(sock: BodySocket) -> bool:
        with sock.lock:
            return sock.ready()


def serving(app: Any) -> contextlib.AbstractContextManager[int]:
    """`app` on real uvicorn with llmd's connection protocol, on a loopback port (yielded)."""
    return served_on_loopback(app, http=connection_protocol(Settings()))


def test_written_chunks_arrive_in_order_between_asgi_s_and_only_while_the_body_is_open() -> None:
    app = WritingApp()
    with serving(app) as port, httpx.Client() as client:
        first = client.get(f"http://127.0.0.1:{port}/")
        second = client.get(f"http://127.0.0.1:{port}/")  # the same kept-alive connection
    for reply in (first, second):
        assert reply.status_code == 200 and reply.headers["transfer-encoding"] == "chunked"
        assert reply.text == "one\ntwo\nthree\nfour\n"
    assert app.offered == [True, True]
    assert app.results == [(False, True, False)] * 2


def test_an_http_1_0_request_is_offered_no_writer() -> None:
    app = WritingApp()
    with serving(app) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\none\nfour\n")
    assert app.offered == [False]


def test_chunks_written_from_another_thread_fill_the_socket_and_arrive_whole_and_in_order() -> None:
    app = ThreadWritingApp()
    with serving(app) as port, socket.socket() as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing yet
        conn.connect(("127.0.0.1", port))
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until("the socket full", app.filled.is_set, timeout=120)
        reply = b""
        while not reply.endswith(b"0\r\n\r\n"):
            chunk = conn.recv(65536)
            assert chunk, "the connection closed before the body's end"
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    assert dechunked(body) == b"first\n" + b"".join(app.chunks) + b"last\n"
    assert len(app.chunks) > app.after


def dechunked(body: bytes) -> bytes:
    """A chunked body's content; fails on a malformed frame (a chunk cut or interleaved)."""
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        assert body[size : size + 2] == b"\r\n", "a chunk's frame is broken"
        out, body = out + body[:size], body[size + 2 :]


class StubTransport:
    """What `SocketWriter.open` asks of a transport: its socket, and whether TLS wraps it."""

    def __init__(self, sock: socket.socket, tls: bool) -> None:
        self.extra = {"socket": sock, "sslcontext": ssl.create_default_context() if tls else None}

    def get_extra_info(self, name: str) -> Any:
        return self.extra.get(name)

    def is_closing(self) -> bool:
        return False


def test_a_tls_connection_is_never_written_around_its_records_and_a_closed_writer_lets_go() -> None:
    left, right = socket.socketpair()
    with left, right:
        for tls in (True, False):
            protocol = SimpleNamespace(socket_writer=None)
            cycle = SimpleNamespace(transport=StubTransport(left, tls))
            writer = SocketWriter(cycle, protocol)  # type: ignore[arg-type]
            assert writer.open() is (not tls) and (protocol.socket_writer is writer) is (not tls)
            with writer.lock:
                fd = writer._fd
                writer.close()
            if fd is not None:  # the duplicate is closed, the connection's own descriptor is not
                with pytest.raises(OSError):
                    os.fstat(fd)
                os.fstat(left.fileno())
            assert protocol.socket_writer is None
