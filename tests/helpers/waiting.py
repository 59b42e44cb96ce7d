"""Waiting on a daemon's state, never on a guessed delay: poll a condition up to a generous deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_SECONDS = 0.05  # between looks; how long the wait takes is up to the condition


def wait_until(what: str, condition: Callable[[], T], timeout: float = 60.0) -> T:
    """The condition's first truthy value; fails naming `what` if none comes within `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"still not {what} after {timeout:g} s"
        time.sleep(POLL_SECONDS)
    return value
