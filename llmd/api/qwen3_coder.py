"""Reading Qwen3-Coder's XML tool call: `<function=NAME>`, then `<parameter=KEY>VALUE</parameter>`
for each argument, then `</function>`.

The values are bare text; they become JSON by the tool's parameter schema (a string unless the
schema allows only other types and the value parses as one of them). The arguments go out as
JSON text: a string value streams as it is written (a coding agent's file content must not
stall the stream until its end), any other value goes out whole when it closes; so
`{"city": "` at the first parameter's opening, `Seoul` as it comes, `"` at its close,
`, "days": 3` at the next, `}` at `</function>` (`{}` for a function without parameters). Pure.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any

from llmd.api.reasoning import partial_suffix
from llmd.api.tool_readers import SPACE, CallSink, Status


class _XmlAt(enum.Enum):
    FUNCTION = enum.auto()  # expecting `<function=`
    FUNCTION_NAME = enum.auto()
    TAG = enum.auto()  # expecting `<parameter=` or `</function>`
    PARAMETER_NAME = enum.auto()
    VALUE = enum.auto()


_FUNCTION = "<function="
_PARAMETER = "<parameter="
_FUNCTION_END = "</function>"
_PARAMETER_END = "</parameter>"


class Qwen3CoderReader:
    """Qwen3-Coder's XML call; arguments given as JSON, one fragment per closed parameter."""

    def __init__(self, sink: CallSink, parameters: Mapping[str, Mapping[str, Any]]) -> None:
        self._sink = sink
        self._parameters = parameters
        self._at = _XmlAt.FUNCTION
        self._tag = ""  # the part of a tag read so far
        self._word: list[str] = []  # a function or parameter name being read
        self._name = ""
        self._key = ""
        self._types: frozenset[str] = frozenset()
        self._value = ""  # the open value's text not yet written
        self._streaming = False  # the open value is a string, written as it comes
        self._begun = False  # the streamed value's first character has come (its newline is off)
        self._index: int | None = None
        self._written = 0  # parameters written

    def feed(self, text: str, at: int) -> tuple[int, Status]:
        """Read `text` from `at`; how far it read and where the call stands."""
        while at < len(text):
            if self._at is _XmlAt.VALUE:
                at = self._read_value(text, at)
                continue
            status = self._step(text[at])
            if status is not Status.MORE:
                return at + (status is Status.DONE), status
            at += 1
        return at, Status.MORE

    def finish(self) -> None:
        """The text ended inside the call: what was written stands ("{}" if nothing was)."""
        if self._streaming and self._at is _XmlAt.VALUE:
            self._stream(self._value)
        if self._index is not None and not self._written:
            self._sink.call_arguments(self._index, "{}")

    def _step(self, char: str) -> Status:
        if self._at is _XmlAt.FUNCTION:
            return self._tag_char(char, (_FUNCTION,))
        if self._at is _XmlAt.TAG:
            return self._tag_char(char, (_PARAMETER, _FUNCTION_END))
        return self._name_char(char)

    def _tag_char(self, char: str, tags: tuple[str, ...]) -> Status:
        if not self._tag and char in SPACE:
            return Status.MORE
        self._tag += char
        if self._tag not in tags:
            return Status.MORE if any(tag.startswith(self._tag) for tag in tags) else Status.FAILED
        tag, self._tag = self._tag, ""
        if tag == _FUNCTION_END:
            return self._close_function()
        self._at = _XmlAt.FUNCTION_NAME if tag == _FUNCTION else _XmlAt.PARAMETER_NAME
        return Status.MORE

    def _name_char(self, char: str) -> Status:
        if char in "<\n":
            return Status.FAILED
        if char != ">":
            self._word.append(char)
            return Status.MORE
        word, self._word = "".join(self._word).strip(), []
        if self._at is _XmlAt.FUNCTION_NAME:
            self._name, self._index = word, self._sink.start_call(word)
            self._at = _XmlAt.TAG
        else:
            self._open_parameter(word)
        return Status.MORE

    def _open_parameter(self, key: str) -> None:
        """A string value starts going out now; any other waits for its close."""
        self._key, self._at = key, _XmlAt.VALUE
        self._types = _schema_types(self._schema_of(key))
        self._streaming = not self._types or "string" in self._types
        self._begun = False
        if self._streaming:
            self._write(f'{json.dumps(key, ensure_ascii=False)}: "')

    def _read_value(self, text: str, at: int) -> int:
        """Take `text` from `at` into the value; past `</parameter>` when it has come."""
        before = len(self._value)
        self._value += text[at:]
        end = self._value.find(_PARAMETER_END, max(0, before - len(_PARAMETER_END) + 1))
        if end < 0:
            self._stream_decided()
            return len(text)
        self._close_parameter(self._value[:end])
        self._value, self._at = "", _XmlAt.TAG
        return at + end + len(_PARAMETER_END) - before

    def _stream_decided(self) -> None:
        """Write what of a string value can no longer be its closing newline or tag."""
        if not self._streaming:
            return
        if not self._begun and self._value:
            self._value, self._begun = self._value.removeprefix("\n"), True
        held = max(partial_suffix(self._value, "\n" + _PARAMETER_END),
                   partial_suffix(self._value, _PARAMETER_END))
        self._stream(self._value[:len(self._value) - held])
        self._value = self._value[len(self._value) - held:]

    def _close_parameter(self, raw: str) -> None:
        value = raw.removeprefix("\n") if not self._begun else raw
        value = value.removesuffix("\n")
        if self._streaming:
            self._stream(value)
            self._sink.call_arguments(self._index_now(), '"')
        else:
            self._write(f"{json.dumps(self._key, ensure_ascii=False)}: {parameter_json(value, self._types)}")
        self._streaming = False

    def _write(self, parameter: str) -> None:
        """Begin a parameter's JSON: after `{` for the first, after `, ` for the others."""
        self._sink.call_arguments(self._index_now(), (", " if self._written else "{") + parameter)
        self._written += 1

    def _stream(self, text: str) -> None:
        """Part of a string value, as JSON string text."""
        self._sink.call_arguments(self._index_now(), json.dumps(text, ensure_ascii=False)[1:-1])

    def _index_now(self) -> int:
        assert self._index is not None
        return self._index

    def _schema_of(self, key: str) -> Mapping[str, Any]:
        properties = self._parameters.get(self._name, {}).get("properties", {})
        schema = properties.get(key, {}) if isinstance(properties, Mapping) else {}
        return schema if isinstance(schema, Mapping) else {}

    def _close_function(self) -> Status:
        self._sink.call_arguments(self._index_now(), "}" if self._written else "{}")
        return Status.DONE


def _schema_types(schema: Mapping[str, Any]) -> frozenset[str]:
    """The JSON types a parameter's schema allows (its `type`, and those of anyOf/oneOf)."""
    declared = schema.get("type")
    found = set(declared) if isinstance(declared, list) else {declared} if declared else set()
    for branch in (*(schema.get("anyOf") or ()), *(schema.get("oneOf") or ())):
        if isinstance(branch, Mapping):
            found |= _schema_types(branch)
    return frozenset(found)


def parameter_json(value: str, types: frozenset[str]) -> str:
    """One XML parameter value as JSON text: a string unless the schema allows only
    non-string types and the value parses as JSON (a string when it does not)."""
    if types and "string" not in types:
        text = value.strip()
        if "boolean" in types and text.lower() in ("true", "false"):
            text = text.lower()
        try:
            return json.dumps(json.loads(text, parse_constant=_no_constant), ensure_ascii=False)
        except ValueError:
            pass
    return json.dumps(value, ensure_ascii=False)


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON: such a value stays a string."""
    raise ValueError(name)
