"""The incremental tool-call parser: every format, split anywhere, gives the same content and calls."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmd.api.qwen3_coder import parameter_json
from llmd.api.tool_parser import CallArguments, CallStart, TextPiece, ToolCallParser, ToolPiece
from llmd.engine.tool_format import GENERIC, HERMES, LLAMA3_JSON, MISTRAL, QWEN3_CODER, ToolFormat

Schemas = Mapping[str, Mapping[str, Any]]


@dataclass
class Parsed:
    """What a client would assemble from the pieces."""

    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, joined arguments)
    argument_pieces: int = 0

    def arguments(self) -> list[Any]:
        return [json.loads(arguments) for _, arguments in self.calls]


def assembled(pieces: Sequence[ToolPiece]) -> Parsed:
    """Join the pieces as a client does, checking the output contract on the way."""
    parsed = Parsed()
    for piece in pieces:
        if isinstance(piece, TextPiece):
            assert piece.text
            parsed.text += piece.text
        elif isinstance(piece, CallStart):
            assert piece.index == len(parsed.calls) and piece.name
            parsed.calls.append((piece.name, ""))
        else:
            assert piece.fragment and piece.index == len(parsed.calls) - 1
            name, arguments = parsed.calls[piece.index]
            parsed.calls[piece.index] = (name, arguments + piece.fragment)
            parsed.argument_pieces += 1
    return parsed


def parse(format: ToolFormat, chunks: Sequence[str], schemas: Schemas | None = None) -> Parsed:
    parser = ToolCallParser(format, schemas)
    pieces = [piece for chunk in chunks for piece in parser.feed(chunk)] + parser.finish()
    parsed = assembled(pieces)
    assert parser.calls == len(parsed.calls)
    return parsed


def splits(text: str) -> Iterator[list[str]]:
    """The text whole, cut in two at every position, and one character at a time."""
    yield [text]
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    yield list(text)


def parse_every_way(format: ToolFormat, text: str, schemas: Schemas | None = None) -> Parsed:
    """The one result every split of `text` gives."""
    whole = parse(format, [text], schemas)
    for chunks in splits(text):
        parsed = parse(format, chunks, schemas)
        assert (parsed.text, parsed.calls) == (whole.text, whole.calls), chunks
    return whole


def hermes_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


TRICKY = ('{"items": [{"q": "a}b", "n": [1, 2.5e3, null]}, {"q": "say \\"hi\\"", "t": true}], '
          '"tag": "</tool_call>", "path": "C:\\\\dir\\\\", "empty": {}, "u": "\\u00e9 ü"}')


@pytest.mark.parametrize("format", [HERMES, GENERIC])
def test_hermes_text_then_a_call(format: ToolFormat) -> None:
    parsed = parse_every_way(format, "Let me check.\n\n" + hermes_call("get_weather", '{"city": "Seoul"}'))
    assert parsed.text == "Let me check."
    assert parsed.calls == [("get_weather", '{"city": "Seoul"}')]


def test_hermes_parallel_calls_get_increasing_indexes() -> None:
    text = "\n".join(hermes_call(name, f'{{"n": {n}}}') for n, name in enumerate("fgh")) + "\n"
    parsed = parse_every_way(HERMES, text)
    assert parsed.text == ""
    assert parsed.calls == [("f", '{"n": 0}'), ("g", '{"n": 1}'), ("h", '{"n": 2}')]


def test_arguments_with_nested_lists_and_hostile_strings_come_through_verbatim() -> None:
    parsed = parse_every_way(HERMES, hermes_call("search", TRICKY))
    assert parsed.calls == [("search", TRICKY)]
    assert parsed.arguments() == [json.loads(TRICKY)]


def test_arguments_stream_as_they_arrive_after_the_start() -> None:
    parsed = parse(HERMES, list(hermes_call("get_weather", '{"city": "Seoul", "days": 3}')))
    assert parsed.argument_pieces > 10


def test_model_written_json_whitespace_and_reversed_keys() -> None:
    text = '<tool_call>{ "arguments" :{"a" :[ 1 ,2 ]} ,\n\t"name" : "f\\u00e9" }</tool_call>'
    parsed = parse_every_way(HERMES, text)
    assert parsed.calls == [("fé", '{"a" :[ 1 ,2 ]}')]


@pytest.mark.parametrize(("body", "arguments"), [
    ('{"name": "ping", "arguments": {}}', "{}"),
    ('{"name": "ping"}', "{}"),
    ('{"name": "ping", "arguments": "{\\"x\\": 1}"}', '{"x": 1}'),  # arguments as a JSON string
    ('{"name": "ping", "id": "call_1", "arguments": {"x": 1}, "arguments": {"y": 2}}', '{"x": 1}'),
])
def test_argument_shapes(body: str, arguments: str) -> None:
    parsed = parse_every_way(HERMES, f"<tool_call>\n{body}\n</tool_call>")
    assert parsed.calls == [("ping", arguments)]


def test_text_after_calls_is_content_and_whitespace_around_them_is_not() -> None:
    text = " \n" + hermes_call("f", "{}") + "\n\nBetween.\n" + hermes_call("g", "{}") + "\n\nDone.\n"
    parsed = parse_every_way(HERMES, text)
    assert parsed.text == "Between.Done.\n"
    assert [name for name, _ in parsed.calls] == ["f", "g"]


@pytest.mark.parametrize("format", [HERMES, QWEN3_CODER, LLAMA3_JSON, MISTRAL])
@pytest.mark.parametrize("text", [
    "a < b and b > c, <tool or <tool_ca",
    "Plain answer.\n\n  with trailing space  \n",
    "use {braces} and [TOOL] and {\"key\": 1} or {\"nam",
    "<", "{", "[TOOL_CALLS", "",
])
def test_text_that_is_no_call_comes_through_unchanged(format: ToolFormat, text: str) -> None:
    parsed = parse_every_way(format, text)
    assert (parsed.text, parsed.calls) == (text, [])


def test_a_marker_start_is_held_until_decided() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed("x <tool") == [TextPiece("x")]
    assert parser.feed("s") == [TextPiece(" <tools")]
    assert parser.feed(" <tool_") == []
    assert parser.finish() == [TextPiece(" <tool_")]


def test_a_malformed_call_region_is_given_back_as_text() -> None:
    text = "Look: <tool_call>not json</tool_call> " + hermes_call("f", '{"a": 1}')
    parsed = parse_every_way(HERMES, text)
    assert parsed.text == "Look: <tool_call>not json"
    assert parsed.calls == [("f", '{"a": 1}')]


def test_a_nameless_object_is_given_back_as_text() -> None:
    text = '<tool_call>{"arguments": {}}</tool_call>'
    assert parse_every_way(HERMES, text).text == '<tool_call>{"arguments": {}}'


@pytest.mark.parametrize(("cut", "calls"), [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Se', [("get_weather", '{"city": "Se')]),
    ('<tool_call>\n{"name": "get_weather", "argu', [("get_weather", "{}")]),
    ('<tool_call>\n{"name": "get_wea', []),
    ('<tool_call>\n{"arguments": {"a": 1}', []),
])
def test_an_unfinished_call_gives_what_it_has(cut: str, calls: list[tuple[str, str]]) -> None:
    parsed = parse_every_way(HERMES, cut)
    assert (parsed.text, parsed.calls) == ("", calls)


def test_llama3_calls_after_the_python_tag_separated_by_semicolons_and_newlines() -> None:
    text = ('<|python_tag|>{"name": "f", "parameters": {"x": "}"}}; {"name": "g", "parameters": {}}\n'
            '{"type": "function", "name": "h", "parameters": {"n": [1, {"m": 2}]}}')
    parsed = parse_every_way(LLAMA3_JSON, text)
    assert parsed.text == ""
    assert parsed.calls == [("f", '{"x": "}"}'), ("g", "{}"), ("h", '{"n": [1, {"m": 2}]}')]


def test_llama3_call_after_text() -> None:
    parsed = parse_every_way(LLAMA3_JSON, 'Calling it {now}.\n{ "name": "f", "arguments": {"a": 1}}')
    assert parsed.text == "Calling it {now}."
    assert parsed.calls == [("f", '{"a": 1}')]


def test_mistral_every_element_is_a_call_and_ids_are_ignored() -> None:
    text = ('Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": [{"b": "]"}]}, "id": "abc123DEF"},\n'
            ' {"id": "xyz", "name": "g", "arguments": {}}]')
    parsed = parse_every_way(MISTRAL, text)
    assert parsed.text == "Sure."
    assert parsed.calls == [("f", '{"a": [{"b": "]"}]}'), ("g", "{}")]


def test_mistral_unfinished_list() -> None:
    parsed = parse_every_way(MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arg')
    assert parsed.calls == [("f", '{"a": 1}'), ("g", "{}")]


WEATHER: Schemas = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "where": {"type": "object"}, "hours": {"type": "array"}, "scale": {"type": ["number", "null"]},
    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}


def qwen_call(name: str, parameters: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_coder_values_typed_by_the_schema() -> None:
    text = qwen_call("get_weather", [("city", "Seoul"), ("days", "3"), ("metric", "True"),
                                     ("where", '{"lat": 37.5}'), ("hours", "[1, 2]"),
                                     ("scale", "null"), ("note", "null")])
    parsed = parse_every_way(QWEN3_CODER, "Checking.\n" + text, WEATHER)
    assert parsed.text == "Checking."
    assert parsed.calls == [("get_weather", '{"city": "Seoul", "days": 3, "metric": true, '
                             '"where": {"lat": 37.5}, "hours": [1, 2], "scale": null, "note": "null"}')]


def test_qwen3_coder_strings_stream_and_typed_values_go_out_at_their_close() -> None:
    parser = ToolCallParser(QWEN3_CODER, WEATHER)
    text = qwen_call("get_weather", [("city", "Seoul"), ("days", "3")])
    pieces = [piece for char in text for piece in parser.feed(char)] + parser.finish()
    fragments = [piece.fragment for piece in pieces if isinstance(piece, CallArguments)]
    assert pieces[0] == CallStart(0, "get_weather")
    assert fragments == ['{"city": "', *"Seoul", '"', ', "days": 3', "}"]


def test_qwen3_coder_a_string_value_is_written_as_soon_as_it_cannot_be_its_close() -> None:
    parser = ToolCallParser(QWEN3_CODER)
    assert parser.feed("<tool_call>\n<function=w>\n<parameter=c>\n")[1:] == [CallArguments(0, '{"c": "')]
    assert parser.feed('a\n"b"\n</par') == [CallArguments(0, 'a\\n\\"b\\"')]
    assert parser.feed("ameter>\n</function>") == [CallArguments(0, '"}')]


def test_qwen3_coder_multiline_values_parameterless_and_parallel_calls() -> None:
    code = "def f(a):\n    return a < 2 and '</param' or \"x\"\n"
    text = qwen_call("write", [("code", code), ("n", "2")]) + "\n" + qwen_call("now", [])
    parsed = parse_every_way(QWEN3_CODER, text)  # no schema: every value is a string
    assert parsed.calls == [("write", json.dumps({"code": code, "n": "2"})), ("now", "{}")]


def test_qwen3_coder_malformed_and_unfinished() -> None:
    assert parse_every_way(QWEN3_CODER, "<tool_call>\nhello").text == "<tool_call>\nhello"
    cut = parse_every_way(QWEN3_CODER, "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n<param")
    assert cut.calls == [("f", '{"a": "x"')]
    assert parse_every_way(QWEN3_CODER, "<tool_call>\n<function=f>\n<parameter=a>\nx\n</par").calls == [
        ("f", '{"a": "x\\n</par')]
    assert parse_every_way(QWEN3_CODER, "<tool_call>\n<function=f>\n<parameter=").calls == [("f", "{}")]


@pytest.mark.parametrize(("value", "types", "json_text"), [
    ("3", frozenset({"integer"}), "3"),
    ("three", frozenset({"integer"}), '"three"'),
    ("NaN", frozenset({"number"}), '"NaN"'),
    ("FALSE", frozenset({"boolean"}), "false"),
    ("3", frozenset({"string"}), '"3"'),
    ("3", frozenset(), '"3"'),
    (' {"a": [1]} ', frozenset({"object"}), '{"a": [1]}'),
    ("é", frozenset(), '"é"'),
])
def test_parameter_json(value: str, types: frozenset[str], json_text: str) -> None:
    assert parameter_json(value, types) == json_text


SAMPLES = [
    (HERMES, "Hi <b>!\n" + hermes_call("a", TRICKY) + "\n" + hermes_call("b", "{}") + " bye"),
    (LLAMA3_JSON, '{x} <|python_tag|>{"name": "a", "parameters": ' + TRICKY + '};{"name": "b"}'),
    (MISTRAL, '[x] [TOOL_CALLS][{"name": "a", "arguments": ' + TRICKY + '}, {"name": "b"}] ok'),
    (QWEN3_CODER, "<tool_call>\n<function=a>\n<parameter=x>\n<b>}\n</parameter>\n</function>\n</tool_call>"
                  "<tool_call><function=b></function></tool_call> ok"),
]


@settings(max_examples=60, deadline=None)
@given(sample=st.sampled_from(SAMPLES), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_cutting_gives_the_same_result(sample: tuple[ToolFormat, str], cuts: list[int]) -> None:
    format, text = sample
    bounds = [0, *sorted(cut % (len(text) + 1) for cut in cuts), len(text)]
    chunks = [text[start:end] for start, end in itertools.pairwise(bounds)]
    whole, cut = parse(format, [text]), parse(format, chunks)
    assert (cut.text, cut.calls) == (whole.text, whole.calls)
    assert [name for name, _ in whole.calls] == ["a", "b"]


def test_mistral_newer_name_then_args_form() -> None:
    text = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Seoul", "x": ["]"]}[TOOL_CALLS]now[ARGS]{} ok'
    parsed = parse_every_way(MISTRAL, text)
    assert parsed.text == "Sure.ok"
    assert parsed.calls == [("get_weather", '{"city": "Seoul", "x": ["]"]}'), ("now", "{}")]


@pytest.mark.parametrize(("text", "calls"), [
    ("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Se", [("get_weather", '{"city": "Se')]),
    ("[TOOL_CALLS]get_weather[AR", []),
    ("[TOOL_CALLS]now[ARGS]", [("now", "{}")]),
])
def test_mistral_newer_form_unfinished(text: str, calls: list[tuple[str, str]]) -> None:
    assert parse_every_way(MISTRAL, text).calls == calls


def test_mistral_newer_form_malformed_is_text() -> None:
    assert parse_every_way(MISTRAL, "[TOOL_CALLS]get weather").text == "[TOOL_CALLS]get weather"


def test_a_long_output_streams_through_with_little_held() -> None:
    parser = ToolCallParser(HERMES)
    body = json.dumps({"text": "x < y } ] \\\" " * 2000})
    text = "word <b> " * 2000 + hermes_call("f", body)
    pieces = [piece for start in range(0, len(text), 3) for piece in parser.feed(text[start:start + 3])]
    assert sum(isinstance(piece, TextPiece) for piece in pieces) > 1000  # content was not held back
    parsed = assembled(pieces + parser.finish())
    assert parsed.calls == [("f", body)] and parsed.text == ("word <b> " * 2000).rstrip()


def test_a_format_without_markers_passes_text_through() -> None:
    bare = ToolFormat(HERMES.syntax, "", "")
    assert parse_every_way(bare, "a <tool_call> b") == Parsed("a <tool_call> b")
