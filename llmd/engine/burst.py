"""When an idle engine gathers a burst before its first prefill: a pure policy with a clock, and
the count of requests on their way that it waits for.

Clients that start together reach the worker milliseconds apart. Prefilling the first alone
leaves the rest to join in chunks beside its decode, and the batch stays staggered for the
whole run. So an engine woken from idle first waits, bounded, for requests still on their
way (being read or tokenized) and, with the profile's `burst_window_ms`, until none has
arrived for that long. Nobody is decoding during that wait. The quiet window is waited out
only when requests came together the last time the engine woke (two or more admitted soon
after the wake), or before any, so lone requests (an editor's completions, a script's calls)
do not pay it.

A request counts as arriving from its connection's accept or its first byte (`Arrival`, made
by the HTTP protocol), not only once its prompt is encoding: a client pool that sends its first
request on a kept-alive connection and the rest on new ones gets the first to the worker 2-4 ms
before the others are read, and a lone verdict prefilled it alone, the rest one by one beside
it. Small demo model, bfloat16, `llmd bench -c 8 -n 1 --max-tokens 32` right after lone requests,
16 trials a side: counted from the encode only, 6 of 16 waves stayed together (997-1162 tok/s)
and 10 fell apart (464-533); counted from the accept, 16 of 16 together (948-1285).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
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

    `left`: seconds to the bound; `arriving`: requests being read or tokenized; `quiet`: the
    quiet window in force; `inbox_changed`: requests arrived since the last quiet wait.
    """
    if left <= 0:
        return None
    if arriving > 0:
        return left
    if quiet > 0 and inbox_changed:
        return min(quiet, left)
    return None


class Arrival:
    """A request on its way to the engine, counted as arriving (+1 now) until `end` (-1, once).

    Its end is the earliest of: its prompt begins encoding (`hand_over`; the encode counts it
    from there), its handler returns without one, or `BOUND_SECONDS` after it began (a
    connection opened and left idle is no burst). All on the event loop's thread.
    """

    __slots__ = ("_count", "counted")

    def __init__(self, count: Callable[[int], None]) -> None:
        self._count, self.counted = count, True
        count(+1)

    def end(self) -> None:
        if self.counted:
            self.counted = False
            self._count(-1)


_carried: ContextVar[Arrival | None] = ContextVar("llmd_arrival", default=None)


def carry(arrival: Arrival) -> None:
    """The current task serves `arrival`'s request, so its encode can take the count over."""
    _carried.set(arrival)


def hand_over() -> None:
    """The current task's prompt begins encoding, counted by the encode from now: end its arrival."""
    arrival = _carried.get()
    if arrival is not None:
        arrival.end()
