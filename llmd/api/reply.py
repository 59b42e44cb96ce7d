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
        return deltas

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
