"""The scheduler alone: admission order, limits, per-step prefill budget, abort, finish."""

from __future__ import annotations

import pytest

from llmd.engine.scheduler import ChunkPace, Scheduler, StepPlan, lone_piece
from llmd.engine.types import FinishReason, Request, RequestStatus, SamplingParams


def request(name: str, prompt_tokens: int = 3) -> Request:
    return Request(name, list(range(prompt_tokens)), SamplingParams(max_tokens=4))


def ids(requests: list[Request]) -> list[str]:
    return [r.request_id for r in requests]


def run_chunks(plan: StepPlan) -> list[tuple[str, int, int, bool]]:
    """What the runner does with the chunks: each prompt is in the cache up to its stop."""
    done = []
    for chunk in plan.prefill:
        chunk.request.prefilled = chunk.stop
        done.append((chunk.request.request_id, chunk.start, chunk.stop, chunk.completes_prompt))
    return done


def test_a_burst_is_prefilled_together_up_to_the_running_limit() -> None:
    scheduler = Scheduler(max_running=2, prefill_chunk_tokens=4, max_step_tokens=100)
    for name in "abc":
        scheduler.add(request(name))
    plan = scheduler.schedule()
    assert run_chunks(plan) == [("a", 0, 3, True), ("b", 0, 3, True)] and plan.decode == []
    plan = scheduler.schedule()
    assert ids(plan.decode) == ["a", "b"] and plan.prefill == []  # running set is full
    assert ids(list(scheduler.waiting)) == ["c"]


def test_first_come_first_served_within_the_budget() -> None:
    scheduler = Scheduler(max_running=8, prefill_chunk_tokens=4, max_step_tokens=10)
    for name, size in (("a", 4), ("b", 4), ("c", 4), ("d", 1)):
        scheduler.add(request(name, size))
    # a and b fit whole; c would need splitting and is not the oldest: it waits, and so
    # does d behind it, although d alone would fit the 2 tokens left.
    assert run_chunks(scheduler.schedule()) == [("a", 0, 4, True), ("b", 0, 4, True)]
    plan = scheduler.schedule()
    assert ids(plan.decode) == ["a", "b"]
    assert run_chunks(plan) == [("c", 0, 4, True)]  # others decode now: the budget is 4
    assert run_chunks(scheduler.schedule()) == [("d", 0, 1, True)]


def test_alone_the_whole_prompt_goes_at_once_up_to_the_step_budget() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=64)
    scheduler.add(request("long", prompt_tokens=50))
    assert run_chunks(scheduler.schedule()) == [("long", 0, 50, True)]
    scheduler.add(request("longer", prompt_tokens=100))
    scheduler.finish(scheduler.running[0], FinishReason.LENGTH)
    assert run_chunks(scheduler.schedule()) == [("longer", 0, 64, False)]
    assert run_chunks(scheduler.schedule()) == [("longer", 64, 100, True)]


def chunks_beside(scheduler: Scheduler, decoding: list[str], steps: int) -> list[tuple[str, int, int, bool]]:
    """The prompt chunks of `steps` steps, each of which also decodes exactly `decoding`."""
    chunks = []
    for _ in range(steps):
        plan = scheduler.schedule()
        assert ids(plan.decode) == decoding
        chunks += run_chunks(plan)
    return chunks


def test_while_others_decode_a_long_prompt_is_split_into_budgeted_chunks() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=1000)
    scheduler.add(request("a"))
    run_chunks(scheduler.schedule())
    scheduler.add(request("long", prompt_tokens=20))
    scheduler.add(request("short", prompt_tokens=2))
    chunks = chunks_beside(scheduler, ["a"], steps=3)
    # the short one is not let past the long one's chunks, but shares its last step
    assert chunks == [("long", 0, 8, False), ("long", 8, 16, False), ("long", 16, 20, True),
                      ("short", 0, 2, True)]
    assert ids(scheduler.schedule().decode) == ["a", "long", "short"]


