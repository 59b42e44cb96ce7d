"""The chat allow-list (llmd/api/lenient.py): what is accepted and ignored, what is refused, all at once."""

from __future__ import annotations

import json
import logging

import pytest

from llmd.api.chat import parse_body, template_options, to_template_messages
from llmd.api.lenient import IGNORED_FIELDS, IGNORED_MESSAGE_FIELDS, ignored_fields
from llmd.errors import InvalidRequest, UnsupportedParameter
from llmd.protocol import ChatCompletionRequest, ChatMessage

USER = {"role": "user", "content": "hi"}
BASE = {"model": "m", "messages": [USER]}
# What openai-python sends back for `messages.append(resp.choices[0].message)` (only the fields
# llmd's reply set) and for `.model_dump()` (every field of ChatCompletionMessage).
ECHOED = {"role": "assistant", "content": "Hello!", "refusal": None}
DUMPED = ECHOED | {"annotations": None, "audio": None, "function_call": None, "tool_calls": None}
HARMLESS = {
    "store": False, "metadata": {"run": "7"}, "service_tier": "auto", "user": "u-1",
    "safety_identifier": "s-1", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
    "verbosity": "low", "stream_options": {"include_usage": True},
    "modalities": ["text"],
}
# Served now (api/chat.py), so no longer on the allow-list; these values are the defaults.
SERVED = {"n": 1, "logprobs": False, "top_logprobs": 0, "logit_bias": {},
          "response_format": {"type": "text"}, "parallel_tool_calls": True, "tools": [],
          "tool_choice": "auto"}
ASSISTANT_FIELDS = {"refusal": None, "annotations": [{"type": "url_citation"}], "audio": None,
                    "function_call": None}


def body(**fields: object) -> bytes:
    return json.dumps(BASE | fields).encode()


def refusal_of(raw: bytes) -> UnsupportedParameter:
    with pytest.raises(UnsupportedParameter) as err:
        parse_body(raw)
    assert err.value.status == 400 and err.value.error_type == "invalid_request_error"
    return err.value


def test_the_documented_lists_are_fields_of_the_wire_structs() -> None:
    assert set(IGNORED_FIELDS) <= set(ChatCompletionRequest.__struct_fields__)
    assert set(IGNORED_MESSAGE_FIELDS) <= set(ChatMessage.__struct_fields__)
    assert set(HARMLESS) == set(IGNORED_FIELDS) and set(ASSISTANT_FIELDS) == set(IGNORED_MESSAGE_FIELDS)


@pytest.mark.parametrize("field", sorted(HARMLESS))
def test_each_harmless_request_field_is_accepted(field: str) -> None:
    assert parse_body(body(**{field: HARMLESS[field]})).model == "m"


def test_all_harmless_fields_at_once_are_accepted_and_listed_as_ignored() -> None:
    parsed = parse_body(body(**HARMLESS, **SERVED))
    assert set(ignored_fields(parsed)) == set(HARMLESS)


def test_the_served_options_are_not_on_the_allow_list() -> None:
    assert not set(SERVED) & set(IGNORED_FIELDS)


@pytest.mark.parametrize("field", sorted(ASSISTANT_FIELDS))
def test_each_echoed_assistant_field_is_accepted(field: str) -> None:
    turn = {"role": "assistant", "content": "Hello!", field: ASSISTANT_FIELDS[field]}
    parse_body(body(messages=[USER, turn, USER]))


@pytest.mark.parametrize("turn", [ECHOED, DUMPED])
def test_the_sdk_echo_back_renders_as_plain_turns(turn: dict) -> None:
    parsed = parse_body(body(messages=[USER, turn, USER]))
    assert to_template_messages(parsed.messages)[1] == {"role": "assistant", "content": "Hello!"}


def test_a_refusal_text_stands_in_for_empty_content() -> None:
    turn = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    parsed = parse_body(body(messages=[USER, turn, USER]))
    assert to_template_messages(parsed.messages)[1]["content"] == "I can't help with that."


@pytest.mark.parametrize("name", ["reasoning_content", "reasoning"])
def test_assistant_reasoning_reaches_the_template_as_reasoning_content(name: str) -> None:
    turn = {"role": "assistant", "content": "4", name: "2 + 2 is 4"}
    parsed = parse_body(body(messages=[USER, turn, USER]))
    assert to_template_messages(parsed.messages)[1] == {
        "role": "assistant", "content": "4", "reasoning_content": "2 + 2 is 4"}


