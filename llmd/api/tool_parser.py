"""Turning a chat completion's generated text into content and tool calls, as it streams.

The text arrives in arbitrary pieces; `ToolCallParser` answers each with the pieces it has
decided: content (`TextPiece`), a call's start with its whole name (`CallStart`), and its
arguments as JSON text, streamed as the model writes them (`CallArguments`). Markers, JSON
framing and the whitespace around calls never reach the content; text that might begin a
marker waits until the next piece decides it, so where the stream is cut never changes the
result. A call region that turns out malformed before its name is known is given back as the
text it was.

Formats (llmd.engine.tool_format): Hermes and the generic format (`<tool_call>{json}</tool_call>`),
Llama 3 JSON (`{"name": ..., "parameters": ...}`, optionally after `<|python_tag|>`), Mistral
(`[TOOL_CALLS][{...}, ...]`, or `[TOOL_CALLS]NAME[ARGS]{...}` in its newer templates) and
Qwen3-Coder XML (`<function=NAME><parameter=KEY>VALUE...`).
Pure: no engine, no tokenizer.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from llmd.api.qwen3_coder import Qwen3CoderReader
from llmd.api.tool_readers import CallSink, JsonCallReader, MistralReader, Status
from llmd.engine.tool_format import ToolFormat, ToolSyntax


@dataclass(frozen=True, slots=True)
class TextPiece:
    """Content: text that is no part of a call."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """Call `index` begins; `name` is its complete function name."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    """The next fragment of call `index`'s arguments JSON text."""

    index: int
    fragment: str


ToolPiece = TextPiece | CallStart | CallArguments

_SPACE = " \t\r\n"
_LLAMA_FIRST_KEYS = ('"name"', '"type"')  # Llama 3.x sometimes writes "type": "function" first
_ARGUMENT_KEYS = frozenset({"arguments", "parameters"})


class _Hit(enum.Enum):
    NONE = enum.auto()
    PARTIAL = enum.auto()  # the text ends inside what may still become the marker
    FULL = enum.auto()


class _Marker(Protocol):
    @property
    def opens_call(self) -> bool: ...

    @property
    def first(self) -> str: ...

    def match(self, text: str, at: int) -> tuple[_Hit, int]: ...


@dataclass(frozen=True, slots=True)
class _Literal:
    """A fixed marker string: one that opens a call, or a stray one dropped from content."""

    text: str
    opens_call: bool

    @property
    def first(self) -> str:
        return self.text[0]

    def match(self, text: str, at: int) -> tuple[_Hit, int]:
        """Whether `text` holds this marker at `at`, and its length there."""
        if text.startswith(self.text, at):
            return _Hit.FULL, len(self.text)
        tail = text[at:at + len(self.text)]
        if len(tail) < len(self.text) and self.text.startswith(tail):
            return _Hit.PARTIAL, 0
        return _Hit.NONE, 0


@dataclass(frozen=True, slots=True)
class _JsonCallStart:
    """Llama 3's call marker is the call itself: a JSON object whose first key is "name".

    The scanner eats nothing of it (length 0): the JSON reader reads it from its `{`."""

    opens_call: bool = True
    first: str = "{"

    def match(self, text: str, at: int) -> tuple[_Hit, int]:
        """Whether a call object begins at `at`."""
        if text[at] != "{":
            return _Hit.NONE, 0
        key_at = _past_space(text, at + 1)
        if key_at == len(text):
            return _Hit.PARTIAL, 0
        for key in _LLAMA_FIRST_KEYS:
            if text.startswith(key, key_at):
                return _Hit.FULL, 0
            tail = text[key_at:key_at + len(key)]
            if len(tail) < len(key) and key.startswith(tail):
                return _Hit.PARTIAL, 0
        return _Hit.NONE, 0


def _past_space(text: str, at: int) -> int:
    """The first position from `at` on that is not whitespace."""
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