def test_a_split_leaves_no_tail_of_a_quarter_chunk_or_less() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=64)
    scheduler.add(request("a"))
    run_chunks(scheduler.schedule())
    for name, size in (("ten", 10), ("eleven", 11), ("tail-after-two", 18)):
        scheduler.add(request(name, prompt_tokens=size))
    chunks = [chunk for _ in range(5) for chunk in run_chunks(scheduler.schedule())]
    assert chunks == [("ten", 0, 10, True),  # 8 + a tail of 2 would cost a pass for 2 tokens
                      ("eleven", 0, 8, False), ("eleven", 8, 11, True),  # a tail of 3 is its own chunk
                      ("tail-after-two", 0, 8, False), ("tail-after-two", 8, 18, True)]
    tight = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=8)
    tight.add(request("a"))
    run_chunks(tight.schedule())
    tight.add(request("ten", prompt_tokens=10))
    assert run_chunks(tight.schedule()) == [("ten", 0, 8, False)]  # a step never exceeds max_step_tokens


def test_a_finished_request_frees_its_slot_for_the_next_waiting() -> None:
    scheduler = Scheduler(max_running=1, prefill_chunk_tokens=8)
    a, b = request("a"), request("b")
    scheduler.add(a)
    scheduler.add(b)
    run_chunks(scheduler.schedule())
    assert scheduler.schedule().prefill == []
    scheduler.finish(a, FinishReason.LENGTH)
    assert a.status is RequestStatus.FINISHED and a.finish_reason is FinishReason.LENGTH
    assert run_chunks(scheduler.schedule()) == [("b", 0, 3, True)]


def test_abort_while_waiting_mid_prefill_and_while_running() -> None:
    scheduler = Scheduler(max_running=3, prefill_chunk_tokens=2)
    a, b, c = request("a"), request("b", prompt_tokens=9), request("c")
    for r in (a, b, c):
        scheduler.add(r)
    run_chunks(scheduler.schedule())  # a, alone: budget 2 covers its first 2 tokens only
    run_chunks(scheduler.schedule())
    run_chunks(scheduler.schedule())  # b is mid-prefill now
    assert a.prefill_done and 0 < b.prefilled < 9
    assert scheduler.abort("c") is c and c.status is RequestStatus.ABORTED
    assert scheduler.abort("b") is b and b.status is RequestStatus.ABORTED
    assert scheduler.abort("a") is a and scheduler.abort("a") is None
    assert scheduler.schedule().idle and not scheduler.has_work


def test_step_budget_is_never_below_the_chunk_budget() -> None:
    assert Scheduler(max_running=3, prefill_chunk_tokens=8, max_step_tokens=2).max_step_tokens == 8


def test_idle_plan_when_nothing_is_queued() -> None:
    assert Scheduler(max_running=3, prefill_chunk_tokens=8).schedule().idle


def group(name: str, followers: int, prompt_tokens: int = 3) -> Request:
    """A request with `followers` more choices of its prompt."""
    leader = request(name, prompt_tokens)
    leader.followers = [request(f"{name}{k}", prompt_tokens) for k in range(1, followers + 1)]
    return leader


def test_a_group_is_admitted_only_when_every_choice_has_a_slot() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=4, max_step_tokens=100)
    scheduler.add(request("a"))
    scheduler.add(request("b"))
    scheduler.add(group("g", followers=2))
    run_chunks(scheduler.schedule())
    assert ids(scheduler.running) == ["a", "b"] and scheduler.occupied == 2  # g needs 3 slots
    scheduler.finish(scheduler.running[0], FinishReason.STOP)
    plan = scheduler.schedule()
    assert scheduler.occupied == 4  # the followers' slots are held while the leader prefills
    assert run_chunks(plan) == [("g", 0, 3, True)]
    leader = scheduler.running[-1]
    for follower in leader.followers:
        scheduler.join(follower, leader)
    leader.followers = []
    assert ids(scheduler.running) == ["b", "g", "g1", "g2"] and scheduler.occupied == 4
    assert all(r.status is RequestStatus.RUNNING for r in scheduler.running)


def test_a_follower_aborted_before_its_fork_leaves_its_group() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=4, max_step_tokens=100)
    leader = group("g", followers=2)
    scheduler.add(leader)
    dropped = scheduler.abort("g1")
    assert dropped is not None and dropped.status is RequestStatus.ABORTED
    assert ids(leader.followers) == ["g2"] and ids(list(scheduler.waiting)) == ["g"]
    assert scheduler.abort("g1") is None
    assert scheduler.abort("g") is leader and not scheduler.has_work

