"""The engine on a static-cache profile: it serves, and compiles once before ready, never while serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
import torch._dynamo

from llmd.bench.decoder import InProcessDecoder
from llmd.engine.client import EngineClient
from llmd.engine.worker import EngineWorker
from tests.helpers.engine import PROMPT, greedy, static_profile, text_of, unique_graphs


def test_the_engine_serves_a_static_profile(tiny_model: Path) -> None:
    async def main() -> tuple[str, str, float]:
        worker = EngineWorker(tiny_model, static_profile(max_running=2))
        engine = EngineClient(worker, max_context=512)
        await engine.start()
        await asyncio.wait_for(engine.ready.wait(), 60)
        try:
            text, reason = await text_of(engine, greedy(30))
            return text, reason, worker.compile_seconds
        finally:
            await engine.shutdown()

    text, reason, warm_up_seconds = asyncio.run(main())
    decoder = InProcessDecoder(tiny_model)
    expected = decoder.tokenizer.decode(decoder.decode(decoder.prompt_ids(PROMPT), 30).token_ids)
    assert (text, reason) == (expected, "length") and warm_up_seconds > 0


async def complete(engine: EngineClient, words: int, max_tokens: int) -> str:
    prompt = await engine.encode_chat([{"role": "user", "content": "word " * words}])
    engine.check_context(len(prompt), max_tokens)  # as the API does: requests fit their context
    with engine.submit(prompt, greedy(max_tokens)) as stream:
        return "".join([event.text async for event in stream])


def test_the_engine_compiles_before_ready_and_never_while_serving(tiny_model: Path) -> None:
    """The worker thread compiles at warm-up; a queue of mixed requests then changes nothing."""
    profile = static_profile(max_running=3, max_context=64, compile="default")

    async def main() -> tuple[int, list[str], float]:
        worker = EngineWorker(tiny_model, profile)
        engine = EngineClient(worker, max_context=64)
        await engine.start()
        await asyncio.wait_for(engine.ready.wait(), 300)
        try:
            graphs = unique_graphs()
            with torch._dynamo.config.patch(error_on_recompile=True):
                texts = await asyncio.gather(*(complete(engine, 1 + 2 * k, 8 + 3 * k) for k in range(6)))
            assert unique_graphs() == graphs
            return graphs, texts, worker.compile_seconds
        finally:
            await engine.shutdown()

    before = unique_graphs()
    graphs, texts, compile_seconds = asyncio.run(main())
    assert graphs == before + 1 and compile_seconds > 0  # compiled once, before ready
    decoder = InProcessDecoder(tiny_model)
    for k, text in enumerate(texts):
        prompt = decoder.prompt_ids([{"role": "user", "content": "word " * (1 + 2 * k)}])
        assert text == decoder.tokenizer.decode(decoder.decode(prompt, 8 + 3 * k).token_ids), k
