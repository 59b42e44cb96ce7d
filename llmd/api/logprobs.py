"""The engine's `TokenLogprobs` in OpenAI's two wire shapes: chat's and the legacy completions'.

Chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}`.
Completions: `{text_offset, token_logprobs, tokens, top_logprobs: [{token: logprob}]}`, where the
top dict also holds the sampled token (so up to `logprobs + 1` entries, as OpenAI says), and the
first prompt token of an echo has null for both. Logprobs describe the model's raw distribution
(`SamplingParams`); one too small for a float JSON can carry becomes OpenAI's -9999.0. Pure: only
requests that asked for logprobs ever reach this module.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from llmd.engine.types import Logprob, TokenLogprobs
from llmd.protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob

# OpenAI's stand-in for "too unlikely to say": JSON has no -inf, and msgspec would write null.
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class Scored:
    """A token of a choice's text with its logprobs (None for a prompt's first token, which has
    none) and the character offset where its text starts."""

    offset: int
    token: str
    position: TokenLogprobs | None

    @property
    def logprob(self) -> float:
        """The token's own logprob (0 for a first prompt token: nothing predicted it)."""
        return 0.0 if self.position is None else self.position.chosen.logprob


def floored(logprob: float) -> float:
    """A logprob JSON can carry: -inf (and NaN) become `LOGPROB_FLOOR`."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def top_logprob(entry: Logprob) -> TopLogprob:
    """One of a position's likeliest tokens, chat's shape (`bytes`: the token's own raw bytes)."""
    return TopLogprob(entry.text, floored(entry.logprob), list(entry.raw))


def token_logprob(position: TokenLogprobs) -> TokenLogprob:
    """A sampled token and its position's likeliest tokens, chat's shape."""
    chosen = position.chosen
    return TokenLogprob(chosen.text, floored(chosen.logprob), list(chosen.raw),
                        [top_logprob(entry) for entry in position.top])


def chat_logprobs(positions: Sequence[TokenLogprobs]) -> ChoiceLogprobs:
    """A chat choice's (or a chunk's) `logprobs` over these sampled tokens."""
    return ChoiceLogprobs([token_logprob(position) for position in positions])


def top_dict(position: TokenLogprobs) -> dict[str, float]:
    """The legacy top dict: text → logprob, likeliest first, the sampled token added if missing.

    Two tokens with the same text (two halves of characters, say) keep the likelier one's.
    """
    top: dict[str, float] = {}
    for entry in (*position.top, position.chosen):
        top.setdefault(entry.text, floored(entry.logprob))
    return top


def completion_logprobs(scored: Sequence[Scored]) -> CompletionLogprobs:
    """The legacy `logprobs` of these tokens (their offsets from the start of the choice's text)."""
    return CompletionLogprobs(
        text_offset=[s.offset for s in scored],
        token_logprobs=[None if s.position is None else floored(s.position.chosen.logprob) for s in scored],
        tokens=[s.token for s in scored],
        top_logprobs=[None if s.position is None else top_dict(s.position) for s in scored],
    )


def shifted(scored: Sequence[Scored], start: int) -> list[Scored]:
    """The tokens with their offsets moved by `start` (the echoed prompt's length before them)."""
    return [dataclasses.replace(s, offset=s.offset + start) for s in scored] if start else list(scored)


def prompt_scored(prompt_text: str, positions: Sequence[TokenLogprobs | None]) -> list[Scored]:
    """An echoed prompt's tokens, each at the offset its text starts in `prompt_text`.

    The engine gives no logprobs (so no text) for the first token: its text is what the prompt
    holds before the others' text, when the others' text ends the prompt ("" otherwise).
    """
    if not positions:
        return []
    later = [p.chosen.text if p is not None else "" for p in positions[1:]]
    rest = "".join(later)
    first = prompt_text[: len(prompt_text) - len(rest)] if prompt_text.endswith(rest) else ""
    tokens = [first, *later]
    offsets = itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)
    return [Scored(min(offset, len(prompt_text)), token, position)
            for offset, token, position in zip(offsets, tokens, positions, strict=True)]
