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
from collections.abc import Sequence
from dataclasses import dataclass

from llmd.engine.types import LOGPROB_FLOOR, Logprob, TokenLogprobs
from llmd.protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob


@dataclass(frozen=True, slots=True)
class Scored:
    """A token of a choice's text with its logprobs and the character offset where its text starts
    (a prompt's first token has no logprob: nothing predicted it)."""

    offset: int
    token: str
    position: TokenLogprobs

    @property
    def logprob(self) -> float:
        """The token's own logprob (0 for a first prompt token)."""
        return self.position.chosen.logprob or 0.0


def floored(logprob: float) -> float:
    """A logprob JSON can carry: -inf (and NaN) become `LOGPROB_FLOOR`."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def known(entry: Logprob) -> float:
    """A sampled or alternative token's logprob, floored. Only a prompt's first token has none, and
    only the completions API's echo shows it (as null); read as the floor anywhere else."""
    return LOGPROB_FLOOR if entry.logprob is None else floored(entry.logprob)


def top_logprob(entry: Logprob) -> TopLogprob:
    """One of a position's likeliest tokens, chat's shape (`bytes`: the token's own raw bytes)."""
    return TopLogprob(entry.text, known(entry), list(entry.raw))


def token_logprob(position: TokenLogprobs) -> TokenLogprob:
    """A sampled token and its position's likeliest tokens, chat's shape."""
    chosen = position.chosen
    return TokenLogprob(chosen.text, known(chosen), list(chosen.raw),
                        [top_logprob(entry) for entry in position.top])


def chat_logprobs(positions: Sequence[TokenLogprobs]) -> ChoiceLogprobs:
    """A chat choice's (or a chunk's) `logprobs` over these sampled tokens."""
    return ChoiceLogprobs([token_logprob(position) for position in positions])


def top_dict(position: TokenLogprobs) -> dict[str, float] | None:
    """The legacy top dict: text → logprob, likeliest first, the sampled token added if missing;
    None for a prompt's first token.

    Two tokens with the same text (two halves of characters, say) keep the likelier one's.
    """
    if position.chosen.logprob is None:
        return None
    top: dict[str, float] = {}
    for entry in (*position.top, position.chosen):
        top.setdefault(entry.text, known(entry))
    return top


def completion_logprobs(scored: Sequence[Scored]) -> CompletionLogprobs:
    """The legacy `logprobs` of these tokens (their offsets from the start of the choice's text)."""
    return CompletionLogprobs(
        text_offset=[s.offset for s in scored],
        token_logprobs=[None if s.position.chosen.logprob is None else known(s.position.chosen)
                        for s in scored],
        tokens=[s.token for s in scored],
        top_logprobs=[top_dict(s.position) for s in scored],
    )


def shifted(scored: Sequence[Scored], start: int) -> list[Scored]:
    """The tokens with their offsets moved by `start` (the echoed prompt's length before them)."""
    return [dataclasses.replace(s, offset=s.offset + start) for s in scored] if start else list(scored)


def prompt_scored(prompt_text: str, positions: Sequence[TokenLogprobs]) -> list[Scored]:
    """An echoed prompt's tokens, each at the offset in `prompt_text` (characters) where its bytes
    start; a token the text does not hold (BOS, a control token) takes no room, and one that goes
    on with a character started before it is placed at that character."""
    text, cursor, chars = prompt_text.encode(), 0, 0
    scored = []
    for position in positions:
        raw = position.chosen.raw
        inside = bool(raw) and raw[0] & 0xC0 == 0x80  # a UTF-8 continuation byte
        scored.append(Scored(chars - inside, position.chosen.text, position))
        if raw and text.startswith(raw, cursor):
            cursor += len(raw)
            chars += sum(byte & 0xC0 != 0x80 for byte in raw)
    return scored
