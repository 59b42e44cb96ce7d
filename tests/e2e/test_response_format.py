"""End to end: `response_format` on the session daemon through the official SDK's structured-output
helpers: `chat.completions.parse` and `.stream` with a Pydantic model, and a schema llmd refuses."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tests.helpers.daemon import Daemon

MESSAGES = [{"role": "user", "content": "Who are you? Answer as JSON."}]


class Person(BaseModel):
    """Bounded on purpose: a random-weight model follows the grammar, not a wish to stop."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=999)
    tags: list[Literal["a", "b"]] = Field(max_length=3)


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_parse_with_a_pydantic_model_gives_the_model(daemon: Daemon, temperature: float) -> None:
    for seed in range(3):
        result = client(daemon).chat.completions.parse(
            model="tiny", messages=MESSAGES, response_format=Person, max_tokens=200,  # type: ignore[arg-type]
            temperature=temperature, seed=seed)
        choice = result.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)
        assert Person.model_validate_json(choice.message.content or "") == choice.message.parsed


def test_the_stream_helper_assembles_a_parsed_reply(daemon: Daemon) -> None:
    with client(daemon).chat.completions.stream(
            model="tiny", messages=MESSAGES, response_format=Person, max_tokens=200,  # type: ignore[arg-type]
            temperature=1.0, seed=7) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)


def test_json_schema_and_a_refused_keyword_through_the_plain_create(daemon: Daemon) -> None:
    schema = Person.model_json_schema()
    result = client(daemon).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, temperature=1.0, seed=3,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert Person.model_validate(json.loads(result.choices[0].message.content or ""))
    unique = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as bad:
        client(daemon).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5,  # type: ignore[arg-type]
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": unique}})
    assert bad.value.param == "response_format.json_schema.schema" and "uniqueItems" in bad.value.message
