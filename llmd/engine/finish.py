"""When a request ends: the finish decision for one new token, pure (no model, no thread).

A token ends its request when it is an end-of-sequence id (unless `ignore_eos`) or one of its
`stop_token_ids` (STOP; the token's own text is not sent, what the detokenizer still held back
is flushed), when its text completes a stop string (STOP; the stop string and what follows are
cut), or when it is the last the request may have (LENGTH). The first `min_tokens` tokens end
nothing but by length: ids and stop strings count from token `min_tokens + 1` on (vLLM's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmd.engine.detokenizer import OutputText
from llmd.engine.types import FinishReason, SamplingParams


@dataclass(frozen=True, slots=True)
class TokenText:
    """What one new token gives its request: text to send, and why the request ends, if it does."""

    text: str
    finish_reason: FinishReason | None = None
    by_id: bool = False  # it ended the request as an id (EOS, a stop id): its own text is not output


def next_text(output: OutputText, token: int, generated: int, params: SamplingParams,
              eos_token_ids: frozenset[int]) -> TokenText:
    """The text of the request's `generated`-th token and the finish decision it brings."""
    armed = generated > params.min_tokens
    if armed and ends_request(token, params, eos_token_ids):
        return TokenText(output.finish(), FinishReason.STOP, by_id=True)
    text, stopped = output.push(token, check_stops=armed)
    if stopped:
        return TokenText(text, FinishReason.STOP)
    if generated >= params.max_tokens:
        return TokenText(text + output.finish(), FinishReason.LENGTH)
    return TokenText(text)


def ends_request(token: int, params: SamplingParams, eos_token_ids: frozenset[int]) -> bool:
    """Whether `token` is one that stops the request: a stop id, or EOS when EOS counts."""
    return token in params.stop_token_ids or (not params.ignore_eos and token in eos_token_ids)