def test_a_lone_long_prompt_is_prefilled_in_pieces() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=100, lone_prefill_tokens=16)
    scheduler.add(request("long", prompt_tokens=40))
    chunks = [chunk for _ in range(3) for chunk in run_chunks(scheduler.schedule())]
    assert chunks == [("long", 0, 16, False), ("long", 16, 32, False), ("long", 32, 40, True)]


def test_a_burst_is_still_prefilled_in_one_pass() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=100, lone_prefill_tokens=16)
    for name in ("a", "b", "c"):
        scheduler.add(request(name, prompt_tokens=30))
    assert run_chunks(scheduler.schedule()) == [("a", 0, 30, True), ("b", 0, 30, True), ("c", 0, 30, True)]


def test_a_prompt_split_alone_carries_on_in_pieces_while_a_newcomer_waits() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=100, lone_prefill_tokens=16)
    scheduler.add(request("first", prompt_tokens=40))
    run_chunks(scheduler.schedule())
    scheduler.add(request("next", prompt_tokens=10))
    assert run_chunks(scheduler.schedule()) == [("first", 16, 32, False)]  # an abort could land here
    assert ids(list(scheduler.waiting)) == ["next"]
    scheduler.abort("first")
    assert run_chunks(scheduler.schedule()) == [("next", 0, 10, True)]


def test_a_lone_prompt_takes_a_tail_of_a_quarter_piece_or_less_along() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=100, lone_prefill_tokens=16)
    for size in (20, 21):
        scheduler.add(request(f"p{size}", prompt_tokens=size))
        chunks = [chunk for _ in range(2) for chunk in run_chunks(scheduler.schedule())]
        scheduler.finish(scheduler.running[0], FinishReason.LENGTH)
        runs = {20: [("p20", 0, 20, True)], 21: [("p21", 0, 16, False), ("p21", 16, 21, True)]}
        assert chunks == runs[size]  # 16 + a tail of 4 in one pass; a tail of 5 is its own piece
    tight = Scheduler(max_running=4, prefill_chunk_tokens=8, max_step_tokens=16, lone_prefill_tokens=16)
    tight.add(request("twenty", prompt_tokens=20))
    assert run_chunks(tight.schedule()) == [("twenty", 0, 16, False)]  # a piece never exceeds max_step_tokens


def test_the_lone_piece_is_never_above_the_step_budget_and_defaults_to_it() -> None:
    above = Scheduler(max_running=3, prefill_chunk_tokens=8, max_step_tokens=64, lone_prefill_tokens=99)
    assert above.lone_prefill_tokens == 64
    assert Scheduler(max_running=3, prefill_chunk_tokens=8, max_step_tokens=64).lone_prefill_tokens == 64


def test_lone_pieces_cover_a_prompt_exactly() -> None:
    for length in range(1, 200):
        done, pieces = 0, []
        while done < length:
            pieces.append(lone_piece(length - done, 32, 64))
            done += pieces[-1]
        assert done == length and all(piece <= 32 + 8 for piece in pieces)
        assert len(pieces) == 1 or pieces[-1] > 8  # no tail of a quarter piece or less alone


def test_a_group_alone_is_prefilled_in_pieces_and_counts_its_followers_slots() -> None:
    crowded = Scheduler(max_running=4, prefill_chunk_tokens=4, max_step_tokens=100, lone_prefill_tokens=8)
    crowded.add(group("g", followers=2, prompt_tokens=30))
    crowded.add(request("b", 30))
    assert run_chunks(crowded.schedule()) == [("g", 0, 30, True), ("b", 0, 30, True)]  # a burst: one pass
    tight = Scheduler(max_running=3, prefill_chunk_tokens=4, max_step_tokens=100, lone_prefill_tokens=8)
    tight.add(group("g", followers=2, prompt_tokens=30))
    tight.add(request("b", 30))  # no slot left beside the group's three
    assert run_chunks(tight.schedule()) == [("g", 0, 8, False)]


def test_the_chunk_budget_is_the_ceiling_until_a_prompt_token_has_been_priced() -> None:
    pace = ChunkPace(32)
    assert pace.budget() == 32
    pace.observe(0.010, decoding=0, prefilled=20)  # a short pass alone: mostly its fixed cost, no price
    pace.observe(0.070, decoding=7, prefilled=32)  # no decode step timed yet to price it against
    assert pace.budget() == 32 and pace.token_seconds is None
    pace.observe(0.028, decoding=7, prefilled=0)
    assert pace.budget() == 32  # the decode step alone is known, a prompt token not yet


