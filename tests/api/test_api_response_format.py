"""`response_format` on the chat endpoint, around the fake engine: the grammar asked for, and the
400s for a schema llmd cannot follow or options that would fight the grammar's end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmd.engine.types import ANY_OBJECT, GrammarRequest
from tests.helpers.api_client import openai_error, post_chat, served
from tests.helpers.fake_engine import FakeEngine

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
SCHEMA_PARAM = "response_format.json_schema.schema"


def schema_format(schema: dict[str, Any] | None = PERSON, **extra: Any) -> dict[str, Any]:
    spec = {"name": "person", "strict": True} | ({"schema": schema} if schema is not None else {})
    return {"type": "json_schema", "json_schema": spec | extra}


@pytest.mark.parametrize(("format_", "asked"), [
    ({"type": "json_object"}, GrammarRequest(ANY_OBJECT, "response_format")),
    (schema_format(), GrammarRequest(json.dumps(PERSON), SCHEMA_PARAM)),
    (schema_format(None), GrammarRequest(ANY_OBJECT, SCHEMA_PARAM)),
])
def test_json_formats_ask_the_engine_for_their_grammar(format_: dict[str, Any],
                                                      asked: GrammarRequest) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        assert post_chat(client, response_format=format_).status_code == 200
    assert engine.grammars == [asked]
    assert engine.submitted[0][1].constraint is not None


def test_text_asks_for_nothing() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        assert post_chat(client, response_format={"type": "text"}).status_code == 200
    assert engine.grammars == [] and engine.submitted[0][1].constraint is None


def test_a_keyword_that_cannot_be_enforced_is_a_400_naming_it() -> None:
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with served() as client:
        response = post_chat(client, response_format=schema_format(unique))
    error = openai_error(response, 400, "unsupported_parameter")
    assert error["param"] == SCHEMA_PARAM and "`uniqueItems`" in error["message"]


@pytest.mark.parametrize(("format_", "param"), [
    (schema_format({"type": "nonsense"}), SCHEMA_PARAM),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    (schema_format(extra_field=1), "response_format.json_schema.extra_field"),
])
def test_a_format_llmd_cannot_follow_is_a_400_naming_the_field(format_: dict[str, Any], param: str) -> None:
    with served() as client:
        response = post_chat(client, response_format=format_)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


@pytest.mark.parametrize("option", [{"ignore_eos": True}, {"min_tokens": 2}])
def test_options_that_fight_the_grammars_end_are_refused(option: dict[str, Any]) -> None:
    with served() as client:
        response = post_chat(client, response_format={"type": "json_object"}, **option)
    assert response.status_code == 400 and response.json()["error"]["param"] == next(iter(option))
