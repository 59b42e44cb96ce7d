"""The scheduler alone: admission order, limits, abort, finish."""

from __future__ import annotations

from llmd.engine.scheduler import Scheduler
from llmd.engine.types import FinishReason, Request, RequestStatus, SamplingParams


def request(name: str) -> Request:
    return Request(name, [1, 2, 3], SamplingParams(max_tokens=4))


def ids(requests: list[Request]) -> list[str]:
    return [r.request_id for r in requests]


def test_first_come_first_served_within_the_running_limit() -> None:
    scheduler = Scheduler(max_running=2, max_prefills_per_step=2)
    for name in "abc":
        scheduler.add(request(name))
    plan = scheduler.schedule()
    assert ids(plan.prefill) == ["a", "b"] and plan.decode == []
    assert ids(list(scheduler.waiting)) == ["c"]
    plan = scheduler.schedule()
    assert ids(plan.decode) == ["a", "b"] and plan.prefill == []


def test_one_prefill_per_step_by_default_so_running_streams_keep_their_cadence() -> None:
    scheduler = Scheduler(max_running=4)
    for name in "abc":
        scheduler.add(request(name))
    assert ids(scheduler.schedule().prefill) == ["a"]
    plan = scheduler.schedule()
    assert ids(plan.prefill) == ["b"] and ids(plan.decode) == ["a"]


def test_a_finished_request_frees_its_slot_for_the_next_waiting() -> None:
    scheduler = Scheduler(max_running=1)
    a, b = request("a"), request("b")
    scheduler.add(a)
    scheduler.add(b)
    scheduler.schedule()
    scheduler.finish(a, FinishReason.LENGTH)
    assert a.status is RequestStatus.FINISHED and a.finish_reason is FinishReason.LENGTH
    assert ids(scheduler.schedule().prefill) == ["b"]


def test_abort_while_waiting_and_while_running() -> None:
    scheduler = Scheduler(max_running=1)
    a, b = request("a"), request("b")
    scheduler.add(a)
    scheduler.add(b)
    scheduler.schedule()
    assert scheduler.abort("b") is b and b.status is RequestStatus.ABORTED
    assert scheduler.abort("a") is a and a.status is RequestStatus.ABORTED
    assert scheduler.abort("a") is None
    assert scheduler.schedule().idle and not scheduler.has_work


def test_idle_plan_when_nothing_is_queued() -> None:
    assert Scheduler(max_running=3).schedule().idle
