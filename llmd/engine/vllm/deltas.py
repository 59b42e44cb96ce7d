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

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from llmd.engine.detokenizer import OutputText
from llmd.engine.finish import next_text
from llmd.engine.types import FinishReason, RawScores, SamplingParams, TokenEvent, TokenLogprobs

VLLM_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class ScoredToken(Protocol):
    """What llmd reads of one `vllm.logprobs.Logprob`."""

    @property
    def logprob(self) -> float: ...

    @property
    def rank(self) -> int | None: ...


class CompletionDelta(Protocol):
    """What llmd reads of one `vllm.outputs.CompletionOutput` in DELTA mode."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def logprobs(self) -> Sequence[Mapping[int, ScoredToken]] | None:
        """Per new token, when asked: its own and the likeliest tokens' logprobs, by id."""
        ...


class RequestDelta(Protocol):
    """What llmd reads of one `vllm.outputs.RequestOutput` in DELTA mode."""

    @property
    def outputs(self) -> Sequence[CompletionDelta]: ...

    @property
    def finished(self) -> bool: ...

    @property
    def num_cached_tokens(self) -> int | None: ...


Scorer = Callable[[RawScores], TokenLogprobs]  # ids and floats to the API's logprobs (`TokenBytes`)


async def token_events(deltas: AsyncIterator[RequestDelta], output: OutputText, params: SamplingParams,
                       eos_token_ids: frozenset[int], abort: Callable[[], Awaitable[None]],
                       scorer: Scorer | None = None) -> AsyncIterator[TokenEvent]:
    """One event per generated token, the last with its finish reason (or an error); with `scorer`
    and `params.logprobs`, each event whose token's text is output carries its logprobs."""
    generated = 0
    async for delta in deltas:
        completion = delta.outputs[0]
        for index, token in enumerate(completion.token_ids):
            generated += 1
            step = next_text(output, token, generated, params, eos_token_ids)
            cached = (delta.num_cached_tokens or 0) if generated == 1 else None
            scores = None if step.by_id or scorer is None else scored(completion, index, token, params)
            logprobs = scorer(scores) if scorer is not None and scores is not None else None
            yield TokenEvent(step.text, generated, step.finish_reason, cached_tokens=cached,
                             logprobs=logprobs)
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


def scored(completion: CompletionDelta, index: int, token: int, params: SamplingParams) -> RawScores | None:
    """The `index`-th new token's scores as llmd keeps them: its logprob, and the `params.logprobs`
    likeliest tokens by vLLM's rank (vLLM adds the sampled token to them when it ranks lower)."""
    if params.logprobs is None or not completion.logprobs or index >= len(completion.logprobs):
        return None
    position = completion.logprobs[index]
    chosen = position.get(token)
    if chosen is None:
        return None
    ranked = sorted((entry.rank or 0, token_id, entry.logprob) for token_id, entry in position.items())
    top = [(token_id, logprob) for rank, token_id, logprob in ranked if 1 <= rank <= params.logprobs]
    return RawScores(token, chosen.logprob, tuple(i for i, _ in top), tuple(v for _, v in top))
