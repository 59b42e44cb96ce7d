"""`/v1/responses` around the fake engine: the response object, its event stream (the real `openai`
SDK's stream helper assembles it), tools and thinking, the refusals, and stored conversations in a
real SQLite store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmd.api.responses.store import ResponseStore, StoreLimits
from llmd.engine.tool_format import HERMES, ChatFormat, ReasoningMarkers
from llmd.errors import EngineFailure
from tests.helpers.api_client import BASE_URL, MODEL, openai_error, sdk, served
from tests.helpers.fake_engine import FakeEngine

CALL = (
    "Checking.",
    "<tool_call>",
    '\n{"name": "get_weather", "arguments": ',
    '{"city": "Seoul"}',
    "}\n",
    "</tool_call>",
)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HERMES_MODEL = ChatFormat(HERMES, None, template_renders_tools=True)
THINKING_MODEL = ChatFormat(HERMES, ReasoningMarkers(), template_renders_tools=True)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResponseStore]:
    responses = ResponseStore(tmp_path / "responses.sqlite3", StoreLimits(3600.0, 100, 10**8))
    yield responses
    responses.close()


def post(client: Any, **fields: Any) -> httpx.Response:
    response: httpx.Response = client.post("/v1/responses", json={"model": MODEL, "input": "Hi"} | fields)
    return response


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The stream's events, each checked to be named by its own `type`."""
    out = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data.removeprefix("data: "))
        assert event["type"] == name.removeprefix("event: ")
        out.append(event)
    return out


def test_a_response_carries_its_text_usage_and_the_settings_it_ran_with() -> None:
    with served(FakeEngine(pieces=("Hel", "lo"))) as client:
        body = post(
            client,
            instructions="Be brief.",
            max_output_tokens=50,
            temperature=0.5,
            metadata={"k": "v"},
            store=False,
        ).json()
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
    [message] = body["output"]
    assert (message["type"], message["role"], message["status"]) == ("message", "assistant", "completed")
    assert message["content"] == [{"annotations": [], "text": "Hello", "type": "output_text", "logprobs": []}]
    assert body["usage"] == {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 9,
    }
    assert (body["instructions"], body["max_output_tokens"], body["temperature"]) == ("Be brief.", 50, 0.5)
    assert body["metadata"] == {"k": "v"} and body["store"] is False
    assert body["text"]["format"] == {"type": "text"}


def test_input_items_reach_the_template_as_one_chat() -> None:
    engine = FakeEngine(pieces=("ok",), chat_format=HERMES_MODEL)
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather in "},
                {"type": "input_text", "text": "Seoul?"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "need a call"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Seoul"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    with served(engine) as client:
        assert post(client, input=items, tools=[WEATHER], instructions="Be brief.").status_code == 200
    assert engine.encoded[0] == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Seoul?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "need a call",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Seoul"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    offered = engine.templates[0].tools
    assert offered is not None and offered[0]["function"]["name"] == "get_weather"


def test_the_stream_sends_openais_events_in_order_and_the_sdk_assembles_them() -> None:
    with served(FakeEngine(pieces=("Hel", "lo"))) as client:
        raw = events(post(client, stream=True, store=False))
        with sdk(client).responses.stream(model=MODEL, input="Hi", store=False) as stream:
            final = stream.get_final_response()
    assert [e["type"] for e in raw] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in raw] == list(range(len(raw)))
    assert [e["delta"] for e in raw if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    assert raw[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert final.output_text == "Hello" and final.status == "completed"


def test_a_tool_call_is_a_function_call_item_streamed_and_not() -> None:
    engine = FakeEngine(pieces=CALL, chat_format=HERMES_MODEL)
    with served(engine) as client:
        whole = post(client, tools=[WEATHER], store=False).json()
        raw = events(post(client, tools=[WEATHER], stream=True, store=False))
        with sdk(client).responses.stream(model=MODEL, input="Hi", tools=[WEATHER], store=False) as stream:  # type: ignore[list-item]
            final = stream.get_final_response()
    message, call = whole["output"]
    assert message["content"][0]["text"] == "Checking."
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"city": "Seoul"} and call["call_id"].startswith("call_")
    assert call["id"].startswith("fc_")
    added = [e for e in raw if e["type"] == "response.output_item.added"]
    assert [e["item"]["type"] for e in added] == ["message", "function_call"]
    assert added[1]["item"]["arguments"] == "" and added[1]["output_index"] == 1
    deltas = "".join(e["delta"] for e in raw if e["type"] == "response.function_call_arguments.delta")
    [done] = [e for e in raw if e["type"] == "response.function_call_arguments.done"]
    assert deltas == done["arguments"] and done["name"] == "get_weather"
    assert [item.type for item in final.output] == ["message", "function_call"]
    streamed_call = final.output[1]
    assert streamed_call.type == "function_call" and json.loads(streamed_call.arguments) == {"city": "Seoul"}


def test_thinking_is_a_reasoning_item_before_the_message() -> None:
    engine = FakeEngine(pieces=("<think>", "Hmm", ".", "</think>", "Yes"), chat_format=THINKING_MODEL)
    with served(engine) as client:
        whole = post(client, store=False).json()
        raw = events(post(client, stream=True, store=False))
    reasoning, message = whole["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"] == [{"text": "Hmm.", "type": "summary_text"}]
    assert message["content"][0]["text"] == "Yes"
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == 4
    kinds = [e["type"] for e in raw]
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
    ]
    assert kinds.index("response.reasoning_summary_part.done") < kinds.index("response.content_part.added")


