"""The worker times each step twice: the whole of it (scheduled to delivered) and its forward pass,
so /metrics shows what serving the tokens costs beside the model (`llmd_engine_*_seconds_total`)."""

from __future__ import annotations

import time
from pathlib import Path

from llmd.engine.client import EngineClient
from llmd.engine.worker import EngineWorker
from tests.helpers.engine import PROMPT, greedy, run_with_engine


def test_steps_are_timed_whole_and_in_their_forward_pass(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        before = worker.stats()
        assert before.step_seconds is not None and before.forward_seconds is not None
        prompt = await engine.encode_chat(PROMPT)
        started = time.perf_counter()
        with engine.submit(prompt, greedy(12, ignore_eos=True)) as stream:
            assert len([event async for event in stream]) == 12
        after = worker.stats()  # then the clock: every step counted in it ended before
        wall = time.perf_counter() - started
        assert after.step_seconds is not None and after.forward_seconds is not None
        assert after.steps - before.steps >= 12  # a prefill, then a step per further token
        forward = after.forward_seconds - before.forward_seconds
        whole = after.step_seconds - before.step_seconds
        # Both counted only while steps run (no idle time), the forward pass inside its step; the
        # last step may still be adding its own, the whole before the part.
        assert 0 < forward < whole < wall

    run_with_engine(tiny_model, body)
