"""End to end: OpenAI's Responses API (`/v1/responses`) on real daemons, through the official SDK and
the OpenAI Agents SDK.

Scripted models (tests/helpers/scripted_model.py) make the replies known: a plain one says `REPLY`
and stops; a Hermes-format one calls `get_weather`, and after a tool result (its template ends the
generation prompt with the script's `<answer>` piece, so greedy decoding enters the script there)
answers `ANSWER` (with `parallel_tool_calls: false` the grammar ends a reply at its call, so the
first turn never runs on into the answer). A reply is checked against what `/v1/chat/completions`
gives for the same chat; stored responses against the SQLite file itself, read-only, and across a
restart of the daemon.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from llmd.api.responses.store import FILE_NAME
from tests.helpers import tool_templates
from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.scripted_model import build_scripted_model

REPLY_PIECES = ["Hello", " there", ",", " friend", "!"]
REPLY = "".join(REPLY_PIECES)
ASK = "What is the weather in Seoul?"
ANSWER = "It is sunny in Seoul."
CALLER_SCRIPT = ["<tool_call>", "</tool_call>", "<answer>", ANSWER]
_PROMPT_END = "{{- header('assistant') -}}"
assert tool_templates.HERMES_QWEN25.count(_PROMPT_END) == 1
CALLER_TEMPLATE = tool_templates.HERMES_QWEN25.replace(
    _PROMPT_END, _PROMPT_END + "{%- if messages[-1].role == 'tool' -%}{{ '<answer>' }}{%- endif -%}")
CITIES = ["Seoul", "Busan", "Jeju"]
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "strict": True, "parameters": {"type": "object", "additionalProperties": False,
                                               "required": ["city"],
                                               "properties": {"city": {"type": "string", "enum": CITIES}}}}


def serve(tmp: Path, script: list[str], template: str) -> Daemon:
    """A daemon serving a scripted model built in `tmp` (a model already there is served again)."""
    model = tmp / "model"
    if not model.exists():
        build_scripted_model(model, script, template, **tool_templates.template_tokens(template))
    return start_daemon(tmp, "--model", str(model), "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose model replies `REPLY` to anything, then stops."""
    daemon = serve(tmp_path_factory.mktemp("plain"), REPLY_PIECES, tool_templates.PLAIN)
    yield daemon
    assert daemon.stop() == 0, daemon.log()


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose model calls a tool, and answers `ANSWER` once it has the tool's result."""
    daemon = serve(tmp_path_factory.mktemp("caller"), CALLER_SCRIPT, CALLER_TEMPLATE)
    yield daemon
    assert daemon.stop() == 0, daemon.log()


OPENED: list[openai.OpenAI] = []  # the clients a test made, closed when it ends


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """Close every client a test opened, so no keep-alive socket is left for the collector to find
    in some later test (where its ResourceWarning would fail that test)."""
    yield
    while OPENED:
        OPENED.pop().close()


def client(daemon: Daemon) -> openai.OpenAI:
    sdk = openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)
    OPENED.append(sdk)
    return sdk


def stored_ids(daemon: Daemon) -> set[str]:
    """The ids in the daemon's response store, read from the file (read-only) as it is now."""
    with closing(sqlite3.connect(f"file:{daemon.home / FILE_NAME}?mode=ro", uri=True)) as db:
        return {row[0] for row in db.execute("SELECT id FROM responses")}


def first_text(item: Any) -> str:
    """The text of a listed message item's first content part."""
    return str(item.content[0].text)


# --- one response: its text, usage and events ----------------------------------------


def test_a_response_is_the_chat_reply_with_the_same_token_counts(plain: Daemon) -> None:
    sdk = client(plain)
    response = sdk.responses.create(model="tiny", input=ASK, temperature=0, max_output_tokens=50, store=False)
    chat = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": ASK}],
                                       temperature=0, max_tokens=50)
    assert response.output_text == chat.choices[0].message.content == REPLY
    assert response.status == "completed" and chat.choices[0].finish_reason == "stop"
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens


def test_the_stream_helper_assembles_the_same_text(plain: Daemon) -> None:
    with client(plain).responses.stream(model="tiny", input=ASK, temperature=0, store=False) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) == REPLY and final.status == "completed"


