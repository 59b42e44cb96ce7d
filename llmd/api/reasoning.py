"""Splitting a reasoning model's generated text into thinking and answer, as it streams.

A reasoning model writes `<think>…</think>` before its answer (or, where the prompt already
opened `<think>`, as DeepSeek-R1 distills and Qwen3-thinking-2507 do, just `…</think>`). The
markers never reach the client; text that might be the start of a marker waits until the next
piece decides it, so where the stream happens to be cut never changes what either channel
gets. Only one thinking section: a `<think>` after the answer has begun is answer text. Pure.
"""

from __future__ import annotations

import enum

from llmd.engine.tool_format import ReasoningMarkers


class Channel(enum.Enum):
    """Where a piece of generated text goes: the answer or the thinking."""

    CONTENT = "content"
    REASONING = "reasoning"


class _Phase(enum.Enum):
    OPENING = enum.auto()  # nothing but whitespace yet: a `<think>` may still open thinking
    THINKING = enum.auto()
    CLOSING = enum.auto()  # right after `</think>`: the whitespace before the answer is dropped
    ANSWER = enum.auto()


Piece = tuple[Channel, str]


class ReasoningSplitter:
    """Turns generated text, fed in arbitrary pieces, into (channel, text) pieces."""

    def __init__(self, markers: ReasoningMarkers, in_reasoning: bool) -> None:
        """`in_reasoning`: the prompt already opened thinking, so the output starts in it."""
        self._markers = markers
        self._first = Channel.REASONING if in_reasoning else Channel.CONTENT
        self._phase = _Phase.OPENING
        self._held = ""

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` decides; a possible marker start is held for the next call."""
        out: list[Piece] = []
        rest: str | None = self._held + text
        self._held = ""
        while rest is not None:
            rest = self._step(rest, out)
        return _merged(out)

    def finish(self) -> list[Piece]:
        """Whatever was held back, now that the output has ended: a marker start that never
        completed is text of the channel it sat in."""
        held, self._held = self._held, ""
        channel = self._first if self._phase is _Phase.OPENING else Channel.REASONING
        return _merged([(channel, held)])

    def _step(self, text: str, out: list[Piece]) -> str | None:
        """Handle `text` in the current phase; the text left for the next phase, or None."""
        if self._phase is _Phase.OPENING:
            return self._opening(text)
        if self._phase is _Phase.THINKING:
            return self._thinking(text, out)
        if self._phase is _Phase.CLOSING:
            return self._closing(text)
        out.append((Channel.CONTENT, text))
        return None

    def _opening(self, text: str) -> str | None:
        start = self._markers.start
        begun = text.lstrip()
        if start and begun.startswith(start):
            self._phase = _Phase.THINKING
            return begun[len(start):]
        if start.startswith(begun) and len(begun) < len(start):
            self._held = text
            return None
        self._phase = _Phase.THINKING if self._first is Channel.REASONING else _Phase.ANSWER
        return text

    def _thinking(self, text: str, out: list[Piece]) -> str | None:
        end = self._markers.end
        at = text.find(end) if end else -1
        if at >= 0:
            out.append((Channel.REASONING, text[:at]))
            self._phase = _Phase.CLOSING
            return text[at + len(end):]
        keep = len(text) - partial_suffix(text, end)
        out.append((Channel.REASONING, text[:keep]))
        self._held = text[keep:]
        return None

    def _closing(self, text: str) -> str | None:
        answer = text.lstrip()
        if not answer:
            return None
        self._phase = _Phase.ANSWER
        return answer


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` without completing it."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def _merged(pieces: list[Piece]) -> list[Piece]:
    """Drop empty pieces and join neighbours of one channel."""
    out: list[Piece] = []
    for channel, text in pieces:
        if not text:
            continue
        if out and out[-1][0] is channel:
            out[-1] = (channel, out[-1][1] + text)
        else:
            out.append((channel, text))
    return out
