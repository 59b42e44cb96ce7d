"""sd_notify on real unix datagram sockets: the bytes systemd reads, the watchdog's cadence and silence."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmd.engine.heartbeat import Heartbeat
from llmd.engine.types import EngineStats
from llmd.service.notify import (
    EngineHealth,
    Notifier,
    ServingStatus,
    Watchdog,
    engine_status,
    notify_address,
    report_status,
    watchdog_interval,
)


@dataclass
class Listener:
    """The systemd side: a bound datagram socket and the NOTIFY_SOCKET value naming it."""

    sock: socket.socket
    env_value: str

    def receive(self, wait: float = 1.0) -> bytes:
        """The next datagram; fails the test when none arrives within `wait` seconds."""
        self.sock.settimeout(wait)
        return self.sock.recv(4096)


    def notifier(self) -> Notifier:
        return Notifier.from_environ({"NOTIFY_SOCKET": self.env_value})

    def assert_silent(self) -> None:
        """Nothing was sent so far: a marker sent now is the next datagram to arrive.

        Datagrams on one socket arrive in the order they were sent, so this proves silence
        without waiting for a quiet interval to pass.
        """
        self.notifier().status("marker")
        assert self.receive(30.0) == b"STATUS=marker"


@pytest.fixture
def path_listener(tmp_path: Path) -> Iterator[Listener]:
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        yield Listener(sock, str(path))


@pytest.fixture
def abstract_listener() -> Iterator[Listener]:
    name = f"llmd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        yield Listener(sock, "@" + name)


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest) -> Listener:
    return request.getfixturevalue(f"{request.param}_listener")


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def running(watchdog: Watchdog) -> Iterator[Watchdog]:
    watchdog.start()
    try:
        yield watchdog
    finally:
        watchdog.stop()


# --- the messages --------------------------------------------------------------------------


@pytest.mark.parametrize(("send", "expected"), [
    (lambda n: n.ready(), b"READY=1"),
    (lambda n: n.ready("serving: 0 running"), b"READY=1\nSTATUS=serving: 0 running"),
    (lambda n: n.status("loading Qwen2.5-7B"), b"STATUS=loading Qwen2.5-7B"),
    (lambda n: n.status("two\nlines"), b"STATUS=two lines"),
    (lambda n: n.stopping(), b"STOPPING=1"),
    (lambda n: n.stopping("draining: 2 running"), b"STOPPING=1\nSTATUS=draining: 2 running"),
    (lambda n: n.watchdog(), b"WATCHDOG=1"),
    (lambda n: n.extend_timeout(2.5), b"EXTEND_TIMEOUT_USEC=2500000"),
])
def test_each_message_arrives_as_one_datagram_with_exact_bytes(listener: Listener, send, expected) -> None:
    notifier = listener.notifier()
    assert notifier.enabled
    assert send(notifier) is True
    assert listener.receive() == expected


def test_status_text_is_utf8(path_listener: Listener) -> None:
    path_listener.notifier().status("서빙 중 ✓")
    assert path_listener.receive() == "STATUS=서빙 중 ✓".encode()


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    notifier = Notifier.from_environ({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.status("x") is False
    assert notifier.watchdog() is False
    assert Watchdog.from_environ(notifier, environ={"WATCHDOG_USEC": "200000"}) is None


def test_a_failed_send_returns_false_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    with caplog.at_level(logging.DEBUG, logger="llmd.notify"):
        assert notifier.ready() is False
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot notify systemd" in warnings[0].getMessage()


@pytest.mark.parametrize(("value", "address"), [
    ("/run/systemd/notify", "/run/systemd/notify"),
    ("@/org/freedesktop/systemd1/notify/123", "\0/org/freedesktop/systemd1/notify/123"),
    ("", None),
    (None, None),
    ("vsock:2:1234", None),
])
def test_notify_address(value: str | None, address: str | None) -> None:
    assert notify_address(value) == address


# --- the watchdog's environment ------------------------------------------------------------


@pytest.mark.parametrize(("environ", "interval"), [
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "4242"}, 0.2),
    ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "4243"}, None),
    ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": ""}, 0.2),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ, pid=4242) == interval


def test_watchdog_interval_defaults_to_this_process() -> None:
    mine = {"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval(mine) == 1.0


def test_a_watchdog_meant_for_another_process_never_pings(path_listener: Listener) -> None:
    environ = {"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert Watchdog.from_environ(path_listener.notifier(), environ=environ) is None


# --- the watchdog thread -------------------------------------------------------------------


def test_the_watchdog_pings_at_start_and_again_every_half_interval(path_listener: Listener) -> None:
    watchdog = Watchdog.from_environ(path_listener.notifier(), environ={"WATCHDOG_USEC": "200000"})
    assert watchdog is not None and watchdog.period == pytest.approx(0.1)
    with running(watchdog):
        pings = [path_listener.receive(30.0), path_listener.receive(30.0)]
    assert pings == [b"WATCHDOG=1", b"WATCHDOG=1"] and watchdog.pings >= 2


def test_a_stalled_step_stops_the_pings_and_finishing_it_resumes_them(path_listener: Listener) -> None:
    clock = FakeClock()
    heartbeat = Heartbeat(clock)
    health = EngineHealth(heartbeat, stall_seconds=10.0)
    watchdog = Watchdog(path_listener.notifier(), 0.1, health)
    heartbeat.step_started()
    clock.advance(9.0)  # busy, within the limit: still pinging
    assert watchdog.tick() is True and path_listener.receive(30.0) == b"WATCHDOG=1"
    clock.advance(2.0)  # busy for 11 s: stalled
    assert watchdog.tick() is False
    path_listener.assert_silent()
    assert health.problem() is not None and "11 s" in health.problem()
    heartbeat.step_finished()
    assert watchdog.tick() is True and path_listener.receive(30.0) == b"WATCHDOG=1"
    assert watchdog.pings == 2


def test_an_idle_worker_is_healthy_however_long_it_waits() -> None:
    clock = FakeClock()
    heartbeat = Heartbeat(clock)
    heartbeat.step_started()
    heartbeat.step_finished()
    clock.advance(3600.0)
    assert heartbeat.busy_for() == 0.0
    assert EngineHealth(heartbeat, stall_seconds=1.0)() is True


def test_a_dead_worker_thread_is_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
    health = EngineHealth(Heartbeat(), alive=worker.is_alive)
    with caplog.at_level(logging.ERROR, logger="llmd.notify"):
        assert health() is False
        assert health() is False
    assert health.problem() == "the engine worker thread has died"
    assert len([r for r in caplog.records if "engine unhealthy" in r.getMessage()]) == 1


def test_a_failing_probe_counts_as_unhealthy(path_listener: Listener) -> None:
    def probe() -> bool:
        raise RuntimeError("probe broke")

    watchdog = Watchdog(path_listener.notifier(), 0.2, probe)
    assert watchdog.tick() is False
    path_listener.assert_silent()


def test_heartbeat_stamps() -> None:
    clock = FakeClock()
    heartbeat = Heartbeat(clock)
    assert heartbeat.busy_since is None and heartbeat.last_step_finished == 1000.0
    heartbeat.step_started()
    clock.advance(0.25)
    assert heartbeat.busy_since == 1000.0 and heartbeat.busy_for() == pytest.approx(0.25)
    heartbeat.step_finished()
    assert heartbeat.busy_since is None and heartbeat.last_step_finished == 1000.25


def test_stopping_the_watchdog_ends_its_thread(path_listener: Listener) -> None:
    watchdog = Watchdog(path_listener.notifier(), 60.0)
    watchdog.start()
    watchdog.stop(timeout=2.0)
    assert not watchdog._thread.is_alive()
    assert path_listener.receive(30.0) == b"WATCHDOG=1"  # the one sent at start
    path_listener.assert_silent()


# --- status lines --------------------------------------------------------------------------


def stats(running: int, waiting: int, generated: int) -> EngineStats:
    return EngineStats(steps=0, running=running, waiting=waiting, finished=0, aborted=0,
                       generated_tokens=generated, prefix_hits=0, prefix_tokens_reused=0)


def test_engine_status_line() -> None:
    assert engine_status(2, 0, 143.24) == "serving: 2 running, 0 waiting, 143.2 tok/s"
    assert engine_status(1, 3, 0.0, phase="draining") == "draining: 1 running, 3 waiting, 0.0 tok/s"


def test_serving_status_measures_tokens_per_second_between_lines() -> None:
    clock, snapshots = FakeClock(), iter([stats(0, 0, 100), stats(2, 1, 400), stats(0, 0, 400)])
    line = ServingStatus(lambda: next(snapshots), clock=clock)
    assert line() == "serving: 0 running, 0 waiting, 0.0 tok/s"
    clock.advance(2.0)
    assert line() == "serving: 2 running, 1 waiting, 150.0 tok/s"
    clock.advance(5.0)
    assert line() == "serving: 0 running, 0 waiting, 0.0 tok/s"


def test_report_status_sends_only_changed_lines(path_listener: Listener) -> None:
    last = "serving: 1 running, 0 waiting, 9.0 tok/s"
    lines = ["loading", "loading", last, last]
    asked: list[str] = []

    def line() -> str:
        asked.append(lines[min(len(asked), len(lines) - 1)])
        return asked[-1]

    async def main() -> None:
        task = asyncio.ensure_future(report_status(path_listener.notifier(), line, every=0.001))
        deadline = time.monotonic() + 30.0
        while len(asked) < len(lines) and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(asked) >= len(lines)
    sent = [path_listener.receive(30.0), path_listener.receive(30.0)]
    assert sent == [b"STATUS=loading", f"STATUS={last}".encode()]
    path_listener.assert_silent()