@pytest.mark.parametrize("limit", [None, 3])
def test_raw_events_come_in_openais_order_one_delta_a_token(plain: Daemon, limit: int | None) -> None:
    events = list(client(plain).responses.create(model="tiny", input=ASK, temperature=0, stream=True,
                                                 store=False, max_output_tokens=limit or openai.omit))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    last = events[-1]
    assert last.type == ("response.completed" if limit is None else "response.incomplete")
    pieces = REPLY_PIECES[:limit]
    assert [event.type for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * len(pieces),
        "response.output_text.done", "response.content_part.done", "response.output_item.done", last.type]
    assert [getattr(event, "delta", None) for event in events if event.type.endswith(".delta")] == pieces
    assert last.response.output_text == "".join(pieces)
    # a length cut counts the tokens it sent; a reply that stops counts its end-of-turn token too
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == len(pieces) + (limit is None)


class Person(BaseModel):
    """Bounded on purpose: a random-weight model follows the grammar, not a wish to stop."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=999)
    tags: list[Literal["a", "b"]] = Field(max_length=3)


def test_a_json_schema_format_gives_json_that_follows_it(daemon: Daemon) -> None:
    schema = Person.model_json_schema()
    text: Any = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    for seed in range(3):
        response = client(daemon).responses.create(model="tiny", input="Who are you?", text=text,
                                                   temperature=1.0, max_output_tokens=200, store=False,
                                                   extra_body={"seed": seed})
        assert response.status == "completed", response
        jsonschema.validate(json.loads(response.output_text), schema)
    parsed = client(daemon).responses.parse(model="tiny", input="Who?", text_format=Person,
                                            max_output_tokens=200, store=False, extra_body={"seed": 7})
    assert isinstance(parsed.output_parsed, Person)


# --- function tools ------------------------------------------------------------------


def test_a_function_call_and_its_output_make_a_round_trip(caller: Daemon) -> None:
    sdk = client(caller)
    first = sdk.responses.create(model="tiny", input=ASK, tools=[WEATHER], parallel_tool_calls=False,
                                 max_output_tokens=100, store=False)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    assert json.loads(call.arguments)["city"] in CITIES and first.output_text == ""
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
    history: Any = [{"role": "user", "content": ASK}, *[item.model_dump() for item in first.output], result]
    second = sdk.responses.create(model="tiny", input=history, tools=[WEATHER], parallel_tool_calls=False,
                                  max_output_tokens=100, store=False)
    # ANSWER comes only after a prompt whose last turn is a tool result: the output was rendered
    assert second.output_text == ANSWER and [item.type for item in second.output] == ["message"]
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_streamed_call_sends_its_arguments_as_deltas(caller: Daemon) -> None:
    with client(caller).responses.stream(model="tiny", input=ASK, tools=[WEATHER], parallel_tool_calls=False,
                                         max_output_tokens=100, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    pieces = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    [done] = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert "".join(pieces) == done.arguments == call.arguments and len(pieces) > 1
    assert json.loads(call.arguments)["city"] in CITIES


def test_the_agents_sdk_calls_the_tool_and_answers(caller: Daemon) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no network here
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Seoul", "Busan", "Jeju"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    async def run(mode: str) -> Any:
        async with openai.AsyncOpenAI(base_url=caller.base_url, api_key="unused", max_retries=0) as sdk:
            agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                          model=OpenAIResponsesModel(model="tiny", openai_client=sdk),
                          model_settings=ModelSettings(parallel_tool_calls=False, max_tokens=100))
            if mode != "streamed":  # chained: the second turn sends only the tool's output
                return await Runner.run(agent, ASK, auto_previous_response_id=mode == "chained")
            result = Runner.run_streamed(agent, ASK)
            kinds = [event.type async for event in result.stream_events()]
            assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
            # The SDK closes a finished provider stream in a task of its own: let it finish while
            # the client is open, or its socket is left to the collector (a ResourceWarning later).
            others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            await asyncio.gather(*others, return_exceptions=True)
            return result

    for mode in ("whole", "streamed", "chained"):
        calls.clear()
        result = asyncio.run(run(mode))
        assert len(calls) == 1 and calls[0] in CITIES, mode
        assert result.final_output == ANSWER, mode
        kinds = [item.type for item in result.new_items]
        assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], mode
    [first, second] = result.raw_responses
    assert second.response_id is not None and first.response_id is not None
    assert client(caller).responses.retrieve(second.response_id).previous_response_id == first.response_id


def test_an_agent_with_an_output_type_gets_it(daemon: Daemon) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)

    async def run() -> Any:  # the SDK asks for its strict json_schema under `text.format`
        async with openai.AsyncOpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0) as sdk:
            agent = Agent(name="who", instructions="Say who you are.", output_type=Person,
                          model=OpenAIResponsesModel(model="tiny", openai_client=sdk),
                          model_settings=ModelSettings(max_tokens=200, extra_body={"seed": 1}))
            return await Runner.run(agent, "Who are you?")

    assert isinstance(asyncio.run(run()).final_output, Person)


# --- stored responses ----------------------------------------------------------------


def test_store_false_leaves_the_file_alone_and_store_true_adds_one_row(plain: Daemon) -> None:
    sdk = client(plain)
    before = stored_ids(plain)
    unstored = sdk.responses.create(model="tiny", input=ASK, store=False)
    assert stored_ids(plain) == before
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)
    stored = sdk.responses.create(model="tiny", input=ASK)  # store defaults to true
    assert stored_ids(plain) == before | {stored.id}


def test_input_items_page_and_a_deleted_response_is_gone(plain: Daemon) -> None:
    sdk = client(plain)
    texts = ["Be brief.", "One", "Two"]
    items: Any = [{"role": "developer", "content": texts[0]},
                  *[{"role": "user", "content": text} for text in texts[1:]]]
    response = sdk.responses.create(model="tiny", input=items, store=True)
    page = sdk.responses.input_items.list(response.id, limit=2)
    assert len(page.data) == 2 and page.has_more
    listed = list(sdk.responses.input_items.list(response.id, limit=1))  # the SDK follows the cursor
    assert [first_text(item) for item in listed] == texts[::-1]
    ascending = sdk.responses.input_items.list(response.id, order="asc")
    assert [first_text(item) for item in ascending.data] == texts
    assert sdk.responses.retrieve(response.id).output_text == REPLY
    sdk.responses.delete(response.id)
    assert response.id not in stored_ids(plain)
    for gone in (sdk.responses.retrieve, sdk.responses.input_items.list, sdk.responses.delete):
        with pytest.raises(openai.NotFoundError):
            gone(response.id)


def test_a_conversation_continues_across_a_restart(tmp_path: Path) -> None:
    before = serve(tmp_path, REPLY_PIECES, tool_templates.PLAIN)
    first = client(before).responses.create(model="tiny", input=ASK, instructions="Be kind.", temperature=0)
    assert before.stop() == 0, before.log()
    after = serve(tmp_path, REPLY_PIECES, tool_templates.PLAIN)  # the same LLMD_HOME: the same store
    try:
        sdk = client(after)
        assert sdk.responses.retrieve(first.id) == first
        second = sdk.responses.create(model="tiny", input="And tomorrow?", previous_response_id=first.id,
                                      instructions="Be kind.", temperature=0)
        history: Any = [{"role": "user", "content": ASK}, *[item.model_dump() for item in first.output],
                        {"role": "user", "content": "And tomorrow?"}]
        third = sdk.responses.create(model="tiny", input=history, instructions="Be kind.", temperature=0,
                                     store=False)
        [own] = sdk.responses.input_items.list(second.id).data  # its own input, not the history
    finally:
        assert after.stop() == 0, after.log()
    assert own.type == "message" and first_text(own) == "And tomorrow?"
    assert second.previous_response_id == first.id and second.output_text == third.output_text == REPLY
    assert second.usage is not None and third.usage is not None and first.usage is not None
    assert second.usage.input_tokens == third.usage.input_tokens > first.usage.input_tokens
    # the third prompt is the second's, token for token: the prefix cache holds it
    assert third.usage.input_tokens_details.cached_tokens > 0
