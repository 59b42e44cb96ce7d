"""A response built from its reply's deltas: the output items, and the events that stream them.

The reply is read as chat reads it (`api/reply.py`: thinking, text, tool calls); each kind of
delta extends an output item of its kind, opening it first when the last item was another kind:
thinking a `reasoning` item, text a `message`, each call a `function_call`. The events follow
OpenAI's order: `response.created`, `response.in_progress`; per item `output_item.added`, its
part's `.added`, its deltas, its `.done` events, `output_item.done`; then `response.completed` (or
`.incomplete` after a length cut, `.failed` on an error). `sequence_number` counts every event.
A reply with no output at all still gets one (empty) message, so `output_text` is "".

`response.created` and `.in_progress` come with the response's first other events (its first
token's, or its failure), not while its prompt is prefilled: on a small CPU a write then takes
time from the prefill (measured: 0.5-1 ms of time to first token on 2 cores). The order is the same.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from llmd.errors import LlmdError
from llmd.protocol import Delta, FunctionDelta, ToolCallDelta
from llmd.response_events import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    LifecycleEvent,
    OutputItemEvent,
    StreamEvent,
    SummaryDeltaEvent,
    SummaryDoneEvent,
    SummaryPartEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from llmd.response_object import (
    IncompleteDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    Response,
    ResponseError,
    ResponseUsage,
    SummaryText,
)

ItemKind = Literal["message", "reasoning", "function_call"]
ID_PREFIX: dict[ItemKind, str] = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


def new_id(prefix: str) -> str:
    """An OpenAI-looking id: `resp_`, `msg_`, ... and hex."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class OpenItem:
    """The output item being written: its kind, place and text so far (a call's arguments)."""

    kind: ItemKind
    index: int
    id: str
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""

    def item(self, status: str) -> OutputItem:
        """The item as it stands, with `status`."""
        text = "".join(self.text)
        if self.kind == "message":
            parts = [OutputText(text=text)] if status != "in_progress" else []
            return OutputMessage(id=self.id, content=parts, status=status)
        if self.kind == "reasoning":
            summary = [SummaryText(text=text)] if status != "in_progress" else []
            return OutputReasoning(id=self.id, summary=summary, status=status)
        return OutputFunctionCall(arguments=text, call_id=self.call_id, name=self.name, id=self.id,
                                  status=status)


class ResponseEvents:
    """One response's events and items, from its `response` (as created: in progress, no output)."""

    def __init__(self, response: Response) -> None:
        self.response = response
        self.items: list[OutputItem] = []
        self._open: OpenItem | None = None
        self._sequence = 0
        self._started = False

    def take(self, delta: Delta) -> list[StreamEvent]:
        """The events of one reply delta (one kind of part each, as `api/reply.py` makes them),
        after `response.created` and `.in_progress` if they have not been sent."""
        events = self._start()
        if delta.reasoning_content:
            return events + self._text("reasoning", delta.reasoning_content)
        if delta.content:
            return events + self._text("message", delta.content)
        for call in delta.tool_calls or ():
            events += self._call(call)
        return events

    def finish(self, usage: ResponseUsage, cut: bool) -> list[StreamEvent]:
        """Close the last item; `response.completed`, or `.incomplete` when `cut` by the length limit."""
        status = "incomplete" if cut else "completed"
        events = self._start() + self._close(status)
        if not self.items:
            events += self._open_item("message") + self._close(status)
        details = IncompleteDetails("max_output_tokens") if cut else None
        self.response = msgspec.structs.replace(self.response, status=status, output=self.items, usage=usage,
                                                incomplete_details=details)
        return [*events, self._lifecycle(f"response.{status}", self.response)]

    def fail(self, error: LlmdError) -> list[StreamEvent]:
        """`response.failed`, with the items written so far (after the start, if not yet sent)."""
        events = self._start()
        failed = ResponseError(error.code or error.error_type, error.message)
        self.response = msgspec.structs.replace(self.response, status="failed", error=failed,
                                                output=self.items)
        return [*events, self._lifecycle("response.failed", self.response)]

    def _start(self) -> list[StreamEvent]:
        """`response.created` and `response.in_progress`, the first time only."""
        if self._started:
            return []
        self._started = True
        return [self._lifecycle("response.created", self.response),
                self._lifecycle("response.in_progress", self.response)]

    def _text(self, kind: ItemKind, text: str) -> list[StreamEvent]:
        events = self._close("completed") + self._open_item(kind) if self._open_kind() != kind else []
        item = self._open
        assert item is not None
        item.text.append(text)
        where = (item.id, item.index, 0)
        if kind == "message":
            return [*events, TextDeltaEvent("response.output_text.delta", self._next(), *where, text, [])]
        delta = SummaryDeltaEvent("response.reasoning_summary_text.delta", self._next(), *where, text)
        return [*events, delta]

    def _call(self, call: ToolCallDelta) -> list[StreamEvent]:
        function = call.function or FunctionDelta()
        events = self._close("completed") + self._open_item("function_call", call.id, function.name or "") \
            if call.id is not None else []
        item = self._open
        if not function.arguments or item is None or item.kind != "function_call":
            return events
        item.text.append(function.arguments)
        fragment = function.arguments
        delta = ArgumentsDeltaEvent("response.function_call_arguments.delta", self._next(), item.id,
                                    item.index, fragment)
        return [*events, delta]

    def _open_kind(self) -> ItemKind | None:
        return self._open.kind if self._open is not None else None

    def _open_item(self, kind: ItemKind, call_id: str = "", name: str = "") -> list[StreamEvent]:
        item = OpenItem(kind, len(self.items), new_id(ID_PREFIX[kind]), call_id=call_id, name=name)
        self._open = item
        added = OutputItemEvent("response.output_item.added", self._next(), item.index,
                                item.item("in_progress"))
        where = (item.id, item.index, 0)
        if kind == "message":
            return [added, ContentPartEvent("response.content_part.added", self._next(), *where,
                                            OutputText(text=""))]
        if kind == "reasoning":
            return [added, SummaryPartEvent("response.reasoning_summary_part.added", self._next(), *where,
                                            SummaryText(text=""))]
        return [added]

    def _close(self, status: str) -> list[StreamEvent]:
        item, self._open = self._open, None
        if item is None:
            return []
        text, done = "".join(item.text), item.item(status)
        self.items.append(done)
        where = (item.id, item.index, 0)
        events: list[StreamEvent]
        if item.kind == "message":
            events = [TextDoneEvent("response.output_text.done", self._next(), *where, text, []),
                      ContentPartEvent("response.content_part.done", self._next(), *where,
                                       OutputText(text=text))]
        elif item.kind == "reasoning":
            events = [SummaryDoneEvent("response.reasoning_summary_text.done", self._next(), *where, text),
                      SummaryPartEvent("response.reasoning_summary_part.done", self._next(), *where,
                                       SummaryText(text=text))]
        else:
            events = [ArgumentsDoneEvent("response.function_call_arguments.done", self._next(), item.id,
                                         item.index, item.name, text)]
        return [*events, OutputItemEvent("response.output_item.done", self._next(), item.index, done)]

    def _lifecycle(self, kind: str, response: Response) -> LifecycleEvent:
        return LifecycleEvent(kind, self._next(), response)

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1
