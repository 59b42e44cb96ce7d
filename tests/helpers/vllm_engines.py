"""llmd's vLLM engine inside a test: started under a generous guard (failing with what stopped it),
its streams read to the end, and shut down however the test ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from llmd.engine.stream import GenerationStream
from llmd.engine.types import TokenEvent
from llmd.engine.vllm.engine import VllmEngine

START_GUARD = 600.0  # seconds: vLLM starts in 20-60 s on a busy CPU; only a hung start waits this long


async def read(stream: GenerationStream) -> list[TokenEvent]:
    """Every event of a stream, closing it after."""
    with stream:
        return [event async for event in stream]


async def started(engine: VllmEngine, needed: Coroutine[Any, Any, None] | None = None) -> None:
    """Until vLLM is up; fails with what stopped it otherwise. `needed` is a watch on something the
    start depends on (a worker node): raising, it fails the start with its own reason."""
    watches: list[asyncio.Future[Any]] = [] if needed is None else [asyncio.ensure_future(needed)]
    try:
        await engine.start()
        assert engine.failed is not None
        watches += [asyncio.ensure_future(engine.ready.wait()),
                    asyncio.ensure_future(asyncio.shield(engine.failed))]
        done, _ = await asyncio.wait(watches, timeout=START_GUARD, return_when=asyncio.FIRST_COMPLETED)
        for watch in done:
            watch.result()  # a failed watch raises its reason here
    finally:
        for watch in watches:
            watch.cancel()
    why = engine.failed.result() if engine.failed.done() else "no answer in time"
    assert engine.ready.is_set(), f"vLLM did not start: {why}"


@contextlib.asynccontextmanager
async def running(engine: VllmEngine, needed: Coroutine[Any, Any, None] | None = None
                  ) -> AsyncIterator[VllmEngine]:
    """The engine started (see `started`), shut down when the block ends, however it ends."""
    try:
        await started(engine, needed)
        yield engine
    finally:
        await engine.shutdown()
