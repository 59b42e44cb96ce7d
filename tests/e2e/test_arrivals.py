"""The connection counts each request as arriving at the engine from its connection's accept or its
first byte (api/connection.py, `engine.burst.Arrival`), on real uvicorn with llmd's protocol: a POST
until its handler hands the count to its encode (or returns), anything else until its handler starts,
a connection until it closes, is refused, or the bound passes with nothing sent."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from llmd.api.connection import connection_protocol
from llmd.config import Settings
from llmd.engine.burst import Arrival, hand_over
from tests.helpers.uvicorn_thread import served_on_loopback
from tests.helpers.waiting import wait_until

WAIT = 60.0  # the most a test waits for the server; never a pass condition


class Count:
    """The engine's side: requests counted as arriving now, and every change (from the loop's thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0
        self.changes: list[int] = []

    def change(self, by: int) -> None:
        with self.lock:
            self.total += by
            self.changes.append(by)

    def arrival(self) -> Arrival:
        return Arrival(self.change)


class CountingApp:
    """Notes the count as each request's handler starts and, for a POST to /encode, after it hands
    the count over as an encode does; answers 200 with an empty body."""

    def __init__(self, count: Count) -> None:
        self.count = count
        self.seen: list[tuple[str, int, int | None]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        at_start, after = self.count.total, None
        if scope["path"] == "/encode":
            hand_over()
            after = self.count.total
        self.seen.append((scope["method"], at_start, after))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


@contextlib.contextmanager
def serving(bound_s: float = 600.0, **settings: Any) -> Iterator[tuple[int, Count, CountingApp]]:
    """The app on llmd's protocol counting into a `Count`; an arrival lasts `bound_s` at most."""
    count = Count()
    app = CountingApp(count)
    protocol = connection_protocol(Settings(**settings), count.arrival)
    bounded = type("Bounded", (protocol,), {"arrival_bound_s": bound_s})
    with served_on_loopback(app, http=bounded) as port:
        yield port, count, app


def request(method: str, path: str) -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()


def read_reply(conn: socket.socket) -> bytes:
    reply = b""
    while b"\r\n\r\n" not in reply:  # the head is enough
        chunk = conn.recv(65536)
        assert chunk, "the connection closed before the reply"
        reply += chunk
    return reply


def test_a_connection_counts_until_its_post_encodes_and_each_next_request_from_its_first_byte() -> None:
    with serving() as (port, count, app), socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        wait_until("the accepted connection counted", lambda: count.total == 1, timeout=WAIT)
        conn.sendall(request("POST", "/encode"))
        assert read_reply(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(b"POST /enc")  # the next request's first bytes on the kept-alive connection
        wait_until("the begun request counted", lambda: count.total == 1, timeout=WAIT)
        conn.sendall(request("POST", "/encode")[len(b"POST /enc"):])
        assert read_reply(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(request("POST", "/no-encode"))  # a POST that never encodes: its end ends it
        assert read_reply(conn).startswith(b"HTTP/1.1 200")
        wait_until("nothing counted", lambda: count.total == 0, timeout=WAIT)
    assert app.seen == [("POST", 1, 0), ("POST", 1, 0), ("POST", 1, None)]
    assert count.changes == [+1, -1] * 3


def test_a_get_stops_counting_when_its_handler_starts() -> None:
    with serving() as (port, count, app), socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        conn.sendall(request("GET", "/v1/models"))
        assert read_reply(conn).startswith(b"HTTP/1.1 200")
    assert app.seen == [("GET", 0, None)]
    assert count.changes == [+1, -1]


def test_a_connection_closed_or_refused_before_its_request_counts_no_more() -> None:
    with serving(max_header_bytes=4096) as (port, count, app):
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
            conn.sendall(b"POST /encode HT")
            wait_until("the begun request counted", lambda: count.total == 1, timeout=WAIT)
        wait_until("the closed connection uncounted", lambda: count.total == 0, timeout=WAIT)
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
            conn.sendall(b"POST /encode HTTP/1.1\r\nX-Big: " + b"x" * 8192 + b"\r\n")
            assert read_reply(conn).startswith(b"HTTP/1.1 431")
            assert count.total == 0  # refused: uncounted before the answer, while the connection lingers
    assert app.seen == []
    assert count.changes == [+1, -1] * 2


def test_an_idle_connection_stops_counting_after_the_bound_and_its_later_request_counts_anew() -> None:
    with serving(bound_s=0.05) as (port, count, app), \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        wait_until("the idle connection counted, then not", lambda: count.changes == [+1, -1], timeout=WAIT)
        conn.sendall(request("POST", "/encode"))
        assert read_reply(conn).startswith(b"HTTP/1.1 200")
    assert len(app.seen) == 1 and app.seen[0][2] == 0
    assert count.changes[:2] == [+1, -1] and count.total == 0
