"""The scheduler alone: admission order, limits, chunked prefill, abort, finish."""

from __future__ import annotations

from llmd.engine.scheduler import PrefillChunk, Scheduler, StepPlan
from llmd.engine.types import FinishReason, Request, RequestStatus, SamplingParams


def request(name: str, prompt_tokens: int = 3) -> Request:
    return Request(name, list(range(prompt_tokens)), SamplingParams(max_tokens=4))


def ids(requests: list[Request]) -> list[str]:
    return [r.request_id for r in requests]


def run_chunk(plan: StepPlan) -> PrefillChunk:
    """What the runner does with a chunk: the prompt is in the cache up to its stop."""
    assert plan.prefill is not None
    plan.prefill.request.prefilled = plan.prefill.stop
    return plan.prefill


def test_first_come_first_served_one_prefill_at_a_time() -> None:
    scheduler = Scheduler(max_running=2, prefill_chunk_tokens=100)
    for name in "abc":
        scheduler.add(request(name))
    plan = scheduler.schedule()
    assert run_chunk(plan).request.request_id == "a" and plan.decode == []
    plan = scheduler.schedule()
    assert ids(plan.decode) == ["a"] and run_chunk(plan).request.request_id == "b"
    plan = scheduler.schedule()
    assert ids(plan.decode) == ["a", "b"] and plan.prefill is None  # running set is full
    assert ids(list(scheduler.waiting)) == ["c"]


def test_alone_the_whole_prompt_goes_at_once() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8)
    scheduler.add(request("long", prompt_tokens=50))
    chunk = run_chunk(scheduler.schedule())
    assert (chunk.start, chunk.stop, chunk.completes_prompt) == (0, 50, True)


def test_while_others_decode_a_long_prompt_is_split_into_budgeted_chunks() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8)
    scheduler.add(request("a"))
    run_chunk(scheduler.schedule())
    scheduler.add(request("long", prompt_tokens=20))
    chunks = []
    for _ in range(3):
        plan = scheduler.schedule()
        assert ids(plan.decode) == ["a"]
        chunks.append(run_chunk(plan))
    assert [(c.start, c.stop, c.completes_prompt) for c in chunks] == [
        (0, 8, False), (8, 16, False), (16, 20, True)]
    assert ids(scheduler.schedule().decode) == ["a", "long"]


def test_a_finished_request_frees_its_slot_for_the_next_waiting() -> None:
    scheduler = Scheduler(max_running=1, prefill_chunk_tokens=8)
    a, b = request("a"), request("b")
    scheduler.add(a)
    scheduler.add(b)
    run_chunk(scheduler.schedule())
    assert scheduler.schedule().prefill is None
    scheduler.finish(a, FinishReason.LENGTH)
    assert a.status is RequestStatus.FINISHED and a.finish_reason is FinishReason.LENGTH
    assert run_chunk(scheduler.schedule()).request is b


def test_abort_while_waiting_mid_prefill_and_while_running() -> None:
    scheduler = Scheduler(max_running=3, prefill_chunk_tokens=2)
    a, b, c = request("a"), request("b", prompt_tokens=9), request("c")
    for r in (a, b, c):
        scheduler.add(r)
    run_chunk(scheduler.schedule())
    run_chunk(scheduler.schedule())  # b is mid-prefill now
    assert not b.prefill_done
    assert scheduler.abort("c") is c and c.status is RequestStatus.ABORTED
    assert scheduler.abort("b") is b and b.status is RequestStatus.ABORTED
    assert scheduler.abort("a") is a and scheduler.abort("a") is None
    assert scheduler.schedule().idle and not scheduler.has_work


def test_idle_plan_when_nothing_is_queued() -> None:
    assert Scheduler(max_running=3, prefill_chunk_tokens=8).schedule().idle