def test_a_length_cut_is_an_incomplete_response() -> None:
    with served(FakeEngine(pieces=("a", "b", "c"))) as client:
        whole = post(client, max_output_tokens=2, store=False).json()
        raw = events(post(client, max_output_tokens=2, stream=True, store=False))
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["output"][0]["status"] == "incomplete"
    assert raw[-1]["type"] == "response.incomplete" and raw[-1]["response"]["status"] == "incomplete"


def test_a_failure_midway_is_a_failed_response_and_the_stream_ends() -> None:
    engine = FakeEngine(pieces=("a", "b", "c"), failure=EngineFailure("the step failed"), fail_after=2)
    with served(engine) as client:
        raw = events(post(client, stream=True, store=False))
        whole = post(client, store=False)
    assert raw[-1]["type"] == "response.failed"
    assert raw[-1]["response"]["error"] == {"code": "engine_error", "message": "the step failed"}
    assert openai_error(whole, 500, "engine_error")["message"] == "the step failed"


def test_json_schema_text_format_becomes_the_grammar() -> None:
    engine = FakeEngine(pieces=('{"a": 1}',))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with served(engine) as client:
        format_ = {"type": "json_schema", "name": "A", "schema": schema, "strict": True}
        body = post(client, text={"format": format_}, store=False).json()
    assert json.loads(engine.grammars[0].schema) == schema
    assert body["text"]["format"] == format_ | {"description": None}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "computer_call", "id": "c"}]}, "input[0].type"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
            "input[0].arguments",
        ),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "sunny"}]},
            "input[0].call_id",
        ),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"frequency_penalty": 1.0}, "frequency_penalty"),
        (
            {
                "text": {
                    "format": {"type": "json_schema", "name": "A", "schema": {"type": "string", "not": {}}}
                }
            },
            "text.format.schema",
        ),
        ({"max_output_tokens": 10_000}, "input"),
        ({"previous_response_id": "resp_missing"}, "previous_response_id"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_responses_field(
    fields: dict[str, Any], param: str
) -> None:
    with served(FakeEngine(chat_format=HERMES_MODEL)) as client:
        response = post(client, **fields)
    error = response.json()["error"]
    assert response.status_code == 400, response.text
    assert error["param"] == param, error


def test_a_stored_response_is_read_back_listed_continued_and_deleted(store: ResponseStore) -> None:
    engine = FakeEngine(pieces=("Hel", "lo"))
    with served(engine, responses=store) as client:
        first = post(client, input=[{"role": "user", "content": "one"}]).json()
        second = post(client, input="two", previous_response_id=first["id"], stream=True)
        second_id = events(second)[-1]["response"]["id"]
        fetched = client.get(f"/v1/responses/{first['id']}").json()
        listed = client.get(f"/v1/responses/{first['id']}/input_items").json()
        deleted = client.delete(f"/v1/responses/{first['id']}").json()
        gone = client.get(f"/v1/responses/{first['id']}")
        broken = post(client, input="three", previous_response_id=second_id)
    assert fetched == first and first["store"] is True
    assert [item["content"] for item in listed["data"]] == [[{"type": "input_text", "text": "one"}]]
    assert listed["first_id"] == listed["data"][0]["id"] and listed["has_more"] is False
    assert engine.encoded[1] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "two"},
    ]
    assert deleted == {"id": first["id"], "object": "response", "deleted": True}
    assert openai_error(gone, 404)["param"] == "response_id"
    assert openai_error(broken, 400, "previous_response_not_found")["param"] == "previous_response_id"


