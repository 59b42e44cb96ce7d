"""Tools and reasoning on the chat endpoint, around the fake engine: the 400s, what the template
and the grammar are given, and how a reply is read back into content, thinking and tool calls,
streamed and not (the real `openai` SDK's stream helper assembles the streamed calls)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmd.engine.tool_format import HERMES, MISTRAL, ChatFormat, ReasoningMarkers
from tests.helpers.api_client import openai_error, post_chat, sdk, served, sse_chunks
from tests.helpers.fake_engine import FakeEngine

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": None,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, NOW]
CALL_PIECES = ("Let me check.", "<tool_call>", '\n{"name": "get_weather", "arguments": ', '{"city": ',
               '"Seoul"}', "}\n", "</tool_call>")
TWO_CALLS = (*CALL_PIECES, "\n<tool_call>", '\n{"name": "now", "arguments": {}}\n</tool_call>')
HERMES_MODEL = ChatFormat(HERMES, None, template_renders_tools=True)
THINKING_MODEL = ChatFormat(HERMES, ReasoningMarkers(), template_renders_tools=True)


def hermes(pieces: tuple[str, ...] = CALL_PIECES, chat: ChatFormat = HERMES_MODEL) -> FakeEngine:
    return FakeEngine(pieces=pieces, chat_format=chat)


@pytest.mark.parametrize(("fields", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "now"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice.function.name"),
    ({"tools": [NOW, NOW]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
])
def test_tool_requests_that_cannot_be_served_are_400s_naming_the_field(fields: dict[str, Any],
                                                                        param: str) -> None:
    with served(hermes()) as client:
        response = post_chat(client, **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("choice", [None, "none", "auto"])
def test_tool_choice_without_tools_none_or_auto_is_plain_chat(choice: str | None) -> None:
    engine = hermes(("Hi",))
    with served(engine) as client:
        response = post_chat(client, tool_choice=choice)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hi"
    assert engine.grammars == []


def test_a_parameter_schema_llmd_cannot_enforce_is_a_400_naming_the_tool() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}
    with served(hermes()) as client:
        response = post_chat(client, tools=[NOW, bad], tool_choice="required")
    error = openai_error(response, 400, "unsupported_parameter")
    assert error["param"] == "tools[1].function.parameters" and "`not`" in error["message"]


def test_the_template_gets_the_tools_and_the_grammar_starts_with_a_call_when_required() -> None:
    engine = hermes()
    with served(engine) as client:
        assert post_chat(client, tools=TOOLS, tool_choice="required").status_code == 200
    tools = engine.templates[0].tools
    assert tools is not None and [t["function"]["name"] for t in tools] == ["get_weather", "now"]
    assert tools[0]["function"]["description"] == ""  # null descriptions reach templates as text
    grammar = engine.grammars[-1]
    assert grammar.lark and grammar.param == "tools"
    assert 'body: "<tool_call>" rest' in grammar.schema and '\\"get_weather\\"' in grammar.schema
    assert engine.submitted[0][1].constraint is not None


def test_tool_choice_none_offers_no_tools_and_reads_no_calls() -> None:
    engine = hermes()
    with served(engine) as client:
        body = post_chat(client, tools=TOOLS, tool_choice="none", max_tokens=50).json()
    assert engine.templates[0].tools is None and engine.grammars == []
    assert body["choices"][0]["message"]["content"] == "".join(CALL_PIECES)
    assert "tool_calls" not in body["choices"][0]["message"]


def test_a_reply_with_a_call_has_content_before_it_and_finishes_with_tool_calls() -> None:
    with served(hermes()) as client:
        choice = post_chat(client, tools=TOOLS, max_tokens=50).json()["choices"][0]
    message = choice["message"]
    assert message["content"] == "Let me check." and choice["finish_reason"] == "tool_calls"
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Seoul"}'}


def test_a_named_call_finishes_with_stop_and_content_is_null_without_text() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    with served(hermes(CALL_PIECES[1:])) as client:
        choice = post_chat(client, tools=TOOLS, tool_choice=named, max_tokens=50).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Seoul"}


def test_streamed_calls_have_the_first_delta_named_then_only_arguments() -> None:
    with served(hermes(TWO_CALLS)) as client:
        response = post_chat(client, tools=TOOLS, max_tokens=50, stream=True)
    deltas = [c["choices"][0]["delta"] for c in sse_chunks(response) if c["choices"]]
    assert not any("content" in d and d["content"] and "tool_calls" in d for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    firsts = [call for call in calls if "id" in call]
    assert [c["index"] for c in firsts] == [0, 1] and len({c["id"] for c in firsts}) == 2
    assert all(c["type"] == "function" and c["function"]["arguments"] == "" for c in firsts)
    assert [c["function"]["name"] for c in firsts] == ["get_weather", "now"]
    later = [call for call in calls if "id" not in call]
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in later)
    assert "".join(c["function"]["arguments"] for c in later if c["index"] == 1) == "{}"
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check."
    finish = [c["choices"][0]["finish_reason"] for c in sse_chunks(response) if c["choices"]]
    assert finish[-1] == "tool_calls"


def test_the_sdk_stream_helper_assembles_parallel_calls_without_doubled_ids_or_names() -> None:
    with served(hermes(TWO_CALLS)) as client, sdk(client).chat.completions.stream(
            model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS,  # type: ignore[list-item]
            max_tokens=50) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
    calls = completion.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather", "now"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Seoul"}, {}]
    assert all(c.id.startswith("call_") and len(c.id) < 40 for c in calls)


def test_history_calls_reach_the_template_as_objects_with_their_ids() -> None:
    engine = hermes(("It is sunny.",))
    turns = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function", "index": 0,
                  "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    with served(engine) as client:
        body = post_chat(client, messages=turns, tools=TOOLS).json()
    assert body["choices"][0]["message"]["content"] == "It is sunny."
    assistant, tool = engine.encoded[0][1], engine.encoded[0][2]
    assert assistant["tool_calls"] == [{"id": "call_1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": {"city": "Seoul"}}}]
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


def test_history_arguments_that_are_not_json_are_a_400_naming_them() -> None:
    turns = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{nope"}}]}]
    with served(hermes()) as client:
        response = post_chat(client, messages=turns, tools=TOOLS)
    assert openai_error(response, 400)["param"] == "messages[1].tool_calls[0].function.arguments"


def test_a_template_without_tools_gets_them_in_a_system_message() -> None:
    engine = FakeEngine(pieces=CALL_PIECES)  # PLAIN: the template renders no tools
    with served(engine) as client:
        body = post_chat(client, tools=TOOLS, max_tokens=50).json()
    system = engine.encoded[0][0]
    assert system["role"] == "system" and "<tool_call>" in system["content"]
    assert "get_weather" in system["content"]
    assert engine.templates[0].tools is None
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_mistral_calls_get_nine_character_ids() -> None:
    pieces = ("[TOOL_CALLS]", '[{"name": "now", "arguments": {}}]')
    engine = FakeEngine(pieces=pieces, chat_format=ChatFormat(MISTRAL, None, template_renders_tools=True))
    with served(engine) as client:
        call = post_chat(client, tools=TOOLS, max_tokens=50).json()["choices"][0]["message"]["tool_calls"][0]
    assert len(call["id"]) == 9 and call["id"].isalnum() and call["function"]["arguments"] == "{}"


THOUGHT = ("<think>", "The user", " greets me.", "</think>", "\n\nHello", "!")


def test_thinking_goes_to_reasoning_content_and_counts_as_reasoning_tokens() -> None:
    with served(hermes(THOUGHT, THINKING_MODEL)) as client:
        body = post_chat(client, max_tokens=50).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "The user greets me." and message["content"] == "Hello!"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4


def test_streamed_thinking_and_content_never_share_a_delta() -> None:
    with served(hermes(THOUGHT, THINKING_MODEL)) as client:
        response = post_chat(client, max_tokens=50, stream=True, stream_options={"include_usage": True})
    chunks = sse_chunks(response)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any(d.get("content") and d.get("reasoning_content") for d in deltas)
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "The user greets me."
    assert "".join(d.get("content") or "" for d in deltas) == "Hello!"
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4


def test_a_prompt_that_opened_the_thinking_reads_the_reply_as_thinking_first() -> None:
    engine = hermes(THOUGHT[1:], THINKING_MODEL)
    engine.prompt_opens_reasoning = True
    with served(engine) as client:
        message = post_chat(client, max_tokens=50).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "The user greets me." and message["content"] == "Hello!"


def test_reasoning_effort_none_turns_thinking_off_and_json_follows_the_thinking() -> None:
    engine = hermes(('{"a": 1}',), THINKING_MODEL)
    with served(engine) as client:
        post_chat(client, reasoning_effort="none", response_format={"type": "json_object"})
    assert engine.templates[0].variables == {"reasoning_effort": "none", "enable_thinking": False}
    grammar = engine.grammars[-1]
    assert grammar.lark and "</think>" in grammar.schema and grammar.param == "response_format"


def test_thinking_history_reaches_the_template() -> None:
    engine = hermes(("ok",), THINKING_MODEL)
    turns = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning": "z"},
             {"role": "user", "content": "again"}]
    with served(engine) as client:
        assert post_chat(client, messages=turns).status_code == 200
    assert engine.encoded[0][1]["reasoning_content"] == "z"


def test_every_choice_reads_its_own_calls_and_logprobs_still_come() -> None:
    with served(hermes()) as client:
        body = post_chat(client, tools=TOOLS, max_tokens=50, n=2, logprobs=True).json()
        streamed = sse_chunks(post_chat(client, tools=TOOLS, max_tokens=50, n=2, logprobs=True, stream=True))
    ids = [choice["message"]["tool_calls"][0]["id"] for choice in body["choices"]]
    assert len(set(ids)) == 2 and all(choice["logprobs"]["content"] for choice in body["choices"])
    firsts = [(c["choices"][0]["index"], call["id"]) for c in streamed if c["choices"]
              for call in c["choices"][0]["delta"].get("tool_calls", []) if "id" in call]
    assert sorted(index for index, _ in firsts) == [0, 1] and len({i for _, i in firsts}) == 2
    tokens = sum(len(c["choices"][0]["logprobs"]["content"]) for c in streamed
                 if c["choices"] and c["choices"][0].get("logprobs"))
    assert tokens == 2 * len(CALL_PIECES)  # every token's logprobs reach the client, in some chunk


def test_parallel_tool_calls_false_writes_a_grammar_of_one_call() -> None:
    repeat = '("\\n<tool_call>" rest)*'
    for parallel, repeated in ((None, True), (False, False)):
        engine = hermes()
        with served(engine) as client:
            post_chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
        assert (repeat in engine.grammars[-1].schema) is repeated


def test_a_call_cut_by_max_tokens_finishes_with_length() -> None:
    with served(hermes()) as client:
        choice = post_chat(client, tools=TOOLS, max_tokens=4).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"][0]["function"]["name"] == \
        "get_weather"
