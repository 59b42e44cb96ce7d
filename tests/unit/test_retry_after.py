"""The Retry-After estimate of a full queue, with numbers: what is ahead, the step pace, the clamp."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmd.config import Profile
from llmd.engine.client import EngineClient
from llmd.engine.retry_after import (
    DEFAULT_SECONDS,
    CompletionLengths,
    OpenRequest,
    StepPace,
    retry_after,
    tokens_left,
)
from llmd.engine.types import SamplingParams
from llmd.engine.worker import EngineWorker
from llmd.errors import Overloaded


def test_an_idle_engine_has_a_place_at_once() -> None:
    assert retry_after([], max_running=8, step_seconds=0.05, typical_tokens=None) == 1


def test_before_any_step_is_timed_the_default_is_said() -> None:
    assert retry_after([OpenRequest(0, 100)], 1, None, None) == DEFAULT_SECONDS == 5


def test_the_first_running_request_to_reach_its_budget_frees_the_place() -> None:
    running = [OpenRequest(100, 500), OpenRequest(10, 300)]  # 400 and 290 tokens left
    assert retry_after(running, max_running=2, step_seconds=0.05, typical_tokens=None) == 15  # 290 * 0.05


def test_waiting_requests_are_not_ahead_of_a_free_place() -> None:
    running, waiting = [OpenRequest(100, 500), OpenRequest(10, 300)], [OpenRequest(0, 5)] * 64
    assert retry_after(running + waiting, 2, 0.05, None) == 15  # not 1: a waiting one decodes nothing


def test_the_reported_case_a_place_freeing_39_seconds_on_is_said_39() -> None:
    # Eight running at 100 ms a step; the closest to its end has 390 tokens to go.
    running = [OpenRequest(1000 + 100 * k, 4000) for k in range(7)] + [OpenRequest(610, 1000)]
    assert retry_after(running, 8, 0.1, None) == 39


def test_a_typical_length_shortens_an_open_budget() -> None:
    running = [OpenRequest(100, 4000), OpenRequest(50, 4000)]
    assert retry_after(running, 2, 0.1, None) == 120  # clamped: 3900 tokens * 0.1 s
    assert retry_after(running, 2, 0.1, typical_tokens=300.0) == 20  # 300 - 100 tokens
    assert tokens_left(OpenRequest(10, 50), 300.0) == 40  # the budget still bounds it


def test_a_request_past_the_typical_length_is_expected_to_end_soon() -> None:
    assert tokens_left(OpenRequest(900, 4000), 300.0) == 1
    assert retry_after([OpenRequest(900, 4000)], 1, 0.03, 300.0) == 1


@pytest.mark.parametrize(("tokens", "step", "seconds"), [(1, 0.001, 1), (30, 0.1, 3), (31, 0.1, 4),
                                                         (1200, 0.1, 120), (10**6, 1.0, 120)])
def test_seconds_round_up_within_1_to_120(tokens: int, step: float, seconds: int) -> None:
    assert retry_after([OpenRequest(0, tokens)], 1, step, None) == seconds


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 10**6)), max_size=20),
       st.integers(1, 16), st.none() | st.floats(0, 1e3), st.none() | st.floats(1, 1e6))
def test_always_an_integer_from_1_to_120(requests: list[tuple[int, int]], max_running: int,
                                         step: float | None, typical: float | None) -> None:
    open_requests = [OpenRequest(generated, max_tokens) for generated, max_tokens in requests]
    seconds = retry_after(open_requests, max_running, step, typical)
    assert type(seconds) is int and 1 <= seconds <= 120


def test_the_step_pace_is_a_recent_average() -> None:
    pace = StepPace()
    assert pace.seconds is None
    pace.observe(0.1)
    assert pace.seconds == 0.1
    pace.observe(0.2)
    assert pace.seconds == pytest.approx(0.12)


def test_lengths_count_only_requests_that_ended_by_themselves() -> None:
    lengths = CompletionLengths()
    lengths.observe(4000, None)  # its client left: no length learned
    assert lengths.tokens is None
    lengths.observe(100, "stop")
    lengths.observe(3500, None)
    assert lengths.tokens == 100
    lengths.observe(200, "length")
    assert lengths.tokens == pytest.approx(120)


# --- the client's view: its open streams, oldest first -------------------------------------------


def refusal_seconds(engine: EngineClient) -> int:
    with pytest.raises(Overloaded) as refused:
        engine.submit([1], SamplingParams(max_tokens=4000))
    assert refused.value.code == "queue_full"
    return refused.value.retry_after


def test_the_client_counts_the_open_running_streams_not_those_whose_client_left(tmp_path: Path) -> None:
    worker = EngineWorker(tmp_path, Profile(name="two", max_running=2, max_queue=1))  # never started
    engine = EngineClient(worker, max_context=4096)
    engine.ready.set()
    worker.pace.observe(0.1)
    first = engine.submit([1], SamplingParams(max_tokens=1000))
    second = engine.submit([1], SamplingParams(max_tokens=300))
    engine.submit([1], SamplingParams(max_tokens=30))  # waits behind them
    first.completion_tokens, second.completion_tokens = 600, 100  # 400 and 200 tokens to go
    assert refusal_seconds(engine) == 20  # 200 steps of 0.1 s; the waiting one decodes nothing
    second.close()  # its client left: the waiting one runs in its place
    engine.submit([1], SamplingParams(max_tokens=4000))
    assert refusal_seconds(engine) == 3  # 30 tokens to go