def test_store_false_writes_nothing(store: ResponseStore) -> None:
    with served(FakeEngine(), responses=store) as client:
        response = post(client, store=False).json()
        looked = client.get(f"/v1/responses/{response['id']}")
    assert response["store"] is False and looked.status_code == 404


def test_without_a_store_previous_response_id_is_refused_and_nothing_is_found() -> None:
    with served(FakeEngine()) as client:
        continued = post(client, previous_response_id="resp_x")
        looked = client.get("/v1/responses/resp_x")
        body = post(client).json()
    assert openai_error(continued, 400)["param"] == "previous_response_id"
    assert openai_error(looked, 404)["message"] == "Response with id 'resp_x' not found."
    assert body["store"] is False


def test_an_item_reference_stands_for_the_stored_item_it_names(store: ResponseStore) -> None:
    engine = FakeEngine(pieces=("Hel", "lo"))
    with served(engine, responses=store) as client:
        first = post(client, input="one").json()
        reference = {"type": "item_reference", "id": first["output"][0]["id"]}
        again = post(
            client, input=[{"role": "user", "content": "one"}, reference, {"role": "user", "content": "two"}]
        )
        unknown = post(client, input=[{"type": "item_reference", "id": "msg_nope"}])
    assert again.status_code == 200, again.text
    assert engine.encoded[1] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "two"},
    ]
    assert openai_error(unknown, 400)["param"] == "input[0].id"


def test_langchain_with_the_responses_api_calls_a_tool_and_sends_its_result_back() -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    engine = FakeEngine(pieces=CALL, chat_format=HERMES_MODEL)
    with served(engine) as client:
        llm = ChatOpenAI(
            model=MODEL,
            base_url=f"{BASE_URL}/v1",
            api_key=SecretStr("unused"),
            use_responses_api=True,
            http_client=client,
            max_retries=0,
        ).bind_tools([get_weather])
        called = llm.invoke("Weather in Seoul?")
        streamed = list(llm.stream("Weather in Seoul?"))
        result = ToolMessage(
            get_weather.invoke(called.tool_calls[0]["args"]), tool_call_id=called.tool_calls[0]["id"]
        )
        llm.invoke([HumanMessage("Weather in Seoul?"), called, result])
    assert [(call["name"], call["args"]) for call in called.tool_calls] == [
        ("get_weather", {"city": "Seoul"})
    ]
    merged: Any = streamed[0]
    for piece in streamed[1:]:
        merged += piece
    assert [call["args"] for call in merged.tool_calls] == [{"city": "Seoul"}]
    assert engine.encoded[-1][1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Seoul"},
    }
    assert engine.encoded[-1][2] == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": called.tool_calls[0]["id"],
    }


@pytest.mark.parametrize(
    ("query", "param"), [("limit=101", "limit"), ("limit=x", "limit"), ("order=sideways", "order")]
)
def test_a_bad_page_query_is_a_400_naming_the_parameter(store: ResponseStore, query: str, param: str) -> None:
    with served(FakeEngine(), responses=store) as client:
        response_id = post(client).json()["id"]
        listed = client.get(f"/v1/responses/{response_id}/input_items?{query}")
    error = openai_error(listed, 400)
    assert error["param"] == param and f"`{param}`" in error["message"]
