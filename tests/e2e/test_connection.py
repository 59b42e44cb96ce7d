"""End to end: the HTTP connection's limits and edge cases on a real `llmd serve`, over raw sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmd.api.connection import FD_RESERVE, connection_protocol
from llmd.config import Settings, load_settings
from llmd.errors import ConfigError
from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.waiting import wait_until

WAIT = 60.0  # the most any test waits for the server to answer or close; never a pass condition
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}


@pytest.mark.parametrize("line", ["header_timeout: 0", "body_timeout: -1", "max_header_bytes: 100",
                                  "max_connections: 0"])
def test_connection_settings_are_validated(tmp_path: Path, line: str) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=f"key `{line.split(':')[0]}`"):
        load_settings(path, {})


def test_max_connections_stays_under_the_descriptor_limit() -> None:
    import resource

    limits = connection_protocol(Settings(max_connections=10**9)).limits
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert limits.max_connections == soft - FD_RESERVE
    assert soft == hard or hard == resource.RLIM_INFINITY  # raised as far as the kernel allows


def serve_with(tmp: Path, tiny_model: Path, settings: str) -> Daemon:
    config = tmp / "settings.yaml"
    config.write_text(settings)
    return start_daemon(tmp, "--config", str(config), "--model", str(tiny_model),
                        "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def impatient(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon that gives a request head and a body two seconds each."""
    running = serve_with(tmp_path_factory.mktemp("impatient"), tiny_model,
                         "header_timeout: 2\nbody_timeout: 2\n")
    yield running
    assert running.stop() == 0, running.log()


def connect(daemon: Daemon) -> socket.socket:
    return socket.create_connection(("127.0.0.1", daemon.port), timeout=WAIT)


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed within WAIT."""
    received = bytearray()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            return bytes(received)
        received += chunk
    pytest.fail(f"the server did not close the connection within {WAIT} s; got {bytes(received[:200])!r}")


def split(response: bytes) -> tuple[str, dict[str, str], bytes]:
    """Status line, headers (lower-case names) and body of one raw HTTP response."""
    while response.startswith(b"HTTP/1.1 1"):  # interim responses
        response = response.partition(b"\r\n\r\n")[2]
    head, _, body = response.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status, {name.lower(): value for name, value in headers.items()}, body


def assert_openai_error(response: bytes, status: int, code: str) -> dict[str, str]:
    line, headers, body = split(response)
    assert line.startswith(f"HTTP/1.1 {status} "), response[:300]
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    return headers


def post(path: str, body: object, *, version: str = "1.1") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def test_a_partial_request_head_is_answered_408_and_closed(impatient: Daemon) -> None:
    with connect(impatient) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert_openai_error(read_to_close(sock), 408, "request_timeout")


def test_a_partial_body_is_answered_408_and_closed(impatient: Daemon) -> None:
    with connect(impatient) as sock:
        sock.sendall(post("/v1/chat/completions", CHAT)[:-5])
        assert_openai_error(read_to_close(sock), 408, "request_timeout")


def test_a_silent_connection_is_closed(impatient: Daemon) -> None:
    with connect(impatient) as sock:
        assert read_to_close(sock) == b""


def test_a_100_kib_header_is_431(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100 * 1024 + b"\r\n\r\n")
        headers = assert_openai_error(read_to_close(sock), 431, "request_header_too_large")
    assert headers["connection"] == "close"


def test_a_header_sent_in_small_pieces_is_431_before_it_ends(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        for _ in range(200):  # 200 KiB at most, but the server refuses after 64
            try:
                sock.sendall(b"a" * 1024)
            except (BrokenPipeError, ConnectionResetError):
                break
        assert_openai_error(read_to_close(sock), 431, "request_header_too_large")


def test_garbage_is_a_400_in_the_openai_shape(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"\x00\x01 not http at all\r\n\r\n")
        assert_openai_error(read_to_close(sock), 400, "invalid_http_request")


@pytest.mark.parametrize("stream", [False, True])
def test_a_half_closed_request_still_gets_its_response(daemon: Daemon, stream: bool) -> None:
    with connect(daemon) as sock:
        sock.sendall(post("/v1/chat/completions", CHAT | {"stream": stream}))
        sock.shutdown(socket.SHUT_WR)
        line, _, body = split(read_to_close(sock))
    assert line.startswith("HTTP/1.1 200 "), (line, body[:300])
    if stream:
        assert body.endswith(b"0\r\n\r\n") and b"data: [DONE]\n\n" in body
    else:
        assert json.loads(body)["choices"][0]["message"]["content"]


def test_http_1_0_streams_are_close_delimited(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(post("/v1/chat/completions", CHAT | {"stream": True}, version="1.0"))
        line, headers, body = split(read_to_close(sock))
    assert line.endswith(" 200 OK"), line
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"] == "close"
    events = body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], events[-3:]
    assert all(event.startswith("data: ") for event in events[:-1])


def test_http_1_0_sized_responses_keep_their_length(daemon: Daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        _, headers, body = split(read_to_close(sock))
    assert int(headers["content-length"]) == len(body) and json.loads(body)


def test_keep_alive_sdk_streams_still_work(daemon: Daemon) -> None:
    with openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0) as sdk:
        for _ in range(3):  # one connection, kept alive between the streams
            chunks = list(sdk.chat.completions.create(model="tiny", messages=CHAT["messages"],
                                                      max_tokens=8, stream=True))
            assert chunks[-1].choices[0].finish_reason == "length"


def test_past_max_connections_a_request_is_503_and_health_returns(tiny_model: Path, tmp_path: Path) -> None:
    capped = serve_with(tmp_path, tiny_model, "max_connections: 1\n")
    try:
        with admitted_stream(capped):
            with connect(capped) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                headers = assert_openai_error(read_to_close(sock), 503, "too_many_connections")
            assert int(headers["retry-after"]) >= 1
        health = f"{capped.url}/health"
        wait_until("healthy again", lambda: httpx.get(health, timeout=WAIT).status_code == 200, WAIT)
    finally:
        assert capped.stop() == 0, capped.log()


@contextlib.contextmanager
def admitted_stream(daemon: Daemon) -> Iterator[socket.socket]:
    """Hold the daemon's one connection with a long stream, once earlier connections have left."""
    def admitted() -> socket.socket | None:
        sock = connect(daemon)
        sock.sendall(post("/v1/chat/completions", CHAT | {"stream": True, "max_tokens": 4000}))
        if sock.recv(12).startswith(b"HTTP/1.1 200"):
            return sock
        sock.close()  # refused while the readiness probe's connection was still counted
        return None

    with wait_until("a connection admitted", admitted, WAIT) as sock:
        yield sock


