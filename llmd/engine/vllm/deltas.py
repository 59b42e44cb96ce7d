"""A vLLM request's DELTA outputs as llmd's token events: pure of vLLM, tested with a typed fake.

vLLM streams each request as outputs carrying the token ids new since the last one (DELTA). llmd
turns every id into one event through the same text pipeline and finish rule as its native
engine (`finish.next_text`: the detokenizer, stop strings, ending ids, `min_tokens`), so a reply
reads the same on either engine and chunks stay one per token however vLLM groups them. Where llmd
ends a request first (a stop string completed), vLLM's request is aborted; where vLLM ends it and
llmd has not (an abort, an engine-side end), the stream ends with what llmd still held back, or
with an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from llmd.engine.detokenizer import OutputText
from llmd.engine.finish import next_text
from llmd.engine.types import FinishReason, SamplingParams, TokenEvent

VLLM_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class CompletionDelta(Protocol):
    """What llmd reads of one `vllm.outputs.CompletionOutput` in DELTA mode."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def finish_reason(self) -> str | None: ...


class RequestDelta(Protocol):
    """What llmd reads of one `vllm.outputs.RequestOutput` in DELTA mode."""

    @property
    def outputs(self) -> Sequence[CompletionDelta]: ...

    @property
    def finished(self) -> bool: ...

    @property
    def num_cached_tokens(self) -> int | None: ...


async def token_events(deltas: AsyncIterator[RequestDelta], output: OutputText, params: SamplingParams,
                       eos_token_ids: frozenset[int],
                       abort: Callable[[], Awaitable[None]]) -> AsyncIterator[TokenEvent]:
    """One event per generated token, the last with its finish reason (or an error)."""
    generated = 0
    async for delta in deltas:
        completion = delta.outputs[0]
        for token in completion.token_ids:
            generated += 1
            step = next_text(output, token, generated, params, eos_token_ids)
            cached = (delta.num_cached_tokens or 0) if generated == 1 else None
            yield TokenEvent(step.text, generated, step.finish_reason, cached_tokens=cached)
            if step.finish_reason is not None:
                if not delta.finished:
                    await abort()  # llmd ended it (a stop string): vLLM need not go on
                return
        if delta.finished:
            reason = VLLM_FINISH.get(completion.finish_reason or "")
            if reason is None:
                yield TokenEvent("", generated, error=f"the vLLM engine ended the request "
                                                      f"({completion.finish_reason or 'no reason given'})")
            else:
                yield TokenEvent(output.finish(), generated, reason)
            return
    yield TokenEvent("", generated, error="the vLLM engine's stream ended before the request did")
