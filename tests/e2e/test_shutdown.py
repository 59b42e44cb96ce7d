"""Stop signals drain: /ready 503, new requests 503 + Retry-After, running requests finish or
end with `shutting_down` (a stream's last event, then [DONE]; a 503 without one), exit 0.

Nothing here waits on time: each step waits for a condition (the engine's /stats, /ready)
under a generous deadline, and what must still be running when the test probes is held
open by the test itself or cut at once (drain_timeout 0).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.waiting import wait_until

DEADLINE = 120.0  # generous: the suite must pass with every core busy
LONG = 4000  # tokens no request can generate before the test acts on it


def chat(max_tokens: int, stream: bool) -> dict:
    return {"model": "tiny", "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Tell me everything."}]}


def start_drain_daemon(tmp_path: Path, tiny_model: Path, drain_timeout: float) -> Daemon:
    config = tmp_path / "llmd.yaml"
    config.write_text(f"drain_timeout: {drain_timeout}\n")
    return start_daemon(tmp_path, "--model", str(tiny_model), "--served-model-name", "tiny",
                        "--config", str(config))


class Client(threading.Thread):
    """One request in its own thread: a stream's data payloads, or the non-stream response."""

    def __init__(self, daemon: Daemon, max_tokens: int, stream: bool) -> None:
        super().__init__()
        self.daemon, self.body = daemon, chat(max_tokens, stream)
        self.payloads: list[str] = []
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        url = f"{self.daemon.base_url}/chat/completions"
        if not self.body["stream"]:
            self.response = httpx.post(url, json=self.body, timeout=DEADLINE)
            return
        with httpx.stream("POST", url, json=self.body, timeout=DEADLINE) as response:
            assert response.status_code == 200
            self.payloads = [line.removeprefix("data: ") for line in response.iter_lines()
                             if line.startswith("data: ")]

    def finished(self) -> list[dict]:
        """The stream's JSON payloads, after checking it ended with [DONE]."""
        self.join(timeout=DEADLINE)
        assert self.payloads and self.payloads[-1] == "[DONE]", self.payloads[-3:]
        return [json.loads(p) for p in self.payloads[:-1]]


class HeldStream:
    """A stream whose reader does not read until `release`: its request cannot finish first.

    The socket takes only a few KiB, so the daemon's handler blocks writing and the engine's
    drain waits for it.
    """

    def __init__(self, daemon: Daemon, max_tokens: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", daemon.port))
        body = json.dumps(chat(max_tokens, stream=True)).encode()
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Type: application/json\r\nConnection: close\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def release(self) -> list[dict]:
        """Read the rest; the stream's JSON payloads, after checking it ended with [DONE]."""
        events = self.events()
        assert events and events[-1] == b"[DONE]", events[-3:]
        return [json.loads(e) for e in events[:-1]]

    def events(self) -> list[bytes]:
        """Read until the daemon closes the connection; the `data:` payloads that arrived."""
        self.sock.settimeout(DEADLINE)
        received = bytearray()
        with self.sock, contextlib.suppress(ConnectionResetError):
            while chunk := self.sock.recv(1 << 16):
                received += chunk
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        return [e.removeprefix(b"data: ") for e in dechunk(body).split(b"\n\n") if e.startswith(b"data: ")]


def dechunk(body: bytes) -> bytes:
    """The payload of a `Transfer-Encoding: chunked` body."""
    payload = bytearray()
    while body:
        size, _, rest = body.partition(b"\r\n")
        if not rest:
            break  # cut off mid-chunk
        length = int(size, 16)
        payload += rest[:length]
        body = rest[length + 2:]
        if length == 0:
            break
    return bytes(payload)


def engine_holds(daemon: Daemon, requests: int) -> Callable[[], bool]:
    """A condition: the engine has taken all `requests` and has generated at least that many tokens."""
    def check() -> bool:
        stats = httpx.get(f"{daemon.url}/stats", timeout=10).json()
        taken = stats["running"] + stats["waiting"] + stats["finished"]
        return bool(taken == requests and stats["generated_tokens"] >= requests)
    return check


def is_draining(daemon: Daemon) -> Callable[[], bool]:
    def check() -> bool:
        ready = httpx.get(f"{daemon.url}/ready", timeout=10)
        return ready.status_code == 503 and ready.json()["status"] == "draining"
    return check


def assert_shutting_down(response: httpx.Response | None, message: str) -> None:
    """A 503 `shutting_down` with Retry-After whose message says why."""
    assert response is not None and response.status_code == 503, response
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "shutting_down" and message in error["message"], error


def assert_cut(chunks: list[dict], message: str) -> None:
    """A stream whose last event (before [DONE]) is the `shutting_down` error."""
    error = chunks[-1]["error"]
    assert error["code"] == "shutting_down" and message in error["message"], error
    assert not any("error" in chunk for chunk in chunks[:-1])


def assert_finished(chunks: list[dict]) -> None:
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("error" in chunk for chunk in chunks)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_refuses_new_requests_and_lets_running_ones_finish(
    tiny_model: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    daemon = start_drain_daemon(tmp_path, tiny_model, drain_timeout=600)
    held = HeldStream(daemon, 1000)
    wait_until("generating", engine_holds(daemon, 1), DEADLINE)
    daemon.process.send_signal(stop)
    wait_until("draining", is_draining(daemon), DEADLINE)
    late = httpx.post(f"{daemon.base_url}/chat/completions", json=chat(2, stream=False), timeout=DEADLINE)
    assert_shutting_down(late, "shutting down")
    assert_finished(held.release())
    assert daemon.process.wait(timeout=DEADLINE) == 0, daemon.log()
    if stop == signal.SIGHUP:
        assert "reloads nothing" in daemon.log()


def test_the_drain_timeout_cuts_streams_and_non_stream_requests(tiny_model: Path, tmp_path: Path) -> None:
    daemon = start_drain_daemon(tmp_path, tiny_model, drain_timeout=0)
    streams = [Client(daemon, LONG, stream=True) for _ in range(3)]
    whole = Client(daemon, LONG, stream=False)
    wait_until("generating for all four", engine_holds(daemon, 4), DEADLINE)
    daemon.process.send_signal(signal.SIGTERM)
    for client in streams:
        assert_cut(client.finished(), "drain timeout")
    whole.join(timeout=DEADLINE)
    assert_shutting_down(whole.response, "drain timeout")
    assert daemon.process.wait(timeout=DEADLINE) == 0, daemon.log()
    assert "ended 4 requests with an error event" in daemon.log()


def test_a_second_signal_ends_every_request_at_once_and_exits(tiny_model: Path, tmp_path: Path) -> None:
    daemon = start_drain_daemon(tmp_path, tiny_model, drain_timeout=600)
    held = HeldStream(daemon, LONG)  # may take its last events or be dropped: it is not reading
    streams = [Client(daemon, LONG, stream=True) for _ in range(3)]
    whole = Client(daemon, LONG, stream=False)
    wait_until("generating for all five", engine_holds(daemon, 5), DEADLINE)
    daemon.process.send_signal(signal.SIGTERM)
    wait_until("draining", is_draining(daemon), DEADLINE)
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=DEADLINE) == 0, daemon.log()  # not the 600 s drain
    for client in streams:
        assert_cut(client.finished(), "second stop signal")
    whole.join(timeout=DEADLINE)
    assert_shutting_down(whole.response, "second stop signal")
    events = held.events()
    if events[-1:] == [b"[DONE]"]:
        assert_cut([json.loads(e) for e in events[:-1]], "second stop signal")
    log = daemon.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
