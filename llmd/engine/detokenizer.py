"""Token ids to text, one step at a time: UTF-8 safe, stop strings, no full re-decode.

A byte-level BPE splits many characters (Korean, CJK, emoji) across tokens. Decoding a
partial character yields U+FFFD; we hold such text back until the character completes,
so a chunk carries U+FFFD only where the complete text has one. Each step decodes a
short window of recent tokens, never the whole sequence.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"
# Prompt tokens decoded before the first new token, so a tokenizer that drops a leading
# space at the start of a decode (SentencePiece) still renders the first word correctly.
CONTEXT_TOKENS = 4


class TokenDecoder(Protocol):
    """The one tokenizer call the detokenizer needs."""

    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    """Turns one request's new token ids into text deltas."""

    def __init__(self, decoder: TokenDecoder, prompt_ids: list[int]) -> None:
        self._decoder = decoder
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (often empty mid-character)."""
        self._ids.append(token_id)
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decoder.decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The text still held back, as the complete decode renders it (may hold U+FFFD)."""
        prefix_text = self._decoder.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decoder.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]


class StopMatcher:
    """Finds stop strings across chunk boundaries and holds back possible beginnings."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""

    def feed(self, delta: str, check: bool = True) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached); unchecked, all of it."""
        if not self._stops:
            return delta, False
        text = self._pending + delta
        if not check:  # before `min_tokens`: nothing may stop, so nothing is held back
            self._pending = ""
            return text, False
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._pending = ""
            return text[:cut], True
        held = self._longest_stop_prefix_suffix(text)
        self._pending = text[len(text) - held :]
        return text[: len(text) - held], False

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason."""
        text, self._pending = self._pending, ""
        return text

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


class OutputText:
    """One request's text pipeline: detokenize, then match stop strings."""

    def __init__(self, decoder: TokenDecoder, prompt_ids: list[int], stops: tuple[str, ...]):
        self._detokenizer = IncrementalDetokenizer(decoder, prompt_ids)
        self._stops = StopMatcher(stops)

    def push(self, token_id: int, check_stops: bool = True) -> tuple[str, bool]:
        """Text to emit for one new token, and whether a stop string ended the output
        (never when not `check_stops`: the request's first `min_tokens` tokens)."""
        return self._stops.feed(self._detokenizer.push(token_id), check_stops)

    def finish(self) -> str:
        """Everything still held back, when generation ends by length or EOS."""
        text, stopped = self._stops.feed(self._detokenizer.flush())
        return text if stopped else text + self._stops.flush()
