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

    @property
    def prompt_logprobs(self) -> Sequence[Mapping[int, ScoredToken] | None] | None:
        """When asked: the prompt's positions scored since the last output (the first position,
        which nothing predicts, None or empty); in DELTA mode they come before the first token."""
        ...


Scorer = Callable[[RawScores], TokenLogprobs]  # ids and floats to the API's logprobs (`TokenBytes`)
# The prompt's scored positions, gathered until the first token, to the API's prompt logprobs.
PromptScorer = Callable[[Sequence[Mapping[int, ScoredToken] | None]], tuple[TokenLogprobs, ...]]


async def token_events(deltas: AsyncIterator[RequestDelta], output: OutputText, params: SamplingParams,
                       eos_token_ids: frozenset[int], abort: Callable[[], Awaitable[None]],
                       scorer: Scorer | None = None,
                       prompt_scorer: PromptScorer | None = None) -> AsyncIterator[TokenEvent]:
    """One event per generated token, the last with its finish reason (or an error); with `scorer`
    and `params.logprobs`, each event whose token's text is output carries its logprobs; with
    `prompt_scorer`, the first event carries the prompt's (`params.prompt_logprobs`)."""
    generated = 0
    prompt_positions: list[Mapping[int, ScoredToken] | None] = []
    async for delta in deltas:
        completion = delta.outputs[0]
        if prompt_scorer is not None and delta.prompt_logprobs:
            prompt_positions += delta.prompt_logprobs
        for index, token in enumerate(completion.token_ids):
            generated += 1
            step = next_text(output, token, generated, params, eos_token_ids)
            first = generated == 1
            cached = (delta.num_cached_tokens or 0) if first else None
            scores = None if step.by_id or scorer is None else scored(completion, index, token, params)
            logprobs = scorer(scores) if scorer is not None and scores is not None else None
            prompt = prompt_scorer(prompt_positions) if first and prompt_scorer is not None else None
            yield TokenEvent(step.text, generated, step.finish_reason, cached_tokens=cached,
                             logprobs=logprobs, prompt_logprobs=prompt)
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
    """The `index`-th new token's scores as llmd keeps them (`ranked`), `params.logprobs` of them."""
    if params.logprobs is None or not completion.logprobs or index >= len(completion.logprobs):
        return None
    return ranked(completion.logprobs[index], token, params.logprobs)


def ranked(position: Mapping[int, ScoredToken] | None, token: int, top: int) -> RawScores | None:
    """A position's scores as llmd keeps them: `token`'s logprob, and the `top` likeliest tokens by
    vLLM's rank (vLLM adds the token itself to them when it ranks lower); None where the position
    does not score `token`."""
    chosen = None if position is None else position.get(token)
    if position is None or chosen is None:
        return None
    order = sorted((entry.rank or 0, token_id, entry.logprob) for token_id, entry in position.items())
    best = [(token_id, logprob) for rank, token_id, logprob in order if 1 <= rank <= top]
    return RawScores(token, chosen.logprob, tuple(i for i, _ in best), tuple(v for _, v in best))


def prompt_raw_scores(prompt_ids: Sequence[int], positions: Sequence[Mapping[int, ScoredToken] | None],
                      top: int) -> list[RawScores | None]:
    """Each prompt token's scores from vLLM's prompt positions (one per prompt token, aligned at the
    start); None for the first token, which nothing predicts, and wherever vLLM gave none."""
    found = list(positions)[:len(prompt_ids)]
    found += [None] * (len(prompt_ids) - len(found))
    return [None if index == 0 else ranked(position, token, top)
            for index, (token, position) in enumerate(zip(prompt_ids, found, strict=True))]
