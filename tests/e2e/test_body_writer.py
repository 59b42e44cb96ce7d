"""The connection's body writer (api/connection.py `body_writer`, offered as the `BODY_WRITER`
scope extension): on real uvicorn with llmd's protocol, bytes it writes arrive as the response
body's next chunks, between ASGI's own; it refuses before the headers and after the end, and an
HTTP/1.0 request (close-delimited, not chunked) is not offered one."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import httpx

from llmd.api.connection import connection_protocol
from llmd.api.sse import BODY_WRITER
from llmd.config import Settings
from tests.helpers.uvicorn_thread import served_on_loopback


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


def serving(app: WritingApp) -> contextlib.AbstractContextManager[int]:
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
