"""The burst gate's verdicts on a fake clock, the gathering's waits, and how a request being read
is counted until its encode takes over (pure, milliseconds)."""

from __future__ import annotations

import asyncio

import pytest

from llmd.engine.burst import Arrival, BurstGate, carry, gather_wait, hand_over


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate() -> tuple[BurstGate, FakeClock]:
    clock = FakeClock()
    return BurstGate(window_s=0.005, bound_s=0.05, clock=clock), clock


def test_the_first_wake_waits_the_window_out() -> None:
    burst, _ = gate()
    assert burst.bursty and burst.quiet_s() == 0.005


def test_a_lone_request_per_wake_turns_the_window_off() -> None:
    burst, clock = gate()
    burst.woke()
    burst.admitted(1)
    clock.now += 1.0
    burst.admitted(1)  # long after the wake: a request of its own, not of the burst
    assert not burst.bursty and burst.quiet_s() == 0.0


def test_two_requests_soon_after_a_wake_turn_it_back_on() -> None:
    burst, clock = gate()
    burst.woke()
    burst.admitted(1)
    burst.woke()
    burst.admitted(1)
    clock.now += 0.02
    burst.admitted(1)
    assert burst.bursty and burst.quiet_s() == 0.005
    burst.woke()  # each wake is judged afresh
    assert not burst.bursty


def test_exactly_at_the_bound_still_counts_as_together() -> None:
    burst, clock = gate()
    burst.woke()
    burst.admitted(1)
    clock.now += 0.05
    burst.admitted(1)
    assert burst.bursty


@pytest.mark.parametrize(("left", "arriving", "quiet", "changed", "expected"), [
    (0.04, 1, 0.0, False, 0.04),  # a request still being tokenized: wait for it, up to the bound
    (0.04, 2, 0.005, True, 0.04),
    (0.04, 0, 0.005, True, 0.005),  # new arrivals: wait for a quiet window
    (0.003, 0, 0.005, True, 0.003),  # but never past the bound
    (0.04, 0, 0.005, False, None),  # quiet for a window: start
    (0.04, 0, 0.0, True, None),  # no window after lone traffic: start at once
    (0.0, 1, 0.005, True, None),  # the bound is reached: start whatever is still coming
    (-0.01, 0, 0.005, True, None),
])
def test_gather_wait(left: float, arriving: int, quiet: float, changed: bool, expected: float | None) -> None:
    assert gather_wait(left, arriving, quiet, changed) == expected


class Count:
    """What an engine's `_arriving` receives: the running total and every change."""

    def __init__(self) -> None:
        self.total = 0
        self.changes: list[int] = []

    def __call__(self, change: int) -> None:
        self.total += change
        self.changes.append(change)


def test_an_arrival_is_counted_once_and_ended_once() -> None:
    count = Count()
    arrival = Arrival(count)
    assert count.total == 1 and arrival.counted
    arrival.end()
    arrival.end()  # its encode, then its handler's end: the second changes nothing
    assert count.changes == [+1, -1] and not arrival.counted


def test_an_encode_hands_over_only_the_arrival_its_own_task_carries() -> None:
    count = Count()

    async def main() -> None:
        hand_over()  # nothing carried: nothing ended
        first, second = Arrival(count), Arrival(count)
        started = asyncio.Event()

        async def serve(arrival: Arrival, encodes: bool) -> None:
            carry(arrival)
            await started.wait()
            if encodes:
                hand_over()

        tasks = [asyncio.create_task(serve(first, True)), asyncio.create_task(serve(second, False))]
        await asyncio.sleep(0)
        started.set()
        await asyncio.gather(*tasks)
        assert not first.counted and second.counted and count.total == 1
        hand_over()  # the tasks' context, not this one's, held them
        assert second.counted

    asyncio.run(main())
