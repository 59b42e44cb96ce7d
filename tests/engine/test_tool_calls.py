"""Constrained replies on the tiny random model, sampled at temperature 1 over many seeds: JSON that
follows its schema every time, and with `tool_choice` required or named a call in each format
that parses, names a tool and whose arguments follow its schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmd.api.tool_grammar import NO_PARAMETERS, CallPlan, Thinking, ToolSpec, call_grammar
from llmd.api.tool_parser import CallArguments, CallStart, ToolCallParser, ToolPiece
from llmd.engine.client import EngineClient
from llmd.engine.tool_format import GENERIC, LLAMA3_JSON, MISTRAL, QWEN3_CODER, ToolFormat
from llmd.engine.types import GrammarRequest, SamplingParams
from llmd.engine.worker import EngineWorker
from tests.helpers.engine import PROMPT, run_with_engine

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "maximum": 999},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}}
WEATHER = ToolSpec("get_weather", {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "enum": ["Seoul", "Busan"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}}})
NOW = ToolSpec("now", NO_PARAMETERS)


async def reply(engine: EngineClient, prompt: list[int], grammar: GrammarRequest, seed: int
                ) -> tuple[str, str]:
    """The text one seeded, constrained reply streams, and its finish reason."""
    constraint = await engine.constrain(grammar)
    params = SamplingParams(max_tokens=300, temperature=1.0, seed=seed, constraint=constraint)
    with engine.submit(prompt, params) as stream:
        events = [event async for event in stream]
    reason = events[-1].finish_reason
    assert reason is not None
    return "".join(event.text for event in events), reason.value


def calls_in(fmt: ToolFormat, text: str) -> list[tuple[str, dict[str, Any]]]:
    """Every call the parser reads in `text`: its name and parsed arguments."""
    parser = ToolCallParser(fmt, {tool.name: tool.parameters for tool in (WEATHER, NOW)})
    pieces: list[ToolPiece] = [*parser.feed(text), *parser.finish()]
    names = [piece.name for piece in pieces if isinstance(piece, CallStart)]
    arguments = ["".join(p.fragment for p in pieces if isinstance(p, CallArguments) and p.index == i)
                 for i in range(len(names))]
    return [(name, json.loads(text)) for name, text in zip(names, arguments, strict=True)]


def follows_weather(arguments: dict[str, Any]) -> bool:
    return set(arguments) == {"city", "days"} and arguments["city"] in ("Seoul", "Busan") \
        and isinstance(arguments["days"], int) and 1 <= arguments["days"] <= 7


def test_json_schema_replies_validate_for_twenty_seeds(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        prompt = await engine.encode_chat(PROMPT)
        for seed in range(20):
            text, reason = await reply(engine, prompt, GrammarRequest(json.dumps(PERSON), "p"), seed)
            value = json.loads(text)
            assert reason == "stop" and set(value) == {"name", "age", "tags"} and len(value["name"]) <= 8
            assert isinstance(value["age"], int) and value["age"] <= 999 and set(value["tags"]) <= {"a", "b"}

    run_with_engine(tiny_model, body)


@pytest.mark.parametrize("fmt", [GENERIC, LLAMA3_JSON, MISTRAL, QWEN3_CODER])
def test_required_and_named_calls_always_parse_and_validate(tiny_model: Path, fmt: ToolFormat) -> None:
    # One call each: a random model offered parallel calls goes on calling until max_tokens.
    plans = {"required": CallPlan((WEATHER, NOW), required=True, parallel=False),
             "named": CallPlan((WEATHER,), required=True, parallel=False)}

    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        prompt = await engine.encode_chat(PROMPT)
        for kind, plan in plans.items():
            grammar = GrammarRequest(call_grammar(fmt, plan, Thinking.NONE, None), "tools", lark=True)
            for seed in range(5):
                text, reason = await reply(engine, prompt, grammar, seed)
                calls = calls_in(fmt, text)
                assert reason == "stop" and calls, text
                assert all(follows_weather(arguments) if name == "get_weather" else arguments == {}
                           for name, arguments in calls), text
                assert kind == "required" or [name for name, _ in calls] == ["get_weather"]

    run_with_engine(tiny_model, body)
