"""Helpers for tests that drive the model runner or the engine on the tiny model.

A chat prompt, greedy sampling parameters, an engine run around a test body, a recorder of
the logits each request samples from, a driver that joins and releases requests step by step,
the text of one stream, a static-cache profile and the count of graphs torch.compile made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch._dynamo
from msgspec.structs import replace

from llmd.config import Profile
from llmd.engine.client import EngineClient
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.sampling import SequenceState
from llmd.engine.types import Request, Sampled, SamplingParams
from llmd.engine.worker import EngineWorker
from tests.helpers.configs import eager_profile

T = TypeVar("T")

PROMPT = [{"role": "user", "content": "Hello there, 안녕?"}]


def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    """Greedy sampling for `max_tokens` tokens, with any other parameters given."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kwargs)  # type: ignore[arg-type]


def record_logits(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[torch.Tensor]]:
    """Capture the logits each request's token is chosen from, keyed by its (distinct) max_tokens.

    Recorded where every row passes, sampled or greedy from the batch's argmax: `accept`, as the
    model gave them (before the request's own steering)."""
    import llmd.engine.model.sequences as sequences_module

    seen: dict[int, list[torch.Tensor]] = {}
    real_accept = sequences_module.accept

    def recording_accept(state: SequenceState, params: SamplingParams, logits: torch.Tensor,
                         *rest: Any) -> Sampled:
        seen.setdefault(params.max_tokens, []).append(logits.clone())
        return real_accept(state, params, logits, *rest)

    monkeypatch.setattr(sequences_module, "accept", recording_accept)
    return seen


def staggered_batch(
    runner: ModelRunner, requests: list[Request], steps: int, leave: dict[int, str]
) -> dict[str, list[int]]:
    """Request k joins at step k; `leave[step]` is released (aborted) after that step."""
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    running: list[Request] = []
    for step in range(steps):
        for request, token in zip(running, runner.decode(running), strict=True):
            tokens[request.request_id].append(token)
        if step < len(requests):
            tokens[requests[step].request_id].append(runner.first_token(requests[step]))
            running.append(requests[step])
        if step in leave:
            runner.release(leave[step])
            running = [r for r in running if r.request_id != leave[step]]
    return tokens


async def text_of(engine: EngineClient, params: SamplingParams) -> tuple[str, str]:
    """The text PROMPT streams back from the engine, and its finish reason."""
    prompt = await engine.encode_chat(PROMPT)
    with engine.submit(prompt, params) as stream:
        events = [event async for event in stream]
    return "".join(e.text for e in events), events[-1].finish_reason.value  # type: ignore[union-attr]


def static_profile(**changes: object) -> Profile:
    """The cpu profile on the static KV cache, with `changes`."""
    compiled = changes.get("compile", "none") != "none"  # compile packs its own weights
    return replace(eager_profile(), kv_cache="static", onednn_linear=not compiled, **changes)


def unique_graphs() -> int:
    """How many graphs torch.compile has made in this process."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def run_with_engine(
    tiny_model: Path, body: Callable[[EngineClient, EngineWorker], Awaitable[T]], **profile: object
) -> T:
    """Start an engine (a worker and its client) on the tiny model, run `body`, shut the engine down."""
    import msgspec

    config = msgspec.structs.replace(eager_profile(), **profile)

    async def main() -> T:
        worker = EngineWorker(tiny_model, config)
        engine = EngineClient(worker, max_context=512)
        await engine.start()
        await asyncio.wait_for(engine.ready.wait(), 60)
        try:
            return await body(engine, worker)
        finally:
            await engine.shutdown()

    return asyncio.run(main())