class _Reader(Protocol):
    def feed(self, text: str, at: int) -> tuple[int, Status]: ...

    def finish(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Framing:
    """Where one format's calls sit in the text: its markers, what separates calls, and the
    reader for what follows a call marker."""

    markers: tuple[_Marker, ...]
    separators: str
    reader: Callable[[CallSink], _Reader]


def _framing(format: ToolFormat, parameters: Mapping[str, Mapping[str, Any]]) -> _Framing:
    """The framing of `format`'s calls."""
    keys = _ARGUMENT_KEYS | {format.arguments_key}
    if format.syntax is ToolSyntax.LLAMA3_JSON:
        return _Framing((_Literal("<|python_tag|>", False), _JsonCallStart()), _SPACE + ";",
                        lambda sink: JsonCallReader(sink, keys))
    if format.syntax is ToolSyntax.MISTRAL:
        return _Framing(_literals(format), _SPACE, lambda sink: MistralReader(sink, keys))
    if format.syntax is ToolSyntax.QWEN3_CODER:
        return _Framing(_literals(format), _SPACE, lambda sink: Qwen3CoderReader(sink, parameters))
    return _Framing(_literals(format), _SPACE, lambda sink: JsonCallReader(sink, keys))


def _literals(format: ToolFormat) -> tuple[_Marker, ...]:
    """The format's start marker, and its end marker where a call has one of its own."""
    pairs = ((format.start, True), (format.end, False))
    return tuple(_Literal(text, opens) for text, opens in pairs if text)


class ToolCallParser:
    """Turns generated text, fed in arbitrary pieces, into content and tool-call pieces."""

    def __init__(self, format: ToolFormat,
                 parameters: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """`parameters`: each tool's JSON-schema `parameters`, by tool name (Qwen3-Coder's XML
        values become JSON by their declared types)."""
        self._framing = _framing(format, parameters or {})
        firsts = "".join(sorted({marker.first for marker in self._framing.markers}))
        self._candidates = re.compile(f"[{re.escape(firsts)}]" if firsts else "(?!)")
        self._text = ""  # what has arrived and is not yet decided, from `_at` on
        self._at = 0
        self._out = _Output()
        self._reader: _Reader | None = None
        self._raw: list[str] | None = None  # the open call region's text while it has no call
        self._calls_before = 0  # calls started before the open region
        self._after_call = False

    @property
    def calls(self) -> int:
        """How many calls have started so far."""
        return self._out.calls

    def feed(self, text: str) -> list[ToolPiece]:
        """The pieces `text` decides; what may still be a marker is held for the next call."""
        self._text = self._text[self._at:] + text
        self._at = 0
        self._run()
        return self._out.take()

    def finish(self) -> list[ToolPiece]:
        """The rest, now that the output has ended: a marker start that never completed is
        content; an unfinished call gives what arguments it has ("{}" if none)."""
        if self._reader is not None:
            self._reader.finish()
            self._reader = None
        else:
            self._out.text(self._leading_cut(self._text[self._at:]))
        self._text, self._at = "", 0
        return self._out.take()

    def _run(self) -> None:
        """Decide as much of the held text as can be decided."""
        while self._at < len(self._text):
            busy = self._scan_text() if self._reader is None else self._read_call()
            if not busy:
                return

    def _scan_text(self) -> bool:
        """Emit content up to the next marker; True when a call reader took over."""
        text, search = self._text, self._at
        while (found := self._candidates.search(text, search)) is not None:
            at = found.start()
            marker, hit, length = self._match(at)
            if hit is _Hit.NONE:
                search = at + 1
                continue
            dropped = self._text_until(at, hit is _Hit.FULL)
            if hit is _Hit.PARTIAL:
                return False
            self._at = at + length
            if marker.opens_call:
                self._open_call(dropped + text[at:at + length])
                return True
            search = self._at
        self._text_until(len(text), False)
        return False

    def _match(self, at: int) -> tuple[_Marker, _Hit, int]:
        """The marker found at `at`: a complete one first, else one that may still be."""
        hits = [(marker, *marker.match(self._text, at)) for marker in self._framing.markers]
        for wanted in (_Hit.FULL, _Hit.PARTIAL):
            for marker, hit, length in hits:
                if hit is wanted:
                    return marker, hit, length
        return hits[0]

    def _text_until(self, end: int, at_marker: bool) -> str:
        """Emit the content before `end`; whitespace at its end waits to see what follows. A
        marker drops it: that whitespace, returned (a call region given back has it again)."""
        text = self._leading_cut(self._text[self._at:end])
        kept = text.rstrip(_SPACE)
        self._out.text(kept)
        self._at = end if at_marker else end - (len(text) - len(kept))
        return text[len(kept):]

    def _leading_cut(self, text: str) -> str:
        """`text` without the separators right after a call."""
        if not self._after_call:
            return text
        text = text.lstrip(self._framing.separators)
        self._after_call = not text
        return text

    def _open_call(self, marker: str) -> None:
        self._reader = self._framing.reader(self._out)
        self._raw, self._calls_before = [marker], self._out.calls

    def _read_call(self) -> bool:
        """Feed the open call's reader; True when the call region ended."""
        assert self._reader is not None
        start = self._at
        self._at, status = self._reader.feed(self._text, start)
        if self._out.calls > self._calls_before:
            self._raw = None
        if self._raw is not None:
            self._raw.append(self._text[start:self._at])
        if status is Status.MORE:
            return False
        self._close_call(status is Status.FAILED)
        return True

    def _close_call(self, failed: bool) -> None:
        """The call region is over; a malformed one that never named a call is content."""
        assert self._reader is not None
        if failed:
            self._reader.finish()
        given_back = failed and self._raw is not None
        if given_back and self._raw is not None:
            self._out.text("".join(self._raw))
        self._reader, self._raw = None, None
        self._after_call = not given_back


class _Output:
    """The pieces decided and not yet taken; the readers' CallSink."""

    def __init__(self) -> None:
        self._pieces: list[ToolPiece] = []
        self.calls = 0

    def text(self, text: str) -> None:
        """Content."""
        if text:
            self._pieces.append(TextPiece(text))

    def start_call(self, name: str) -> int:
        """A call named `name` begins; its index."""
        self._pieces.append(CallStart(self.calls, name))
        self.calls += 1
        return self.calls - 1

    def call_arguments(self, index: int, fragment: str) -> None:
        """The next fragment of call `index`'s arguments."""
        if fragment:
            self._pieces.append(CallArguments(index, fragment))

    def take(self) -> list[ToolPiece]:
        """The pieces decided since the last take, neighbours of one kind joined."""
        pieces, self._pieces = self._pieces, []
        return _joined(pieces)


def _joined(pieces: list[ToolPiece]) -> list[ToolPiece]:
    """Join adjacent text pieces, and adjacent argument fragments of one call."""
    out: list[ToolPiece] = []
    for piece in pieces:
        last = out[-1] if out else None
        if isinstance(piece, TextPiece) and isinstance(last, TextPiece):
            out[-1] = TextPiece(last.text + piece.text)
        elif (isinstance(piece, CallArguments) and isinstance(last, CallArguments)
              and last.index == piece.index):
            out[-1] = CallArguments(piece.index, last.fragment + piece.fragment)
        else:
            out.append(piece)
    return out
