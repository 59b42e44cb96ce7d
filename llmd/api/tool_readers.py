"""The readers of one tool-call region, each fed the text after its call marker.

`JsonCallReader` reads one `{"name": ..., "arguments": ...}` object a character at a time and
streams the arguments value's own text as it arrives (held until the name is known when the
name comes last); `MistralReader` reads Mistral's list of such objects, or its newer
`NAME[ARGS]{...}` (Qwen3-Coder's XML reader is in llmd.api.qwen3_coder). Each reports calls to
a `CallSink` and answers every feed with how far it read and whether its region is over (DONE),
needs more text (MORE) or is not what it should be (FAILED, at the first character that does
not fit). Pure.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any, Protocol

SPACE = " \t\r\n"


class Status(enum.Enum):
    """Where a reader stands after a feed."""

    MORE = enum.auto()
    DONE = enum.auto()
    FAILED = enum.auto()


class CallSink(Protocol):
    """Where readers report calls."""

    def start_call(self, name: str) -> int: ...

    def call_arguments(self, index: int, fragment: str) -> None: ...


class _Push(enum.Enum):
    INSIDE = enum.auto()  # the character belongs to the value, which goes on
    LAST = enum.auto()  # the character ends the value
    AFTER = enum.auto()  # the value ended just before the character (a bare number or word)


class JsonValue:
    """Finds where one JSON value ends, fed a character at a time (strings, escapes and
    nesting tracked; nothing decoded)."""

    def __init__(self) -> None:
        self._started = False
        self._bare = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def push(self, char: str) -> _Push:
        """Place `char` relative to the value."""
        if self._in_string:
            return self._string(char)
        if not self._started:
            return self._begin(char)
        if self._bare:
            return _Push.AFTER if char in ",}]" or char in SPACE else _Push.INSIDE
        return self._nested(char)

    def _begin(self, char: str) -> _Push:
        self._started = True
        self._in_string = char == '"'
        self._depth = 1 if char in "{[" else 0
        self._bare = not self._in_string and not self._depth
        return _Push.AFTER if self._bare and char in ",}]" else _Push.INSIDE

    def _string(self, char: str) -> _Push:
        if self._escaped:
            self._escaped = False
        elif char == "\\":
            self._escaped = True
        elif char == '"':
            self._in_string = False
            return _Push.LAST if self._depth == 0 else _Push.INSIDE
        return _Push.INSIDE

    def _nested(self, char: str) -> _Push:
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            return _Push.LAST if self._depth == 0 else _Push.INSIDE
        return _Push.INSIDE


class _Role(enum.Enum):
    NAME = enum.auto()
    ARGUMENTS = enum.auto()  # the arguments object's text, streamed
    ARGUMENTS_STRING = enum.auto()  # arguments written as a JSON string of JSON: decoded at its end
    OTHER = enum.auto()  # a key we do not use ("id", "type"): skipped


class _At(enum.Enum):
    OPEN = enum.auto()
    KEY_OR_END = enum.auto()
    KEY = enum.auto()
    COLON = enum.auto()
    VALUE_START = enum.auto()
    VALUE = enum.auto()
    COMMA_OR_END = enum.auto()


class _StreamedCall:
    """A reader that takes a call one character at a time (`_step`) and streams its arguments to
    the sink as they come; `_index` is the call's once started."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._index: int | None = None
        self._pending: list[str] = []  # arguments text not yet given to the sink
        self._streamed = False

    def _step(self, char: str) -> Status:
        raise NotImplementedError

    def feed(self, text: str, at: int) -> tuple[int, Status]:
        """Read `text` from `at`; how far it read and where the call stands."""
        for position in range(at, len(text)):
            status = self._step(text[position])
            if status is not Status.MORE:
                self._flush()
                return position + (status is Status.DONE), status
        self._flush()
        return len(text), Status.MORE

    def finish(self) -> None:
        """The text ended (or broke) inside the call: give what arguments it has."""
        self._flush()
        if self._index is not None and not self._streamed:
            self._sink.call_arguments(self._index, "{}")

    def _flush(self) -> None:
        if self._index is not None and self._pending:
            self._sink.call_arguments(self._index, "".join(self._pending))
            self._pending.clear()
            self._streamed = True


