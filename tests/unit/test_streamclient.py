"""The bench's HTTP/1.1 client against scripted raw-socket servers on loopback."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from llmd.bench.client import Origin, StreamClient, TransportError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def run_async(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """A plain test that runs the scenario `test` in a fresh event loop."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


@dataclass
class Scripted:
    """A loopback server running `handler` per connection, numbering connections from 0."""

    base_url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


async def read_request(reader: asyncio.StreamReader, seen: list[bytes]) -> bytes:
    """One request's head and body (by Content-Length), recorded in `seen`."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    request = head + await reader.readexactly(length)
    seen.append(request)
    return request


@asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[Scripted]:
    state = Scripted("")

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = state.connections
        state.connections += 1
        try:
            await handler(reader, writer, number)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    state.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    async with server:
        yield state


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def routed(answers: dict[bytes, bytes], otherwise: bytes) -> Handler:
    """A keep-alive handler answering each request by the first path fragment it contains."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader, [])
            writer.write(next((a for path, a in answers.items() if path in request), otherwise))

    return handler


def sized(body: bytes, status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def chunk(piece: bytes) -> bytes:
    return f"{len(piece):x}\r\n".encode() + piece + b"\r\n"


def test_origin_parsing() -> None:
    plain = Origin.parse("http://127.0.0.1:8000/v1/")
    assert (plain.host, plain.port, plain.prefix, plain.host_header) == (
        "127.0.0.1", 8000, "/v1", "127.0.0.1:8000")
    secure = Origin.parse("https://api.example.com/v1")
    assert (secure.port, secure.host_header) == (443, "api.example.com")
    assert Origin.parse("http://[::1]:9000").host_header == "[::1]:9000"
    assert Origin.parse("http://localhost").prefix == ""
    for bad in ("ftp://host/v1", "localhost:8000/v1", "http:///v1"):
        with pytest.raises(ValueError):
            Origin.parse(bad)


@run_async
async def test_keep_alive_reuses_one_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            request = await read_request(reader, state.requests)
            writer.write(sized(b"echo " + request.split(b" ")[1]))

    async with scripted(handler) as state, StreamClient(state.base_url, {"X-Key": "k"}) as client:
        first = await client.request("GET", "/models")
        second = await client.request("POST", "/chat/completions", b'{"a": 1}')
    assert (first.status, first.text, second.text) == (200, "echo /v1/models", "echo /v1/chat/completions")
    assert state.connections == 1
    head = state.requests[1].decode()
    assert "Host: 127.0.0.1:" in head and "X-Key: k\r\n" in head
    assert "Content-Length: 8\r\n" in head and head.endswith('{"a": 1}')


@run_async
async def test_sink_gets_each_piece_as_it_arrives() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader, state.requests)
        writer.write(CHUNKED + chunk(b"data: 1\n\n"))
        await release.wait()  # the rest waits until the client has seen the first event
        writer.write(chunk(b"data: 2\n\n") + b"0\r\n\r\n")

    seen: list[bytes] = []

    def sink(piece: bytes) -> bool:
        seen.append(piece)
        release.set()
        return False

    async with scripted(handler) as state, StreamClient(state.base_url) as client:
        reply = await asyncio.wait_for(client.request("POST", "/x", b"{}", sink), 10)
    assert reply.status == 200 and reply.body == b""
    assert b"".join(seen) == b"data: 1\n\ndata: 2\n\n" and seen[0] == b"data: 1\n\n"


@run_async
async def test_sink_can_stop_early_and_errors_are_buffered() -> None:
    handler = routed({b"/busy": sized(b'{"error": "overloaded"}', "503 Service Unavailable")},
                     CHUNKED + chunk(b"stop"))

    calls: list[bytes] = []

    def stop_at_once(piece: bytes) -> bool:
        calls.append(piece)
        return True

    async with scripted(handler) as state, StreamClient(state.base_url) as client:
        busy = await client.request("POST", "/busy", b"{}", stop_at_once)
        stopped = await asyncio.wait_for(client.request("POST", "/s", b"{}", stop_at_once), 10)
        again = await client.request("POST", "/busy", b"{}")
    assert (busy.status, busy.text) == (503, '{"error": "overloaded"}')
    assert stopped.status == 200 and calls == [b"stop"]  # the sink saw no error body
    assert again.status == 503
    assert state.connections == 2  # the stopped exchange's connection was not reused


@run_async
async def test_body_delimited_by_close() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader, state.requests)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart one, ")
        await writer.drain()
        writer.write(b"part two")

    async with scripted(handler) as state, StreamClient(state.base_url) as client:
        reply = await asyncio.wait_for(client.request("GET", "/models"), 10)
        assert reply.text == "part one, part two"
        reply = await asyncio.wait_for(client.request("GET", "/models"), 10)
    assert state.connections == 2


@run_async
async def test_stale_pooled_connection_is_retried_once() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await read_request(reader, state.requests)
        writer.write(sized(f"connection {number}".encode()))
        if number == 0:
            await read_request(reader, state.requests)  # then close without answering
            return
        await reader.read()

    async with scripted(handler) as state, StreamClient(state.base_url) as client:
        assert (await client.request("GET", "/a")).text == "connection 0"
        assert (await asyncio.wait_for(client.request("GET", "/b"), 10)).text == "connection 1"
    assert len(state.requests) == 3 and state.connections == 2


@run_async
async def test_failures_raise_transport_errors() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        request = await read_request(reader, state.requests)
        if b"/garbage" in request:
            writer.write(b"SPDY/9 banana\r\n\r\n")
        else:  # a chunked body cut off before its last chunk
            writer.write(CHUNKED + chunk(b"half"))
        await writer.drain()

    async with scripted(handler) as state, StreamClient(state.base_url) as client:
        with pytest.raises(TransportError, match="invalid HTTP"):
            await asyncio.wait_for(client.request("GET", "/garbage"), 10)
        with pytest.raises(TransportError, match="closed mid-response"):
            await asyncio.wait_for(client.request("GET", "/cut"), 10)


@run_async
async def test_refused_connection_is_an_os_error() -> None:
    async with scripted(lambda *_: asyncio.sleep(0)) as state:
        base_url = state.base_url
    with pytest.raises(OSError):
        async with StreamClient(base_url) as client:
            await client.request("GET", "/models")


@run_async
async def test_cancelled_exchange_closes_its_connection() -> None:
    handler = routed({b"/slow": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little"},
                     sized(b"fine"))

    async with scripted(handler) as state, StreamClient(state.base_url) as client:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.request("GET", "/slow")
        assert (await asyncio.wait_for(client.request("GET", "/ok"), 10)).text == "fine"
    assert state.connections == 2
