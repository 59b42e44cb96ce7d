"""The engine's prompt limits: an oversized chat refused early, only large prompts queued for a slot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmd.engine.client import EngineClient
from llmd.engine.prompt_limits import LARGE_PROMPT_CHARS, LARGE_PROMPT_SLOTS
from llmd.errors import ContextLengthExceeded
from tests.helpers.configs import eager_profile


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_the_engine_refuses_early_and_queues_only_large_prompts(tiny_model: Path) -> None:
    async def main() -> None:
        from llmd.engine.worker import EngineWorker  # the model side, only for this test

        engine = EngineClient(EngineWorker(tiny_model, eager_profile()), max_context=512)
        await engine.start()
        try:
            with pytest.raises(ContextLengthExceeded, match="at least"):
                await engine.encode_chat(chat("word " * 200_000))
            for _ in range(LARGE_PROMPT_SLOTS):  # every large-prompt slot busy
                await engine._large_prompt_slots.acquire()
            large = asyncio.create_task(engine.encode_chat(chat("word " * (LARGE_PROMPT_CHARS // 4))))
            assert len(await asyncio.wait_for(engine.encode_chat(chat("small")), 60)) > 0
            assert not large.done()
            engine._large_prompt_slots.release()
            with pytest.raises(ContextLengthExceeded):
                await asyncio.wait_for(large, 60)
        finally:
            await engine.shutdown()

    asyncio.run(main())
