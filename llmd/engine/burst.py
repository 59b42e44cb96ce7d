"""When an idle engine gathers a burst before its first prefill: a pure policy with a clock.

Clients that start together reach the worker milliseconds apart. Prefilling the first alone
leaves the rest to join in chunks beside its decode, and the batch stays staggered for the
whole run. So an engine woken from idle first waits, bounded, for requests still being
tokenized and, with the profile's `burst_window_ms`, until none has arrived for that long.
Nobody is decoding during that wait. The quiet window is waited out only when requests came
together the last time the engine woke (two or more admitted soon after the wake), or
before any, so lone requests (an editor's completions, a script's calls) do not pay it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# The longest an idle worker that has just been handed a request waits for others, and how
# soon after a wake a request counts as having come with the first.
BOUND_SECONDS = 0.05


@dataclass(slots=True)
class BurstGate:
    """How the last wake from idle went, and so whether the next one waits out `window_s`."""

    window_s: float
    bound_s: float = BOUND_SECONDS
    clock: Callable[[], float] = time.monotonic
    woke_at: float | None = None  # the last wake from idle
    woke_with: int = 0  # requests admitted within `bound_s` of it

    @property
    def bursty(self) -> bool:
        """Whether requests came together at the last wake (or none has come yet)."""
        return self.woke_at is None or self.woke_with > 1

    def quiet_s(self) -> float:
        """The quiet time the next gathering waits for: the window after bursty traffic, else 0."""
        return self.window_s if self.bursty else 0.0

    def woke(self) -> None:
        """The engine woke from idle and starts stepping now."""
        self.woke_at, self.woke_with = self.clock(), 0

    def admitted(self, count: int) -> None:
        """`count` requests were admitted; they came with the wake if it was `bound_s` ago or less."""
        if self.woke_at is not None and self.clock() - self.woke_at <= self.bound_s:
            self.woke_with += count


def gather_wait(left: float, arriving: int, quiet: float, inbox_changed: bool) -> float | None:
    """How long a gathering engine waits next, or None when it starts stepping.

    `left`: seconds to the bound; `arriving`: requests still being tokenized; `quiet`: the
    quiet window in force; `inbox_changed`: requests arrived since the last quiet wait.
    """
    if left <= 0:
        return None
    if arriving > 0:
        return left
    if quiet > 0 and inbox_changed:
        return min(quiet, left)
    return None