class JsonCallReader(_StreamedCall):
    """One call written as a JSON object with a name and an arguments key."""

    def __init__(self, sink: CallSink, argument_keys: frozenset[str]) -> None:
        super().__init__(sink)
        self._argument_keys = argument_keys
        self._at = _At.OPEN
        self._value = JsonValue()
        self._token: list[str] = []  # the key, the name or string arguments being read
        self._key = ""
        self._role = _Role.OTHER
        self._name: str | None = None
        self._has_arguments = False
        self._steps: dict[_At, Callable[[str], Status]] = {
            _At.OPEN: self._open, _At.KEY_OR_END: self._key_or_end, _At.KEY: self._key_char,
            _At.COLON: self._colon, _At.VALUE_START: self._value_start,
            _At.VALUE: self._value_char, _At.COMMA_OR_END: self._comma_or_end,
        }

    def _step(self, char: str) -> Status:
        return self._steps[self._at](char)

    def _open(self, char: str) -> Status:
        return self._expect(char, "{", _At.KEY_OR_END)

    def _colon(self, char: str) -> Status:
        return self._expect(char, ":", _At.VALUE_START)

    def _expect(self, char: str, wanted: str, then: _At) -> Status:
        if char in SPACE:
            return Status.MORE
        if char != wanted:
            return Status.FAILED
        self._at = then
        return Status.MORE

    def _key_or_end(self, char: str) -> Status:
        if char == '"':
            self._at, self._value = _At.KEY, JsonValue()
            return self._key_char(char)
        return self._comma_or_end(char)

    def _key_char(self, char: str) -> Status:
        self._token.append(char)
        if self._value.push(char) is _Push.LAST:
            self._key, self._at = _decoded(self._token), _At.COLON
            self._token = []
        return Status.MORE

    def _value_start(self, char: str) -> Status:
        if char in SPACE:
            return Status.MORE
        self._role = self._role_of(self._key, char)
        self._at, self._value = _At.VALUE, JsonValue()
        return self._value_char(char)

    def _role_of(self, key: str, first: str) -> _Role:
        if key == "name" and self._name is None:
            return _Role.NAME
        if key in self._argument_keys and not self._has_arguments:
            self._has_arguments = True
            return _Role.ARGUMENTS_STRING if first == '"' else _Role.ARGUMENTS
        return _Role.OTHER

    def _value_char(self, char: str) -> Status:
        push = self._value.push(char)
        if push is _Push.AFTER:
            return self._value_end() or self._comma_or_end(char)
        if self._role is _Role.ARGUMENTS:
            self._pending.append(char)
        elif self._role is not _Role.OTHER:
            self._token.append(char)
        if push is _Push.LAST:
            return self._value_end() or Status.MORE
        return Status.MORE

    def _value_end(self) -> Status | None:
        """The value just read is complete; FAILED when the name is not a string."""
        self._at = _At.COMMA_OR_END
        token, self._token = self._token, []
        if self._role is _Role.ARGUMENTS_STRING:
            self._pending.append(_unquoted(token))
        if self._role is not _Role.NAME:
            return None
        name = _decoded(token)
        if not isinstance(name, str):
            return Status.FAILED
        self._name = name
        self._index = self._sink.start_call(name)
        return None

    def _comma_or_end(self, char: str) -> Status:
        if char in SPACE:
            return Status.MORE
        if char == ",":
            self._at = _At.KEY_OR_END
            return Status.MORE
        if char != "}" or self._index is None:
            return Status.FAILED
        if not self._has_arguments:
            self._pending.append("{}")
        return Status.DONE


