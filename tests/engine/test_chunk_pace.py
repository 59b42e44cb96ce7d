"""The worker times its steps into the scheduler's `ChunkPace`: a newcomer's prompt chunks beside a
decoding stream price a prompt token, the stream's steps alone time the decode step."""

from __future__ import annotations

from pathlib import Path

from llmd.engine.client import EngineClient
from llmd.engine.worker import EngineWorker
from tests.helpers.engine import PROMPT, greedy, run_with_engine


def test_a_newcomer_beside_a_decoding_stream_prices_its_prompt_tokens(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[int, int]:
        pace = worker.scheduler.pace
        prompt = await engine.encode_chat(PROMPT)
        long_prompt = await engine.encode_chat([{"role": "user", "content": "word " * 60}])
        with engine.submit(prompt, greedy(400, ignore_eos=True)) as running:
            stream = aiter(running)
            for _ in range(3):  # its first token (prefill), then decode steps alone
                await anext(stream)
            # its prompt, prefilled alone, gave at most a first price
            assert pace.decode_seconds is not None and (pace.token_seconds is None or pace.first_price)
            with engine.submit(long_prompt, greedy(2)) as newcomer:
                newcomer_tokens = len([event async for event in newcomer])
            later = [await anext(stream) for _ in range(3)]  # it kept decoding meanwhile
        assert pace.token_seconds is not None and not pace.first_price  # measured beside the stream
        budget = worker.stats().prefill_chunk_tokens  # what /stats and /metrics show
        assert budget == pace.budget() and budget is not None and 2 <= budget <= 8
        return newcomer_tokens, len(later)

    # chunks of 8 beside the stream: the 60-word prompt takes several fused steps
    assert run_with_engine(tiny_model, body, prefill_chunk_tokens=8) == (2, 3)
