"""The worker thread's pulse, which the systemd watchdog reads (`llmd.service.notify.EngineHealth`)."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


class Heartbeat:
    """The worker's pulse: when its current step began and when its last step ended.

    One writer (the worker thread), any number of readers. Both stamps live in one tuple
    that is replaced whole, so a reader never sees half an update; each call is one clock
    read and one attribute store.
    """

    __slots__ = ("_clock", "_state")

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._state: tuple[float | None, float] = (None, clock())

    def step_started(self) -> None:
        """The worker begins a step (call right before touching the model)."""
        self._state = (self._clock(), self._state[1])

    def step_finished(self) -> None:
        """The worker ended a step, successfully or not (call in a `finally`)."""
        self._state = (None, self._clock())

    @property
    def busy_since(self) -> float | None:
        """When the step in progress began; None while the worker is idle."""
        return self._state[0]

    @property
    def last_step_finished(self) -> float:
        """When the last step ended (creation time before the first one)."""
        return self._state[1]

    def busy_for(self) -> float:
        """Seconds the step in progress has run so far; 0 while idle."""
        busy_since = self._state[0]
        return 0.0 if busy_since is None else self._clock() - busy_since
