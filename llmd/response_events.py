"""The typed events of a streamed response (`/v1/responses` with `stream: true`), one Struct each.

Every event carries its `type` (also the SSE `event:` name) and a `sequence_number` counting from 0
in the order sent; `item_id`/`output_index` say which output item it extends. No logic here: the
order is `api/responses/events.py`'s.
"""

from __future__ import annotations

from typing import Any

import msgspec

from llmd.response_object import OutputItem, OutputText, Response, SummaryText


class LifecycleEvent(msgspec.Struct):
    """`response.created`, `.in_progress`, `.completed`, `.incomplete`, `.failed`: the whole
    response as it stands."""

    type: str
    sequence_number: int
    response: Response


class OutputItemEvent(msgspec.Struct):
    """`response.output_item.added` (the item as it starts) and `.done` (as it ended)."""

    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(msgspec.Struct):
    """`response.content_part.added` and `.done`: a message's text part opening and closing."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class TextDeltaEvent(msgspec.Struct):
    """`response.output_text.delta`: new text of a message (one per token, as chat's chunks)."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class TextDoneEvent(msgspec.Struct):
    """`response.output_text.done`: a message's whole text."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ArgumentsDeltaEvent(msgspec.Struct):
    """`response.function_call_arguments.delta`: more of a call's arguments JSON."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(msgspec.Struct):
    """`response.function_call_arguments.done`: a call's whole arguments."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class SummaryPartEvent(msgspec.Struct):
    """`response.reasoning_summary_part.added` and `.done`: a reasoning item's text part."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class SummaryDeltaEvent(msgspec.Struct):
    """`response.reasoning_summary_text.delta`: more of a reasoning item's text."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class SummaryDoneEvent(msgspec.Struct):
    """`response.reasoning_summary_text.done`: a reasoning item's whole text."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    text: str


class ErrorEvent(msgspec.Struct):
    """`error`: the stream failed outside any response (the response could not even start)."""

    type: str
    sequence_number: int
    code: str | None
    message: str
    param: str | None


StreamEvent = (LifecycleEvent | OutputItemEvent | ContentPartEvent | TextDeltaEvent | TextDoneEvent
               | ArgumentsDeltaEvent | ArgumentsDoneEvent | SummaryPartEvent | SummaryDeltaEvent
               | SummaryDoneEvent | ErrorEvent)