def test_text_parts_with_cache_control_are_accepted_and_ignored() -> None:
    cached = {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
    parts = [cached, {"type": "text", "text": "b"}]
    parsed = parse_body(body(messages=[{"role": "user", "content": parts}]))
    assert to_template_messages(parsed.messages) == [{"role": "user", "content": "ab"}]
    assert ignored_fields(parsed) == ["messages[0].content[0].cache_control"]


def test_stream_options_are_ignored_only_when_not_streaming() -> None:
    options = {"include_usage": True}
    assert ignored_fields(parse_body(body(stream_options=options))) == ["stream_options"]
    assert ignored_fields(parse_body(body(stream=True, stream_options=options))) == []


def test_one_unknown_field_is_named() -> None:
    error = refusal_of(body(foo=1))
    assert error.param == "foo" and error.message == "`foo` is not supported by llmd"


def test_several_unknown_fields_are_named_in_one_400() -> None:
    parts = [{"type": "text", "text": "a", "x": 1}, {"type": "image_url", "image_url": {"url": "u"}}]
    raw = body(foo=1, prediction={"type": "content"}, stream_options={"include_usage": True, "bar": 2},
               messages=[{"role": "user", "content": parts, "weird": True}])
    error = refusal_of(raw)
    named = ["foo", "prediction", "stream_options.bar", "messages[0].weird", "messages[0].content[0].x",
             "messages[0].content[1].type"]
    assert error.param == "foo" and error.message.startswith("6 fields are refused")
    assert all(f"`{param}`" in error.message for param in named)


def test_unknown_fields_come_before_a_bad_value() -> None:
    error = refusal_of(body(temperature=9, foo=1))
    assert error.param == "foo"


@pytest.mark.parametrize(("fields", "param"), [
    ({"modalities": ["audio"]}, "modalities"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"messages": [USER, {"role": "assistant", "audio": {"id": "a1"}}]}, "messages[1].audio"),
    ({"messages": [USER, {"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages[1].tool_call_id"),
    ({"messages": [USER, {"role": "user", "content": "x", "tool_calls": []}]}, "messages[1].tool_calls"),
    ({"messages": [USER, {"role": "assistant", "function_call": {"name": "f"}}]},
     "messages[1].function_call"),
    ({"messages": [{"role": "user", "content": "x", "refusal": None, "reasoning": "r"}]},
     "messages[0].reasoning"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0].type"),
])
def test_a_value_that_asks_for_more_than_text_is_refused_by_name(fields: dict, param: str) -> None:
    assert refusal_of(body(**fields)).param == param


def test_several_refused_values_are_named_in_one_400() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}]
    error = refusal_of(body(modalities=["audio"], messages=[
        {"role": "user", "content": parts}, {"role": "user", "content": "x", "tool_call_id": "c"}]))
    assert error.param == "modalities" and error.message.startswith("3 fields are refused")
    named = ("modalities", "messages[0].content[1].type", "messages[1].tool_call_id")
    assert all(f"`{param}`" in error.message for param in named)


def test_ignored_fields_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="llmd.api"):
        parse_body(body(store=True, messages=[USER, ECHOED | ASSISTANT_FIELDS, USER]))
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "store" in logged and "messages[1].annotations" in logged


def test_template_options_default_to_a_generation_prompt() -> None:
    options = template_options(parse_body(body()))
    assert options.add_generation_prompt and not options.continue_final_message and options.variables == {}


def test_continuing_the_final_message_drops_the_generation_prompt_unless_asked_for_both() -> None:
    options = template_options(parse_body(body(continue_final_message=True)))
    assert options.continue_final_message and not options.add_generation_prompt
    with pytest.raises(InvalidRequest) as err:
        template_options(parse_body(body(continue_final_message=True, add_generation_prompt=True)))
    assert err.value.param == "continue_final_message"


def test_reasoning_effort_and_template_kwargs_become_template_variables() -> None:
    thinking = {"enable_thinking": False}
    options = template_options(parse_body(body(reasoning_effort="low", chat_template_kwargs=thinking)))
    assert options.variables == {"reasoning_effort": "low", "enable_thinking": False}
    overridden = template_options(parse_body(body(reasoning_effort="low",
                                                  chat_template_kwargs={"reasoning_effort": "high"})))
    assert overridden.variables == {"reasoning_effort": "high"}
