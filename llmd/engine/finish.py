"""When a request ends: the finish decision for one new token, pure (no model, no thread).

A token ends its request when it is an end-of-sequence id (STOP; what the detokenizer still
held back is flushed), when its text completes a stop string (STOP; the stop string and what
follows are cut), or when it is the last the request may have (LENGTH).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmd.engine.detokenizer import OutputText
from llmd.engine.types import FinishReason


@dataclass(frozen=True, slots=True)
class TokenText:
    """What one new token gives its request: text to send, and why the request ends, if it does."""

    text: str
    finish_reason: FinishReason | None = None


def next_text(output: OutputText, token: int, generated: int, max_tokens: int,
              eos_token_ids: frozenset[int]) -> TokenText:
    """The text of the request's `generated`-th token and the finish decision it brings."""
    if token in eos_token_ids:
        return TokenText(output.finish(), FinishReason.STOP)
    text, stopped = output.push(token)
    if stopped:
        return TokenText(text, FinishReason.STOP)
    if generated >= max_tokens:
        return TokenText(text + output.finish(), FinishReason.LENGTH)
    return TokenText(text)
