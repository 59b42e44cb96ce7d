"""A response's events from its reply's deltas: the items each kind of delta opens, OpenAI's order,
sequence numbers, the final response's output, and failure."""

from __future__ import annotations

import msgspec
import pytest

from llmd.api.responses.events import ResponseEvents
from llmd.errors import EngineFailure
from llmd.protocol import Delta, FunctionDelta, ToolCallDelta
from llmd.response_object import (
    InputTokensDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputReasoning,
    OutputTokensDetails,
    ReasoningEcho,
    Response,
    ResponseUsage,
    TextEcho,
)
from llmd.responses_protocol import TextFormatText

USAGE = ResponseUsage(5, InputTokensDetails(2), 4, OutputTokensDetails(1), 9)


@pytest.fixture
def events() -> ResponseEvents:
    response = Response(
        id="resp_1",
        created_at=1,
        status="in_progress",
        instructions=None,
        max_output_tokens=None,
        metadata={},
        model="m",
        output=[],
        parallel_tool_calls=True,
        previous_response_id=None,
        reasoning=ReasoningEcho(),
        store=False,
        temperature=1.0,
        text=TextEcho(TextFormatText()),
        tool_choice="auto",
        tools=[],
        top_p=1.0,
        user=None,
    )
    return ResponseEvents(response)


def call_start(call_id: str, name: str) -> Delta:
    return Delta(tool_calls=[ToolCallDelta(0, call_id, "function", FunctionDelta(name, ""))])


def call_arguments(fragment: str) -> Delta:
    return Delta(tool_calls=[ToolCallDelta(0, function=FunctionDelta(arguments=fragment))])


def test_thinking_text_and_calls_each_open_their_item_in_openais_order(events: ResponseEvents) -> None:
    deltas = [
        Delta(reasoning_content="hm"),
        Delta(reasoning_content="m"),
        Delta(content="Sure."),
        call_start("call_a", "f"),
        call_arguments('{"x":'),
        call_arguments(" 1}"),
        call_start("call_b", "g"),
        call_arguments("{}"),
    ]
    sent = [e for delta in deltas for e in events.take(delta)] + events.finish(USAGE, cut=False)
    assert [e.type.removeprefix("response.") for e in sent] == [
        "created",
        "in_progress",
        "output_item.added",
        "reasoning_summary_part.added",
        "reasoning_summary_text.delta",
        "reasoning_summary_text.delta",
        "reasoning_summary_text.done",
        "reasoning_summary_part.done",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
        "completed",
    ]
    assert [e.sequence_number for e in sent] == list(range(len(sent)))
    reasoning, message, first, second = sent[-1].response.output  # type: ignore[union-attr]
    assert isinstance(reasoning, OutputReasoning) and reasoning.summary[0].text == "hmm"
    assert isinstance(message, OutputMessage) and message.content[0].text == "Sure."
    assert isinstance(first, OutputFunctionCall) and (first.call_id, first.name, first.arguments) == (
        "call_a",
        "f",
        '{"x": 1}',
    )
    assert isinstance(second, OutputFunctionCall) and second.arguments == "{}"
    added = [msgspec.to_builtins(e)["item"]["id"] for e in sent if e.type == "response.output_item.added"]
    assert [item["id"] for item in msgspec.to_builtins(events.response)["output"]] == added


def test_items_start_in_progress_empty_and_end_with_their_whole_text(events: ResponseEvents) -> None:
    added = events.take(Delta(content="a"))[2]  # after the response's created and in_progress
    done = events.take(call_start("c", "f"))[2]
    assert added.item == OutputMessage(id=added.item.id, content=[], status="in_progress")  # type: ignore[union-attr]
    assert done.type == "response.output_item.done" and done.item.content[0].text == "a"  # type: ignore[union-attr]
    assert done.output_index == 0 and done.item.status == "completed"  # type: ignore[union-attr]


def test_a_cut_reply_is_incomplete_with_its_reason(events: ResponseEvents) -> None:
    events.take(Delta(content="a"))
    sent = events.finish(USAGE, cut=True)
    assert sent[-1].type == "response.incomplete"
    final = msgspec.to_builtins(events.response)
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete" and final["usage"]["input_tokens_details"] == {
        "cached_tokens": 2
    }


def test_a_reply_with_no_output_still_gets_an_empty_message(events: ResponseEvents) -> None:
    sent = events.finish(USAGE, cut=False)
    assert [e.type for e in sent][:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    [message] = events.response.output
    assert isinstance(message, OutputMessage) and message.content[0].text == ""


def test_a_failure_carries_the_items_so_far_and_the_error(events: ResponseEvents) -> None:
    events.take(Delta(content="a"))
    events.take(call_start("c", "f"))
    [failed] = events.fail(EngineFailure("the step failed"))
    assert failed.type == "response.failed"
    final = msgspec.to_builtins(events.response)
    assert final["status"] == "failed" and final["error"] == {
        "code": "engine_error",
        "message": "the step failed",
    }
    assert [item["type"] for item in final["output"]] == ["message"]


def test_the_start_comes_once_with_the_first_events_even_a_failure(events: ResponseEvents) -> None:
    sent = events.fail(EngineFailure("no token"))
    assert [e.type for e in sent] == ["response.created", "response.in_progress", "response.failed"]
    assert [e.sequence_number for e in sent] == [0, 1, 2]
    assert events.take(Delta(content="a"))[0].type == "response.output_item.added"