def _decoded(token: list[str]) -> Any:
    """The JSON value of a complete token's text; None when it is not JSON."""
    try:
        return json.loads("".join(token))
    except ValueError:
        return None


def _unquoted(token: list[str]) -> str:
    """Arguments some models write as a JSON string holding the JSON: the string's text."""
    value = _decoded(token)
    return value if isinstance(value, str) else "".join(token)


class _ListAt(enum.Enum):
    OPEN = enum.auto()
    ELEMENT_OR_END = enum.auto()
    ELEMENT = enum.auto()
    COMMA_OR_END = enum.auto()


class MistralReader:
    """What follows `[TOOL_CALLS]`: a list `[{call}, {call}, ...]`, each element one call, or
    (Mistral Small 3.2, Devstral, Magistral templates) one `NAME[ARGS]{...}`."""

    def __init__(self, sink: CallSink, argument_keys: frozenset[str]) -> None:
        self._sink = sink
        self._argument_keys = argument_keys
        self._at = _ListAt.OPEN
        self._element: JsonCallReader | None = None
        self._named: MistralNamedCall | None = None

    def feed(self, text: str, at: int) -> tuple[int, Status]:
        """Read `text` from `at`; how far it read and where the call region stands."""
        while at < len(text):
            if self._named is None and self._at is _ListAt.OPEN and text[at] not in SPACE + "[":
                self._named = MistralNamedCall(self._sink)
            if self._named is not None:
                return self._named.feed(text, at)
            if self._element is not None:
                at, status = self._element.feed(text, at)
                if status is not Status.DONE:
                    return at, status
                self._element, self._at = None, _ListAt.COMMA_OR_END
                continue
            status = self._framing(text[at])
            if status is not Status.MORE:
                return at + (status is Status.DONE), status
            at += 1
        return at, Status.MORE

    def finish(self) -> None:
        """The text ended inside the region: the open call gives what it has."""
        if self._element is not None:
            self._element.finish()
        if self._named is not None:
            self._named.finish()

    def _framing(self, char: str) -> Status:
        if char in SPACE:
            return Status.MORE
        if self._at is _ListAt.OPEN:
            return self._advance(char == "[", _ListAt.ELEMENT_OR_END)
        if char == "]":
            return Status.DONE
        if self._at is _ListAt.COMMA_OR_END:
            return self._advance(char == ",", _ListAt.ELEMENT_OR_END)
        if char != "{":
            return Status.FAILED
        self._element = JsonCallReader(self._sink, self._argument_keys)
        self._element.feed(char, 0)
        return Status.MORE

    def _advance(self, fits: bool, then: _ListAt) -> Status:
        if not fits:
            return Status.FAILED
        self._at = then
        return Status.MORE


_ARGS = "[ARGS]"


class MistralNamedCall(_StreamedCall):
    """`NAME[ARGS]{...}`: the name up to `[ARGS]`, then the arguments object, streamed."""

    def __init__(self, sink: CallSink) -> None:
        super().__init__(sink)
        self._name: list[str] = []
        self._tag = ""
        self._value = JsonValue()

    def _step(self, char: str) -> Status:
        if self._index is not None:
            return self._argument(char)
        if self._tag or char == "[":
            return self._args_tag(char)
        if char in SPACE or char in '{}"':
            return Status.FAILED
        self._name.append(char)
        return Status.MORE

    def _args_tag(self, char: str) -> Status:
        self._tag += char
        if self._tag == _ARGS and self._name:
            self._index = self._sink.start_call("".join(self._name))
            return Status.MORE
        return Status.MORE if _ARGS.startswith(self._tag) and self._tag != _ARGS else Status.FAILED

    def _argument(self, char: str) -> Status:
        if not self._pending and not self._streamed and char in SPACE:
            return Status.MORE
        if not self._pending and not self._streamed and char not in "{[":
            return Status.FAILED
        self._pending.append(char)
        return Status.DONE if self._value.push(char) is _Push.LAST else Status.MORE
