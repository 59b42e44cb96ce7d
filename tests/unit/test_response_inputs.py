"""Responses input items: read by kind, turned into one chat, stored in OpenAI's listed form (which
reads back as the same chat), and the chat request a response runs as."""

from __future__ import annotations

from typing import Any

import pytest

from llmd.api.responses.as_chat import chat_request, renamed, responses_params
from llmd.api.responses.inputs import chat_messages, parse_items, stored_item
from llmd.api.responses.request import function_tools, parse_request, tool_choice
from llmd.errors import InvalidRequest, UnsupportedParameter
from llmd.protocol import ChatMessage, JsonSchemaResponseFormat, NamedToolChoice
from llmd.responses_protocol import FunctionCallItem, FunctionCallOutputItem, MessageItem, ReasoningItem

ITEMS: list[dict[str, Any]] = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Hi"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_a",
        "status": "completed",
        "phase": None,
        "content": [{"type": "output_text", "text": "Hello.", "annotations": [], "logprobs": []}],
    },
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {
        "type": "reasoning",
        "id": "rs_a",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "call it"}],
    },
    {"type": "function_call", "id": "fc_a", "call_id": "call_1", "name": "weather", "arguments": "{}"},
    {"type": "function_call", "call_id": "call_2", "name": "time", "arguments": ""},
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "sunny"}],
    },
    {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
]


def chat_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The fields each message sets."""
    return [
        {
            k: v
            for k, v in (
                ("role", m.role),
                ("content", m.content),
                ("tool_call_id", m.tool_call_id),
                ("reasoning", m.reasoning_content),
                (
                    "calls",
                    [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls]
                    if m.tool_calls
                    else None,
                ),
            )
            if v is not None
        }
        for m in messages
    ]


def test_every_item_kind_is_read_by_its_type() -> None:
    items = parse_items(ITEMS)
    assert [type(item) for item in items] == [
        MessageItem,
        MessageItem,
        MessageItem,
        MessageItem,
        ReasoningItem,
        FunctionCallItem,
        FunctionCallItem,
        FunctionCallOutputItem,
        FunctionCallOutputItem,
        MessageItem,
    ]
    assert parse_items("Hi") == [MessageItem(role="user", content="Hi")]


def test_consecutive_assistant_items_are_one_turn_and_instructions_come_first() -> None:
    assert chat_dicts(chat_messages("Use tools.", parse_items(ITEMS))) == [
        {"role": "system", "content": "Use tools."},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "call it",
            "calls": [("call_1", "weather", "{}"), ("call_2", "time", "")],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "tool", "content": "noon", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "I cannot."},
    ]


def test_stored_items_have_ids_and_read_back_as_the_same_chat() -> None:
    items = parse_items(ITEMS)
    stored = [stored_item(item) for item in items]
    assert all(item["id"] for item in stored) and stored[2]["id"] == "msg_a" and stored[5]["id"] == "fc_a"
    assert stored[1] == {
        "id": stored[1]["id"],
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": "Hi"}],
    }
    assert stored[7]["output"] == "sunny"
    again = parse_items(stored)
    assert chat_dicts(chat_messages(None, again)) == chat_dicts(chat_messages(None, items))
    assert [stored_item(item) for item in again] == stored  # ids kept: listing is stable


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "web_search_call", "id": "w"}, "input[0].type"),
        ({"type": "item_reference", "id": "msg_x"}, "input[0].type"),
        ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}, "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": "output_text", "text": "x"}]}, "input[0].content[0].type"),
        ({"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}, "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": "input_text"}]}, "input[0].content[0].text"),
        (
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]},
            "input[0].output[0].type",
        ),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}, "input[0].arguments"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
        ({"role": "user"}, "input[0].content"),
    ],
)
def test_an_item_llmd_cannot_read_is_a_400_naming_it(item: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_items([item])
    assert caught.value.param == param


def test_the_chat_request_carries_the_responses_settings() -> None:
    body = parse_request(
        b'{"model": "m", "input": "x", "max_output_tokens": 9, "temperature": 0.2, '
        b'"reasoning": {"effort": "low"}, "parallel_tool_calls": false, "text": {"format": '
        b'{"type": "json_schema", "name": "A", "schema": {"type": "object"}}}, '
        b'"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], '
        b'"tool_choice": {"type": "function", "name": "f"}}'
    )
    tools = function_tools(body.tools)
    chat = chat_request(body, tools, tool_choice(body.tool_choice), [ChatMessage(role="user", content="x")])
    assert (chat.max_completion_tokens, chat.temperature, chat.reasoning_effort) == (9, 0.2, "low")
    assert chat.parallel_tool_calls is False and isinstance(chat.tool_choice, NamedToolChoice)
    assert chat.tools is not None and chat.tools[0].function.name == "f"
    assert isinstance(chat.response_format, JsonSchemaResponseFormat)
    assert chat.response_format.json_schema.schema == {"type": "object"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "input": "x", "tools": [{"type": "mcp", "server_label": "s"}]}', None),
        (b'{"model": "m", "input": "x", "background": true, "truncation": "auto"}', "background"),
        (b'{"model": "m", "input": "x", "include": ["message.output_text.logprobs"]}', "include"),
        (b'{"model": "m", "input": "x", "service_tier": "flex"}', "service_tier"),
        (b'{"model": "m", "input": "x", "logprobs": true}', "logprobs"),
        (b'{"model": "m", "input": []}', "input"),
        (b'{"model": "m"}', "input"),
        (b'{"model": "m", "input": "x", "temperature": 3}', "temperature"),
    ],
)
def test_refused_bodies_name_the_field(body: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        request = parse_request(body)
        function_tools(request.tools)
    assert caught.value.param == (param or "tools[0].type")


def test_accepted_fields_that_cannot_change_the_answer_pass() -> None:
    body = parse_request(
        b'{"model": "m", "input": "x", "include": ["reasoning.encrypted_content"], '
        b'"truncation": "disabled", "service_tier": "auto", "user": "u", "store": false, '
        b'"prompt_cache_key": "k", "stream_options": {"include_obfuscation": false}}'
    )
    assert body.store is False and body.include == ["reasoning.encrypted_content"]


@pytest.mark.parametrize(
    ("chat", "responses"),
    [
        ("tools[3].function.parameters.properties", "tools[3].parameters.properties"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("response_format.json_schema.schema.not", "text.format.schema.not"),
        ("response_format", "text.format"),
        ("max_completion_tokens", "max_output_tokens"),
        ("reasoning_effort", "reasoning.effort"),
        ("messages", "input"),
        ("temperature", "temperature"),
    ],
)
def test_chat_params_are_renamed_to_the_fields_the_client_sent(chat: str, responses: str) -> None:
    assert renamed(chat) == responses


def test_errors_raised_on_the_chat_path_name_the_responses_fields() -> None:
    with pytest.raises(UnsupportedParameter) as caught, responses_params():
        raise UnsupportedParameter(
            "`response_format.json_schema.schema.not` is not supported",
            param="response_format.json_schema.schema.not",
        )
    assert caught.value.param == "text.format.schema.not"
    assert caught.value.message == "`text.format.schema.not` is not supported" == str(caught.value)
