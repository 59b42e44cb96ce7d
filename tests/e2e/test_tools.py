"""End to end: tools and reasoning through the official SDK against real daemons serving scripted
models (tests/helpers/scripted_model.py: greedy output is a fixed script) of each tool-call
family, with the grammar on: the calls are parsed in every format, streamed as the SDK's stream
helper assembles them, and sent back in an agent loop; a thinking model's reply splits into
`reasoning_content` and `content`. The generic format runs on the session daemon's demo model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.helpers import tool_templates
from tests.helpers.daemon import Daemon, start_daemon
from tests.helpers.scripted_model import build_scripted_model

# Bounded arguments: under the grammar a random-weight model writes what the schema allows (the
# script only opens the call), and an enum leaves it nothing to run on with.
CITIES, DAYS = ["Seoul", "Busan", "Jeju"], [1, 2, 3]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, for some days.", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                   "properties": {"city": {"type": "string", "enum": CITIES},
                                  "days": {"type": "integer", "enum": DAYS}}}}}
NOW = {"type": "function", "function": {"name": "now", "description": None}}
TOOLS: list[Any] = [WEATHER, NOW]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Seoul for three days?"}]
# family → (template, the scripted reply: it opens a call in the family's format; llguidance
# spells forced text canonically, so the grammar, not the script, writes the rest)
FAMILIES = {
    "hermes": (tool_templates.HERMES_QWEN25, ["<tool_call>", "</tool_call>"]),
    "mistral": (tool_templates.MISTRAL, ["[TOOL_CALLS]"]),
    "llama3": (tool_templates.LLAMA31_JSON, ['{"name": ']),
    "qwen3_coder": (tool_templates.QWEN3_CODER, ["<tool_call>", "</tool_call>"]),
}
THOUGHT = ["<think>", "The user wants a greeting.", "</think>", "\n\nHello there!"]


def valid_call(name: str, arguments: str) -> bool:
    """Whether a call names a tool and its arguments follow that tool's schema."""
    value = json.loads(arguments)
    if name == "now":
        return value == {}
    return name == "get_weather" and value["city"] in CITIES and value["days"] in DAYS and len(value) == 2


def serve_script(tmp: Path, template: str, script: list[str]) -> Daemon:
    model = build_scripted_model(tmp / "model", script, template, **tool_templates.template_tokens(template))
    return start_daemon(tmp, "--model", str(model), "--served-model-name", "tiny")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon serving a model of one tool-call family, whose reply is one call."""
    template, script = FAMILIES[request.param]
    daemon = serve_script(tmp_path_factory.mktemp(request.param), template, script)
    yield daemon
    assert daemon.stop() == 0, daemon.log()


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon serving a Qwen3-style reasoning model that thinks, then answers."""
    daemon = serve_script(tmp_path_factory.mktemp("thinking"), tool_templates.QWEN3_THINKING, THOUGHT)
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("choice", ["auto", "required", NAMED])
def test_every_family_calls_with_any_tool_choice(family: Daemon, choice: Any) -> None:
    for seed in range(2):
        reply = client(family).chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=100,  # type: ignore[arg-type]
            parallel_tool_calls=False, seed=seed)
        choice_ = reply.choices[0]
        [call] = choice_.message.tool_calls or []
        assert valid_call(call.function.name, call.function.arguments), call
        assert call.type == "function" and call.id and choice_.message.content is None
        assert choice_.finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")
        assert call.function.name == "get_weather" or not isinstance(choice, dict)


def test_the_stream_helper_assembles_each_familys_call(family: Daemon) -> None:
    with client(family).chat.completions.stream(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=100,  # type: ignore[arg-type]
            parallel_tool_calls=False) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # not doubled: one name delta per call
    assert valid_call(call.function.name, call.function.arguments)
    assert final.choices[0].finish_reason == "stop"


