"""llmd under systemd's eyes: sd_notify on a real datagram socket, the watchdog, /metrics."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmd.engine.types import Request, SamplingParams, StepResult
from llmd.engine.worker import EngineWorker, WorkerHooks
from llmd.errors import EXIT_PREFLIGHT
from llmd.service.notify import EngineHealth, Notifier, Watchdog
from tests.helpers.configs import eager_profile
from tests.helpers.daemon import start_daemon, wait_until_ready
from tests.helpers.waiting import wait_until


@dataclass
class Systemd:
    """The manager's end of NOTIFY_SOCKET: every datagram with its arrival time."""

    path: Path
    sock: socket.socket
    received: list[tuple[float, str]] = field(default_factory=list)

    def listen(self) -> None:
        self.sock.settimeout(0.2)
        while self.sock.fileno() != -1:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.received.append((time.monotonic(), data.decode()))

    def wait_for(self, text: str, timeout: float = 60) -> float:
        """When a datagram containing `text` arrived (waits for it)."""
        return wait_until(f"a datagram with {text!r} from llmd",
                          lambda: next((at for at, message in list(self.received) if text in message), None),
                          timeout)

    def messages(self) -> list[str]:
        return [message for _, message in self.received]

    def flush(self) -> None:
        """Wait until every datagram sent so far has been read: datagrams on a local socket arrive
        in order, so once a marker sent now is read, so is everything sent before it."""
        marker = f"FLUSH={time.monotonic_ns()}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(marker.encode(), str(self.path))
        self.wait_for(marker)

    def pings(self) -> int:
        """WATCHDOG=1 datagrams read so far."""
        return sum(message == "WATCHDOG=1" for message in self.messages())


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[Systemd]:
    path = Path(f"/tmp/llmd-notify-{time.monotonic_ns()}.sock")  # short: AF_UNIX paths max 107 bytes
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    manager = Systemd(path, sock)
    thread = threading.Thread(target=manager.listen, daemon=True)
    thread.start()
    yield manager
    sock.close()
    thread.join(timeout=2)
    path.unlink(missing_ok=True)


def test_ready_after_warm_up_then_status_watchdog_and_stopping(
    tiny_model: Path, tmp_path: Path, systemd: Systemd
) -> None:
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "400000"}
    daemon = start_daemon(tmp_path, "--model", str(tiny_model), "--served-model-name", "tiny",
                          wait_ready=False, env=env)
    try:
        systemd.wait_for("READY=1")
        assert httpx.get(f"{daemon.url}/ready", timeout=5).status_code == 200
        assert "warm-up done" in daemon.log()
        first = systemd.messages()
        assert first[0].startswith("STATUS=loading tiny")
        assert "STATUS=warming up" in first, first  # the phase before READY (compiling on a GPU profile)
        ready = next(m for m in first if "READY=1" in m)
        assert "STATUS=ready: model loaded in" in ready
        assert not any("WATCHDOG=1" in m for m in first[: first.index(ready)])
        wait_until("pinging the watchdog while healthy", lambda: systemd.pings() >= 3)
        systemd.wait_for("STATUS=serving: 0 running, 0 waiting")
    finally:
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(timeout=30) == 0, daemon.log()
    stopping = systemd.wait_for("STOPPING=1")
    assert stopping > systemd.wait_for("READY=1")


