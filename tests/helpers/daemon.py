"""Real `llmd serve` subprocesses for the end-to-end tests: start one, wait until it is ready, stop it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers.configs import eager_profile_file
from tests.helpers.waiting import wait_until

READY_TIMEOUT = 120.0


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

    @property
    def home(self) -> Path:
        """The daemon's LLMD_HOME, in the test's folder (`start_daemon`): its response store is here."""
        return self.log_path.parent / "home"

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
    tmp: Path, *args: str, wait_ready: bool = True, env: dict[str, str] | None = None,
    ready_timeout: float = READY_TIMEOUT,
) -> Daemon:
    """Start `llmd serve` on a free loopback port and wait until /ready says 200.

    Its LLMD_HOME is `tmp/home`, so what it writes there (the response store) stays in the test's
    folder; a STATE_DIRECTORY inherited from the caller (a test run under systemd) is dropped, since
    it would win over LLMD_HOME. `env` may still set either. Without `--profile` it serves the
    default profile, `cpu`, with its decode steps eager (`eager_profile_file`): compiling them is a
    minute a daemon, and the tests that are about them ask for them.
    """
    if "--profile" not in args:
        args = (*args, "--profile", str(eager_profile_file(tmp)))
    port = free_port()
    log_path = tmp / f"llmd-{port}.log"
    inherited = {key: value for key, value in os.environ.items() if key != "STATE_DIRECTORY"}
    env = inherited | {"LLMD_HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1"} | (env or {})
    command = [sys.executable, "-m", "llmd.cli", "serve", "--port", str(port), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    daemon = Daemon(process, port, log_path)
    if wait_ready:
        wait_until_ready(daemon, ready_timeout)
    return daemon


def wait_until_ready(daemon: Daemon, timeout: float = READY_TIMEOUT) -> None:
    """Poll /ready; fail with the daemon's log if it dies or never gets ready."""
    def ready() -> bool:
        if daemon.process.poll() is not None:
            pytest.fail(f"llmd exited with {daemon.process.returncode}:\n{daemon.log()}")
        try:
            return httpx.get(f"{daemon.url}/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until("ready", ready, timeout)
    except AssertionError:
        daemon.stop()
        pytest.fail(f"llmd not ready after {timeout:g} s:\n{daemon.log()}")


def is_llmd_serve(process: psutil.Process) -> bool:
    """Whether a process is an `llmd serve` (False once it is gone)."""
    try:
        command = process.cmdline()
    except psutil.Error:
        return False
    return "llmd.cli" in command and "serve" in command
