"""Request bodies become engine parameters, or 400s that name the param."""

from __future__ import annotations

import json

import pytest

from llmd.api.chat import parse_body, requested_max_tokens, to_sampling_params, to_template_messages
from llmd.errors import InvalidRequest, UnsupportedParameter
from llmd.validation import split_validation_error

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(**fields: object) -> bytes:
    return json.dumps(BASE | fields).encode()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),
        ({"presence_penalty": 2.1}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_out_of_range_or_wrong_type_names_the_param(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_body(body(**fields))
    assert err.value.param == param and err.value.status == 400


@pytest.mark.parametrize(("field", "value"), [
    ("functions", [{"name": "f"}]), ("function_call", "auto"), ("prediction", {"type": "content"}),
])
def test_unimplemented_openai_fields_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(UnsupportedParameter) as err:
        parse_body(body(**{field: value}))
    assert err.value.param == field and field in err.value.message


def test_missing_required_field() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_body(json.dumps({"messages": BASE["messages"]}).encode())
    assert err.value.param == "model"


def test_malformed_json() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        parse_body(b'{"model": ')


def test_image_content_parts_are_refused() -> None:
    with pytest.raises(UnsupportedParameter) as err:
        parse_body(body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]))
    assert err.value.param == "messages[0].content[0].type"


def test_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parsed = parse_body(body(messages=[{"role": "user", "content": parts}]))
    assert to_template_messages(parsed.messages) == [{"role": "user", "content": "ab"}]


def test_sampling_params_with_openai_defaults() -> None:
    parsed = parse_body(body(stop="END", seed=7, top_k=-1, max_tokens=5))
    params = to_sampling_params(parsed, requested_max_tokens(parsed) or 0)
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == 0
    assert params.stop == ("END",) and params.seed == 7 and params.max_tokens == 5
    assert params.min_p == 0.0 and params.repetition_penalty == 1.0 and params.min_tokens == 0
    assert params.stop_token_ids == () and not params.ignore_eos


def test_sampling_extensions_reach_the_params() -> None:
    parsed = parse_body(body(min_p=0.1, repetition_penalty=1.3, stop_token_ids=[5, 9], ignore_eos=True,
                             min_tokens=2, max_tokens=5))
    params = to_sampling_params(parsed, 5)
    assert (params.min_p, params.repetition_penalty, params.stop_token_ids) == (0.1, 1.3, (5, 9))
    assert params.ignore_eos and params.min_tokens == 2


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    parsed = parse_body(body(max_tokens=5, max_completion_tokens=9))
    assert requested_max_tokens(parsed) == 9


def test_a_null_text_part_names_the_text_not_the_type() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": None}]
    parsed = parse_body(body(messages=[{"role": "user", "content": parts}]))
    with pytest.raises(InvalidRequest) as err:
        to_template_messages(parsed.messages)
    assert err.value.param == "messages[0].content[1].text" and "must be a string" in err.value.message
    assert not isinstance(err.value, UnsupportedParameter)


@pytest.mark.parametrize(("message", "expected"), [
    ("Expected `int`, got `str` - at `$.port`", ("port", "Expected `int`, got `str`")),
    ("Object contains unknown field `x` - at `$.messages[0]`",
     ("messages[0]", "Object contains unknown field `x`")),
    ("Expected `object`, got `array`", ("", "Expected `object`, got `array`")),
    ("Expected `object`, got `array` - at `$`", ("", "Expected `object`, got `array`")),
])
def test_msgspec_messages_split_into_where_and_what(message: str, expected: tuple[str, str]) -> None:
    assert split_validation_error(message) == expected