def test_dear_prompt_tokens_get_a_chunk_that_costs_the_streams_four_more_decode_steps() -> None:
    pace = ChunkPace(32)
    pace.observe(0.028, decoding=7, prefilled=0)
    pace.observe(0.220, decoding=7, prefilled=32)  # 6 ms a prompt token on top of 28 ms
    assert pace.budget() == 18  # 18 x 6 = 108 ms: the step takes about five decode steps (STRETCH 4)
    for _ in range(50):  # prompt tokens dearer still: never below a quarter of the ceiling
        pace.observe(0.300, decoding=7, prefilled=18)
    assert pace.budget() == 8


def test_a_prefill_pass_alone_gives_a_first_price_until_one_beside_the_streams() -> None:
    pace = ChunkPace(32)
    pace.observe(0.016, decoding=1, prefilled=0)
    pace.observe(3.200, decoding=0, prefilled=400)  # a burst: 8 ms a token, its fixed cost included
    assert pace.first_price and pace.budget() == 8  # 4 x 16 ms / 8 ms, at least a quarter of 32
    pace.observe(0.100, decoding=0, prefilled=64)  # a later pass alone replaces a first price
    assert pace.token_seconds == pytest.approx(0.100 / 64)
    pace.observe(0.016 + 0.0005 * 8, decoding=1, prefilled=8)  # beside the stream: 0.5 ms a token
    assert not pace.first_price and pace.token_seconds == pytest.approx(0.0005)  # replaced, not averaged
    assert pace.budget() == 32
    pace.observe(1.0, decoding=0, prefilled=500)  # measured prices are kept from now on
    assert pace.token_seconds == pytest.approx(0.0005)


def test_cheap_prompt_tokens_keep_the_ceiling_and_recent_steps_count_most() -> None:
    pace = ChunkPace(32)
    pace.observe(0.008, decoding=8, prefilled=0)
    pace.observe(0.012, decoding=7, prefilled=32)  # 0.125 ms a token: 64 would still fit
    assert pace.budget() == 32
    pace.observe(0.006, decoding=7, prefilled=32)  # faster than decoding alone: costs nothing
    assert pace.token_seconds is not None and pace.token_seconds < 0.000125
    for _ in range(30):  # the streams' steps grow dearer (more rows, longer caches)
        pace.observe(0.040, decoding=8, prefilled=0)
    assert pace.decode_seconds == pytest.approx(0.040, abs=0.001)


def test_beside_decoding_streams_the_scheduler_splits_prompts_by_the_paced_budget() -> None:
    scheduler = Scheduler(max_running=4, prefill_chunk_tokens=32, max_step_tokens=1000)
    scheduler.add(request("a"))
    run_chunks(scheduler.schedule())
    scheduler.pace.observe(0.028, decoding=1, prefilled=0)
    scheduler.pace.observe(0.220, decoding=1, prefilled=32)  # 6 ms a token: 4 x 28 / 6 = 18 a step
    scheduler.add(request("long", prompt_tokens=60))
    chunks = chunks_beside(scheduler, ["a"], steps=3)
    # 18, 18, 18 and a rest of 6 in a step of its own: more than a quarter of the paced 18
    # (taken along, a quarter of the ceiling would have made that step cost 24 tokens)
    assert chunks == [("long", 0, 18, False), ("long", 18, 36, False), ("long", 36, 54, False)]
    assert run_chunks(scheduler.schedule()) == [("long", 54, 60, True)]
    scheduler.add(request("just-over", prompt_tokens=22))
    assert run_chunks(scheduler.schedule()) == [("just-over", 0, 22, True)]  # a rest of 4 goes along
    for running in list(scheduler.running):
        scheduler.finish(running, FinishReason.STOP)
    scheduler.add(request("burst", prompt_tokens=60))  # nobody decoding: the pace does not apply
    scheduler.add(request("other", prompt_tokens=60))
    assert run_chunks(scheduler.schedule()) == [("burst", 0, 60, True), ("other", 0, 60, True)]
