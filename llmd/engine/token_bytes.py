"""Token ids as the logprobs API shows them: each token's own bytes and text, not a decode in context.

OpenAI's logprobs give every token its `bytes`, because a byte-level BPE cuts characters (Korean,
CJK, emoji) across tokens: decoding one token alone gives U+FFFD where its bytes are a part of a
character, and the bytes let a client join them. A byte-level vocabulary writes each byte as a
printable character (GPT-2's alphabet, reversed here); SentencePiece writes a space as U+2581 and
a raw byte as `<0xNN>`; added and special tokens are their text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

from llmd.engine.types import LOGPROB_FLOOR, Logprob, RawScores, TokenLogprobs

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SENTENCEPIECE_SPACE = "\u2581"


def byte_level_alphabet() -> dict[str, int]:
    """The character a byte-level BPE writes for each byte, mapped back to the byte.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) are written
    as the code points from 256 on, in byte order.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    codes = dict(zip(printable, printable, strict=True))
    shifted = (byte for byte in range(256) if byte not in codes)
    codes |= {byte: 256 + index for index, byte in enumerate(shifted)}
    return {chr(code): byte for byte, code in codes.items()}


ALPHABET = byte_level_alphabet()


def uses_byte_level(tokenizer: Any) -> bool:
    """Whether a fast tokenizer's decoder is (or includes) the byte-level one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    return any(part.get("type") == "ByteLevel" for part in parts if isinstance(part, dict))


class TokenScores(Protocol):
    """Token ids' scores as the logprobs API shows them (`TokenBytes`, or a test's fake)."""

    def token_logprobs(self, scores: RawScores) -> TokenLogprobs:
        """A position's scores with each token's own text and bytes."""
        ...

    def logprob(self, token_id: int, value: float | None) -> Logprob:
        """One token with its text and bytes, and `value` (None: a token nothing scored)."""
        ...


def prompt_logprobs(pieces: TokenScores, prompt_ids: Sequence[int],
                    scores: Sequence[RawScores | None]) -> tuple[TokenLogprobs, ...]:
    """A scored prompt's logprobs, one per prompt token (`scores` aligned with `prompt_ids`): each
    token with its text and bytes, without a logprob where nothing scored it (the first token)."""
    return tuple(TokenLogprobs(pieces.logprob(token, None)) if raw is None else pieces.token_logprobs(raw)
                 for token, raw in zip(prompt_ids, scores, strict=True))


class TokenBytes:
    """Each token id's (text, bytes), worked out once per id and kept."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._byte_level = uses_byte_level(tokenizer)
        self._added = {token_id: token.content for token_id, token in tokenizer.added_tokens_decoder.items()}
        self._known: dict[int, tuple[str, bytes]] = {}  # at most one entry per vocabulary id

    def piece(self, token_id: int) -> tuple[str, bytes]:
        """The token's text (its bytes decoded, U+FFFD for a part of a character) and its bytes."""
        known = self._known.get(token_id)
        if known is None:
            raw = self.raw(token_id)
            known = self._known[token_id] = (raw.decode("utf-8", errors="replace"), raw)
        return known

    def raw(self, token_id: int) -> bytes:
        """The token's own bytes (b"" for an id beyond the tokenizer's vocabulary)."""
        if token_id in self._added:
            return self._added[token_id].encode()
        token = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(token, str):
            return b""
        if self._byte_level and all(char in ALPHABET for char in token):
            return bytes(ALPHABET[char] for char in token)
        byte = BYTE_TOKEN.fullmatch(token)
        if byte is not None:
            return bytes([int(byte[1], 16)])
        return token.replace(SENTENCEPIECE_SPACE, " ").encode()

    def logprob(self, token_id: int, value: float | None) -> Logprob:
        """One token's `Logprob`; a non-finite value becomes `LOGPROB_FLOOR` (None stays: unscored)."""
        text, raw = self.piece(token_id)
        return Logprob(token_id, text, raw, value if value is None or math.isfinite(value) else LOGPROB_FLOOR)

    def token_logprobs(self, scores: RawScores) -> TokenLogprobs:
        """A position's scores with each token's text and bytes."""
        top = zip(scores.top_ids, scores.top_logprobs, strict=True)
        return TokenLogprobs(self.logprob(scores.token_id, scores.logprob),
                             tuple(self.logprob(token_id, value) for token_id, value in top))
