"""Shared fixtures: a tiny demo model built offline, and real `llmd serve` processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

READY_TIMEOUT = 120.0


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model (random weights, local tokenizer, chat template)."""
    from llmd.demo.build import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "tiny", "tiny")


def free_port() -> int:
    """A TCP port on loopback nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Daemon:
    """A running `llmd serve` process."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_daemon(
    tmp: Path, *args: str, wait_ready: bool = True, env: dict[str, str] | None = None
) -> Daemon:
    """Start `llmd serve` on a free loopback port and wait until /ready says 200."""
    port = free_port()
    log_path = tmp / f"llmd-{port}.log"
    env = os.environ | {"LLMD_HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1"} | (env or {})
    command = [sys.executable, "-m", "llmd.cli", "serve", "--port", str(port), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    daemon = Daemon(process, port, log_path)
    if wait_ready:
        wait_until_ready(daemon)
    return daemon


def wait_until_ready(daemon: Daemon) -> None:
    """Poll /ready; fail with the daemon's log if it dies or never gets ready."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            pytest.fail(f"llmd exited with {daemon.process.returncode}:\n{daemon.log()}")
        try:
            if httpx.get(f"{daemon.url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    daemon.stop()
    pytest.fail(f"llmd not ready after {READY_TIMEOUT} s:\n{daemon.log()}")


@pytest.fixture(autouse=True)
def stop_daemons_left_running() -> Iterator[None]:
    """Stop any `llmd serve` a test started and left running (it failed before its own stop).

    Otherwise it serves on until its Popen is collected in some later test, where the
    "ResourceWarning: subprocess ... is still running" surfaces as an unraisable error.
    Child processes are compared, not Daemon objects: tests import this module both as
    `conftest` and as `tests.conftest`. Fixtures of wider scope start before this one.
    """
    before = {child.pid for child in psutil.Process().children()}
    yield
    for child in psutil.Process().children():
        if child.pid not in before and is_llmd_serve(child):
            child.terminate()
            try:
                child.wait(20)
            except psutil.TimeoutExpired:
                child.kill()
                child.wait(20)


def is_llmd_serve(process: psutil.Process) -> bool:
    try:
        command = process.cmdline()
    except psutil.Error:
        return False
    return "llmd.cli" in command and "serve" in command


@pytest.fixture(scope="session")
def daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon serving the tiny model for the end-to-end tests."""
    running = start_daemon(tmp_path_factory.mktemp("daemon"), "--model", str(tiny_model),
                           "--served-model-name", "tiny")
    yield running
    code = running.stop()
    assert code == 0, f"exit code {code}:\n{running.log()}"
