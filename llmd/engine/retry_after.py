"""`Retry-After` for a request refused because every place is taken: seconds until one frees.

A place (running or waiting, `max_running + max_queue` in all) frees as soon as any open
request ends, so the wait is the time until the first running request ends. The scheduler is
first come, first served: the running requests are the oldest `max_running` open ones, and each
gains one token per decode step. A running request ends after at most `max_tokens - generated`
more tokens; most end sooner, at a stop, about where recent requests that ended by themselves
did. So the estimate is

    min over running requests of (min(max_tokens, typical length) - generated, at least 1)
    * the recent decode step time

rounded up and clamped to 1..120 s. Requests whose client left, or that failed, count nowhere:
they are no longer open, and their length says nothing about how long requests run. Averaging
whole request durations did both wrong: disconnected requests skewed it, and it ignored how far
the running requests already were (a 503 said 108 s while a place freed 39 s later).

Erring short is cheap (the retry gets a fresh estimate), erring long leaves a place idle. Not
counted: prompt prefill (chunked between decode steps, so it shows in the step time) and clients
leaving early, which only free places sooner.

Pure: no clock, no threads. The worker feeds `StepPace` (its own thread writes, any reads one
float); the client feeds `CompletionLengths` and asks `retry_after` on the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

MIN_SECONDS = 1
MAX_SECONDS = 120
# Before the first decode step has been timed (a fresh engine refusing its first burst).
DEFAULT_SECONDS = 5
# Weight of the newest observation in the running averages: about the last ten count.
RECENT_WEIGHT = 0.2


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """An admitted request that has not ended: tokens generated so far, and its budget."""

    generated: int
    max_tokens: int


class StepPace:
    """Seconds per decode step, averaged over recent steps; each step gives every running request a token."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: float | None = None  # None until a decode step has been timed

    def observe(self, seconds: float) -> None:
        """Count one decode step that took `seconds` (called by the worker thread only)."""
        self.seconds = recent_mean(self.seconds, seconds)


class CompletionLengths:
    """Completion tokens of recent requests that ended by themselves (a stop or their budget)."""

    __slots__ = ("tokens",)

    def __init__(self) -> None:
        self.tokens: float | None = None  # None until a request has ended by itself

    def observe(self, completion_tokens: int, finish_reason: str | None) -> None:
        """Count a closed request; one without a finish reason (client gone, failure) is ignored."""
        if finish_reason is not None:
            self.tokens = recent_mean(self.tokens, completion_tokens)


def retry_after(open_requests: Iterable[OpenRequest], max_running: int, step_seconds: float | None,
                typical_tokens: float | None) -> int:
    """Seconds until a place likely frees, 1 to 120, for `open_requests` in arrival order.

    Nothing running: 1 (a place frees at once). No step timed yet: `DEFAULT_SECONDS`.
    """
    running = list(islice(open_requests, max_running))
    if not running:
        return MIN_SECONDS
    if step_seconds is None:
        return DEFAULT_SECONDS
    steps = min(tokens_left(request, typical_tokens) for request in running)
    return clamp(math.ceil(round(steps * step_seconds, 3)))  # to the ms first: float error adds no second


def tokens_left(request: OpenRequest, typical_tokens: float | None) -> int:
    """Tokens `request` is expected still to generate: to the typical length within its budget, at least 1."""
    expected = request.max_tokens
    if typical_tokens is not None:
        expected = min(expected, math.ceil(typical_tokens))
    return max(1, expected - request.generated)


def recent_mean(mean: float | None, value: float) -> float:
    """`mean` moved toward `value` by `RECENT_WEIGHT` (exponential moving average); `value` if no mean."""
    return value if mean is None else mean + RECENT_WEIGHT * (value - mean)


def clamp(seconds: int) -> int:
    """`seconds` within `MIN_SECONDS`..`MAX_SECONDS`."""
    return max(MIN_SECONDS, min(MAX_SECONDS, seconds))