def test_streamed_deltas_keep_the_wire_rules(family: Daemon) -> None:
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 100, "stream": True,
            "tool_choice": NAMED}
    with httpx.stream("POST", f"{family.base_url}/chat/completions", json=body, timeout=60) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [json.loads(line)["choices"][0]["delta"] for line in lines[:-1]]
    calls = [(d, call) for d in deltas for call in d.get("tool_calls", [])]
    first, *later = [call for _, call in calls]
    assert first["index"] == 0 and first["type"] == "function" and first["id"]
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert all(set(call) == {"index", "function"} for call in later)
    assert all(set(call["function"]) == {"arguments"} for call in later)
    assert valid_call("get_weather", "".join(call["function"]["arguments"] for call in later))
    assert not any(d.get("content") for d, _ in calls) and not any(d.get("content") for d in deltas[1:])


def test_an_agent_loop_sends_the_call_and_its_result_back(family: Daemon) -> None:
    sdk = client(family)
    first = sdk.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=100,  # type: ignore[arg-type]
                                        tool_choice=NAMED)
    message = first.choices[0].message
    [call] = message.tool_calls or []
    turns = [*ASK, message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'}]
    second = sdk.chat.completions.create(model="tiny", messages=turns, tools=TOOLS, max_tokens=100,  # type: ignore[arg-type]
                                         tool_choice=NAMED)
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered
    [again] = second.choices[0].message.tool_calls or []  # the scripted model always calls
    assert again.id != call.id and valid_call(again.function.name, again.function.arguments)


def test_a_thinking_model_streams_its_thinking_apart(thinker: Daemon) -> None:
    stream = client(thinker).chat.completions.create(model="tiny", messages=ASK, max_tokens=60, stream=True,
                                                     stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    reasoning = [getattr(d, "reasoning_content", None) for d in deltas]
    assert "".join(r or "" for r in reasoning) == "The user wants a greeting."
    assert "".join(d.content or "" for d in deltas) == "Hello there!"
    assert not any(d.content and r for d, r in zip(deltas, reasoning, strict=True))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 3


def test_a_thinking_model_reply_carries_reasoning_content(thinker: Daemon) -> None:
    reply = client(thinker).chat.completions.create(model="tiny", messages=ASK, max_tokens=60)
    message = reply.choices[0].message
    assert message.content == "Hello there!"
    assert getattr(message, "reasoning_content", None) == "The user wants a greeting."


class Person(BaseModel):
    """Bounded on purpose: a random-weight model follows the grammar, not a wish to stop."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=999)


def test_the_generic_format_on_a_template_without_tools(daemon: Daemon) -> None:
    person = {"type": "function", "function": {"name": "Person", "strict": True,
                                               "parameters": Person.model_json_schema()}}
    for seed in range(3):
        reply = client(daemon).chat.completions.create(
            model="tiny", messages=ASK, tools=[person], temperature=1.0, seed=seed, max_tokens=200,
            tool_choice={"type": "function", "function": {"name": "Person"}})
        [call] = reply.choices[0].message.tool_calls or []
        assert call.function.name == "Person" and reply.choices[0].finish_reason == "stop"
        Person.model_validate_json(call.function.arguments)


def test_langchain_bind_tools(family: Daemon) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="tiny", base_url=family.base_url, api_key="unused", max_retries=0,  # type: ignore[arg-type]
                     max_tokens=100)  # type: ignore[call-arg]
    message = llm.bind_tools([WEATHER], tool_choice="required", parallel_tool_calls=False).invoke("Weather?")
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and valid_call(call["name"], json.dumps(call["args"]))


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(daemon: Daemon, method: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="tiny", base_url=daemon.base_url, api_key="unused", max_retries=0,  # type: ignore[arg-type]
                     max_tokens=200, temperature=1.0, seed=1)  # type: ignore[call-arg]
    assert isinstance(llm.with_structured_output(Person, method=method).invoke("Who?"), Person)
