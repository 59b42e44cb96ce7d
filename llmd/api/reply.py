"""A chat reply read back as OpenAI's message parts: thinking, content and tool calls.

The generated text goes through the thinking splitter (a reasoning model's `<think>` section
becomes `reasoning_content`), then, when the reply may call tools, the tool-call parser. Each
piece becomes one delta of one kind, never content and calls together: a call's first delta
carries its `index`, `id`, `type`, name and `arguments: ""`, later ones `index` and arguments
text. A plain reply (no tools, not a reasoning model) is not parsed at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmd.api.reasoning import Channel, ReasoningSplitter
from llmd.api.tool_parser import CallArguments, CallStart, TextPiece, ToolCallParser, ToolPiece
from llmd.engine.tool_format import ReasoningMarkers, ToolFormat
from llmd.protocol import Delta, FunctionCall, FunctionDelta, ToolCall, ToolCallDelta


@dataclass(frozen=True, slots=True)
class ReplyShape:
    """How to read one request's replies: the call format when it may call tools, the thinking
    markers when the model reasons (and whether the prompt opened the thinking)."""

    tools: ToolFormat | None = None
    parameters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reasoning: ReasoningMarkers | None = None
    in_reasoning: bool = False

    @property
    def parsed(self) -> bool:
        """Whether the text needs reading at all."""
        return self.tools is not None or self.reasoning is not None


class ReplyParser:
    """One choice's text, fed as it is generated, as deltas; `new_id` names each new call."""

    def __init__(self, shape: ReplyShape, new_id: Callable[[], str]) -> None:
        self._thinking = (ReasoningSplitter(shape.reasoning, shape.in_reasoning)
                          if shape.reasoning is not None else None)
        self._calls = ToolCallParser(shape.tools, shape.parameters) if shape.tools is not None else None
        self._new_id = new_id
        self.thinking = shape.in_reasoning and shape.reasoning is not None
        self.reasoning_tokens = 0

    @property
    def calls(self) -> int:
        """Tool calls started so far."""
        return 0 if self._calls is None else self._calls.calls

    def feed(self, text: str, tokens: int) -> list[Delta]:
        """The deltas `text` completes; `tokens` is the choice's token count so far (thinking's share)."""
        parts = self._thinking.feed(text) if self._thinking is not None else [(Channel.CONTENT, text)]
        deltas = self._deltas(parts, final=False)
        self._count_thinking(parts, tokens)
        return deltas

    def finish(self) -> list[Delta]:
        """The deltas of everything still held back, at the reply's end."""
        parts = self._thinking.finish() if self._thinking is not None else []
        return self._deltas(parts, final=True)

    def _count_thinking(self, parts: list[tuple[Channel, str]], tokens: int) -> None:
        """Tokens until the answer's first text count as reasoning tokens (the end marker with them)."""
        if any(channel is Channel.REASONING for channel, _ in parts):
            self.thinking = True
        if self.thinking:
            answered = any(channel is Channel.CONTENT for channel, _ in parts)
            self.reasoning_tokens = tokens - 1 if answered else tokens
            self.thinking = not answered

    def _deltas(self, parts: list[tuple[Channel, str]], final: bool) -> list[Delta]:
        deltas: list[Delta] = []
        for channel, text in parts:
            if channel is Channel.REASONING:
                deltas.append(Delta(reasoning_content=text))
            else:
                deltas += self._content(self._calls.feed(text) if self._calls else [TextPiece(text)])
        if final and self._calls is not None:
            deltas += self._content(self._calls.finish())
        return merged(deltas)

    def _content(self, pieces: list[ToolPiece]) -> list[Delta]:
        out = []
        for piece in pieces:
            if isinstance(piece, TextPiece):
                out.append(Delta(content=piece.text))
            elif isinstance(piece, CallStart):
                function = FunctionDelta(name=piece.name, arguments="")
                call = ToolCallDelta(piece.index, self._new_id(), "function", function)
                out.append(Delta(tool_calls=[call]))
            elif isinstance(piece, CallArguments):
                function = FunctionDelta(arguments=piece.fragment)
                out.append(Delta(tool_calls=[ToolCallDelta(piece.index, function=function)]))
        return out


def merged(deltas: list[Delta]) -> list[Delta]:
    """Neighbouring deltas of one kind as one: text pieces joined, a call's argument pieces joined."""
    out: list[Delta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if last is not None and last.content is not None and delta.content is not None:
            out[-1] = Delta(content=last.content + delta.content)
        elif last is not None and last.reasoning_content is not None and delta.reasoning_content is not None:
            out[-1] = Delta(reasoning_content=last.reasoning_content + delta.reasoning_content)
        elif last is not None and arguments_of_same_call(last, delta):
            assert last.tool_calls is not None and delta.tool_calls is not None
            out[-1] = Delta(tool_calls=[joined_arguments(last.tool_calls[0], delta.tool_calls[0])])
        else:
            out.append(delta)
    return out


def arguments_of_same_call(first: Delta, second: Delta) -> bool:
    """Whether `second` only adds arguments to the call `first` is about."""
    if not first.tool_calls or not second.tool_calls:
        return False
    a, b = first.tool_calls[0], second.tool_calls[0]  # a call's first delta stays `arguments: ""`
    return a.index == b.index and a.id is None and b.id is None and a.function is not None \
        and b.function is not None


def joined_arguments(first: ToolCallDelta, second: ToolCallDelta) -> ToolCallDelta:
    """`first` with `second`'s arguments appended."""
    assert first.function is not None and second.function is not None
    arguments = (first.function.arguments or "") + (second.function.arguments or "")
    return ToolCallDelta(first.index, first.id, first.type, FunctionDelta(first.function.name, arguments))


@dataclass(slots=True)
class Message:
    """A whole reply assembled from its deltas: content, thinking and calls."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, delta: Delta) -> None:
        """Take one delta's part."""
        if delta.content is not None:
            self.content.append(delta.content)
        if delta.reasoning_content is not None:
            self.reasoning.append(delta.reasoning_content)
        for call in delta.tool_calls or ():
            self.add_call(call)

    def add_call(self, call: ToolCallDelta) -> None:
        """A call's first delta opens it; later ones extend its arguments."""
        function = call.function or FunctionDelta()
        if call.id is not None:
            opened = FunctionCall(function.name or "", function.arguments or "")
            self.calls.append(ToolCall(id=call.id, function=opened))
        else:
            last = self.calls[call.index].function
            arguments = last.arguments + (function.arguments or "")
            self.calls[call.index].function = FunctionCall(last.name, arguments)