def test_no_ready_when_the_preflight_refuses(tiny_model: Path, tmp_path: Path, systemd: Systemd) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text("device: cpu\nmemory_headroom: 100TiB\n")
    daemon = start_daemon(tmp_path, "--model", str(model), "--profile", str(greedy), wait_ready=False,
                          env={"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "400000"})
    assert daemon.process.wait(timeout=60) == EXIT_PREFLIGHT
    systemd.flush()  # everything the process sent before it exited has been read
    assert not any("READY=1" in m or "WATCHDOG=1" in m for m in systemd.messages())


def test_a_wedged_worker_stops_the_watchdog_pings(tiny_model: Path, systemd: Systemd) -> None:
    ready, wedge, release = threading.Event(), threading.Event(), threading.Event()
    worker = EngineWorker(tiny_model, eager_profile(), WorkerHooks(
        deliver=lambda events: None, on_ready=ready.set, on_fatal=lambda exc: None))
    worker.start()
    assert ready.wait(60) and worker.runner is not None
    real_step = worker.runner.step

    def stuck_step(decode: list[Request], chunks: list[tuple[Request, int]]) -> StepResult:
        if wedge.is_set():
            release.wait(30)  # a hung kernel or a deadlock, as far as the daemon can tell
        return real_step(decode, chunks)

    worker.runner.step = stuck_step  # type: ignore[method-assign]  # what the worker calls each step
    health = EngineHealth(worker.heartbeat, stall_seconds=0.5, alive=worker.alive)
    watchdog = Watchdog(Notifier(str(systemd.path)), interval=0.2, probe=health)
    watchdog.start()
    try:
        worker.submit(Request("busy", [5, 6, 7, 8], SamplingParams(max_tokens=4000, temperature=0.0)))
        wait_until("pinging while the worker steps", lambda: watchdog.pings >= 3)
        wedge.set()
        problem = wait_until("a stalled step noticed", health.problem)
        assert "step" in problem
        noticed = watchdog.rounds
        wait_until("the round under way done", lambda: watchdog.rounds > noticed)
        stalled = watchdog.pings  # every round from here on sees the stall
        wait_until("three more rounds", lambda: watchdog.rounds > noticed + 4)
        assert watchdog.pings == stalled, "pings went on from a wedged worker"
        systemd.flush()
        assert systemd.pings() == stalled
        wedge.clear()
        release.set()
        wait_until("pings resumed", lambda: watchdog.pings > stalled)
    finally:
        release.set()
        watchdog.stop()
        worker.abort("busy")
        worker.stop(10)


def test_metrics_parse_and_move_with_real_requests(daemon_with_metrics: str) -> None:
    base = daemon_with_metrics

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{base}/metrics", timeout=10).text
        return {sample.name + str(sorted(sample.labels.items())): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    before = scrape()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    for _ in range(3):
        stream = client.chat.completions.create(model="tiny", max_tokens=6, stream=True,
                                                messages=[{"role": "user", "content": "count"}])
        assert sum(1 for _ in stream) > 0
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", max_tokens=0,
                                       messages=[{"role": "user", "content": "x"}])
    length = "llmd_requests_total[('finish_reason', 'length')]"

    def counted() -> dict[str, float] | None:
        """A scrape once the three requests are counted (as each stream closes on the server,
        just after the client has read it)."""
        now = scrape()
        return now if now.get(length, 0.0) - before.get(length, 0.0) >= 3 else None

    after = wait_until("the three requests counted", counted)

    def moved(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert moved("llmd_completion_tokens_total[]") == 18
    assert moved("llmd_requests_total[('finish_reason', 'length')]") == 3
    assert moved("llmd_time_to_first_token_seconds_count[]") == 3
    assert moved("llmd_inter_token_latency_seconds_count[]") == 15
    assert moved("llmd_queue_wait_seconds_count[]") == 3
    assert moved("llmd_prompt_tokens_total[]") > 0
    assert moved("llmd_errors_total[('type', 'invalid_request_error')]") == 1
    assert after["llmd_requests_running[]"] == 0 and after["llmd_model_load_seconds[]"] > 0
    assert "llmd_gpu_memory_used_bytes[]" not in after  # CPU: no GPU series at all


def load_seconds(metrics: str) -> float:
    """The model load gauge's value (0 until the READY bookkeeping sets it)."""
    found = re.search(r"^llmd_model_load_seconds (\S+)$", metrics, re.MULTILINE)
    return float(found[1]) if found else 0.0


@pytest.fixture(scope="module")
def daemon_with_metrics(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("metrics")
    daemon = start_daemon(tmp, "--model", str(tiny_model), "--served-model-name", "tiny")
    wait_until_ready(daemon)
    # READY bookkeeping (load/warm-up gauges) runs just after /ready turns 200.
    wait_until("the load gauge set",
               lambda: load_seconds(httpx.get(f"{daemon.url}/metrics", timeout=10).text) > 0)
    yield daemon.url
    assert daemon.stop() == 0, daemon.log()


def test_a_compiled_profile_reports_compiling_before_ready(
    tiny_model: Path, tmp_path: Path, systemd: Systemd
) -> None:
    profile = tmp_path / "compiled.yaml"
    profile.write_text("device: cpu\nkv_cache: static\ncompile: default\nmax_context: 256\nmax_running: 2\n"
                       "prefill_chunk_tokens: 32\nmax_step_tokens: 256\n")
    daemon = start_daemon(tmp_path, "--model", str(tiny_model), "--profile", str(profile), wait_ready=False,
                          env={"NOTIFY_SOCKET": str(systemd.path)})
    try:
        ready_at = systemd.wait_for("READY=1", timeout=300)
        compiling_at = systemd.wait_for("STATUS=compiling the decode step (default)")
        assert systemd.wait_for("STATUS=loading the model") < compiling_at < ready_at
        assert "static decode step (compile: default) warmed up in" in daemon.log()
    finally:
        assert daemon.stop() == 0, daemon.log()
