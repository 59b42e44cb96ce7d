"""The processes a test started: its descendants still running, vLLM's titles for them, and a whole
process group stopped as systemd stops a unit (SIGTERM to every member), then checked gone."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import psutil

from tests.helpers.waiting import wait_until

GONE_SECONDS = 120.0  # for a stopped engine's processes to exit: vLLM's own shutdown waits are shorter
# The interpreter's multiprocessing helper, started at its first spawn and kept until it exits: not
# one of the processes a test starts and stops.
RESOURCE_TRACKER = "multiprocessing.resource_tracker"


def descendants() -> set[int]:
    """The ids of this process's descendants now."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def alive_since(before: set[int]) -> list[psutil.Process]:
    """This process's descendants started since `before` that still run (zombies are dead)."""
    return [child for child in psutil.Process().children(recursive=True)
            if child.pid not in before and running(child) and RESOURCE_TRACKER not in title(child)]


def running(process: psutil.Process) -> bool:
    """Whether `process` exists and is not a zombie waiting to be reaped."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def title(process: psutil.Process) -> str:
    """The process's command line as it shows it (vLLM retitles its own: `VLLM::EngineCore_DP0`)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def vllm_titles(processes: list[psutil.Process] | None = None) -> list[str]:
    """The titles vLLM gave `processes` (`VLLM::...`; by default this process's descendants), sorted."""
    chosen = psutil.Process().children(recursive=True) if processes is None else processes
    titles = (title(process) for process in chosen if running(process))
    return sorted(name for name in titles if name.startswith("VLLM::"))


@contextlib.contextmanager
def no_process_left(timeout: float = GONE_SECONDS) -> Iterator[None]:
    """Fails unless every process started inside the block has exited within `timeout` after it;
    whatever is still running then (or when the block raised) is killed."""
    before = descendants()
    try:
        yield
    except BaseException:
        kill(alive_since(before))
        raise
    try:
        wait_until("every process the test started gone", lambda: not alive_since(before), timeout)
    finally:
        kill(alive_since(before))


def kill(processes: list[psutil.Process]) -> None:
    """SIGKILL each of `processes` that still exists, and reap the ones that are ours."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=GONE_SECONDS)


def group_members(group: int) -> list[psutil.Process]:
    """The running processes of process group `group`, on the whole machine."""
    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == group and running(process):
                members.append(process)
    return members


def signal_group(group: int, signum: signal.Signals) -> None:
    """Send `signum` to every process of `group`; a group already gone is left alone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)
