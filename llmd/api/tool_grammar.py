"""The grammar a chat reply must follow, as llguidance Lark text: tool calls, JSON, thinking first.

Calls are written in the model's own format (`engine/tool_format.py`), with the layout fixed: the
name first, then the arguments, which follow the tool's parameter schema (`%json`, the JSON
layout of `engine/grammar.py`). `tool_choice: "required"` (or a named tool) starts the reply
with a call; `"auto"` leaves the reply free text until the call marker appears, and from there
holds it to a call (a lazy trigger: plain text never pays more than the text rule). A reasoning
model thinks first, unconstrained up to its end marker.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmd.engine.grammar import JSON_LAYOUT
from llmd.engine.tool_format import ReasoningMarkers, ToolFormat, ToolSyntax

# Parameters of a tool that declares none: the arguments are `{}`.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class Thinking(enum.Enum):
    """Where the reply's thinking stands when generation starts."""

    NONE = "none"  # not a reasoning model, or thinking turned off
    OPTIONAL = "optional"  # the model may open a thinking section first
    OPEN = "open"  # the prompt opened it: the reply starts inside the thinking


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the grammar needs it: its name and its parameters' JSON schema."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """Which calls the reply makes: `required` (at least one, first thing), else free text or calls."""

    tools: Sequence[ToolSpec]
    required: bool
    parallel: bool


def literal(text: str) -> str:
    """`text` as a Lark string literal."""
    return json.dumps(text)


class Spelling:
    """Writes grammar text with the markers that are single tokens as those tokens.

    llguidance keeps a special token (and an added one written like `<tool_call>`) out of text
    lexemes: such a marker must be named by its id (`<[id]>`), never matched as text.
    """

    def __init__(self, tokens: Mapping[str, int] | None = None) -> None:
        self.tokens = dict(tokens or {})
        ordered = sorted(self.tokens, key=len, reverse=True)
        self._pattern = re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None

    def text(self, text: str) -> str:
        """`text` as a Lark expression: literals, and each token marker as its token."""
        if self._pattern is None:
            return literal(text)
        parts = [f"<[{self.tokens[part]}]>" if k % 2 else literal(part)
                 for k, part in enumerate(self._pattern.split(text)) if part]
        return " ".join(parts) or '""'

    def is_token(self, text: str) -> bool:
        """Whether `text` is one token marker."""
        return text in self.tokens


PLAIN_SPELLING = Spelling()


def json_rule(schema: dict[str, Any]) -> str:
    """An inline JSON-schema rule in llmd's JSON layout."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def thinking_rules(thinking: Thinking, markers: ReasoningMarkers | None, spell: Spelling) -> list[str]:
    """The `prefix` rule: thinking (free text up to the end marker) and the whitespace after it."""
    if thinking is Thinking.NONE or markers is None:
        return ["prefix: \"\""]
    rules = ["THINK_TEXT: /(.|\\n)*/", "AFTER_THINK: /[ \\t\\r\\n]*/"]
    if spell.is_token(markers.end):  # text lexemes never hold a token marker: no need to be lazy
        rules.append(f"think_rest: THINK_TEXT {spell.text(markers.end)}")
    else:
        rules.append(f"think_rest[lazy]: THINK_TEXT {literal(markers.end)}")
    if thinking is Thinking.OPEN:
        return ["prefix: think_rest AFTER_THINK", *rules]
    return [f"prefix: ({spell.text(markers.start)} think_rest AFTER_THINK)?", *rules]


def json_grammar(schema: dict[str, Any], thinking: Thinking, markers: ReasoningMarkers | None,
                 spell: Spelling = PLAIN_SPELLING) -> str:
    """A reply that is JSON following `schema`, after any thinking."""
    return lark(["start: prefix body", f"body: {json_rule(schema)}",
                 *thinking_rules(thinking, markers, spell)])


def lark(rules: list[str]) -> str:
    """The grammar text."""
    return "\n".join(["%llguidance {}", *rules]) + "\n"


def call_grammar(fmt: ToolFormat, plan: CallPlan, thinking: Thinking, markers: ReasoningMarkers | None,
                 spell: Spelling = PLAIN_SPELLING, answer: dict[str, Any] | None = None) -> str:
    """A reply that calls tools in `fmt` as `plan` says, after any thinking.

    Markers that are single tokens (`spell`) are written as those tokens. `answer` is the schema
    a reply that calls nothing follows (`response_format`), instead of free text.
    """
    opener = spell.text(call_opener(fmt))
    rules = ["start: prefix body", *call_rules(fmt, plan, spell), *thinking_rules(thinking, markers, spell),
             "TEXT: /(.|\\n)*/"]
    single = not plan.parallel or (fmt.syntax in SINGLE_OPENER and not fmt.name_separator)
    separator = "" if fmt.name_separator else SEPARATOR  # Mistral's named calls follow each other
    # The reply ends with its last call: nothing but another call may follow it.
    calls = f"{opener} rest" + ("" if single else f" ({spell.text(separator + call_opener(fmt))} rest)*")
    if plan.required:
        rules.append(f"body: {calls}")
    elif answer is not None:
        rules.append(f"body: {json_rule(answer)} | {calls}")
    elif spell.is_token(call_opener(fmt)):  # text never holds the token: the call follows it
        rules.append(f"body: TEXT | TEXT {calls}")
    else:
        after = calls.removeprefix(opener).lstrip()  # the trigger itself holds the opener
        rules += [f"trigger[lazy]: TEXT {opener}", f"body: TEXT | trigger {after}"]
    return lark(rules)


# Formats whose one opener holds every call (Mistral's list) or that make one call (Llama 3's JSON).
SINGLE_OPENER = frozenset({ToolSyntax.MISTRAL, ToolSyntax.LLAMA3_JSON})
SEPARATOR = "\n"


def call_opener(fmt: ToolFormat) -> str:
    """The text that starts a call; Llama 3's call is its JSON object, opened by the name key."""
    return '{"name": ' if fmt.syntax is ToolSyntax.LLAMA3_JSON else fmt.start


def call_rules(fmt: ToolFormat, plan: CallPlan, spell: Spelling) -> list[str]:
    """`rest`: what follows the opener, one alternative per tool."""
    if fmt.syntax is ToolSyntax.QWEN3_CODER:
        return xml_call_rules(fmt, plan.tools, spell)
    keyed = [f"call_{k}: {json_call(fmt, tool, spell)}" for k, tool in enumerate(plan.tools)]
    alternatives = " | ".join(f"call_{k}" for k in range(len(plan.tools)))
    if fmt.syntax is ToolSyntax.MISTRAL and not fmt.name_separator:
        more = f" ({literal(', ')} one_call)*" if plan.parallel else ""
        return [*keyed, f"one_call: {alternatives}", f"rest: \"[\" one_call{more} \"]\""]
    return [*keyed, f"rest: {alternatives}"]


def json_call(fmt: ToolFormat, tool: ToolSpec, spell: Spelling) -> str:
    """One tool's call after the opener: the name, the arguments by schema, the close."""
    name = json.dumps(tool.name)
    arguments = json_rule(tool.parameters)
    key = json.dumps(fmt.arguments_key)
    if fmt.syntax is ToolSyntax.LLAMA3_JSON:
        return f"{literal(f'{name}, {key}: ')} {arguments} \"}}\""
    if fmt.name_separator:
        return f"{spell.text(tool.name + fmt.name_separator)} {arguments}"
    head = f'{{"name": {name}, {key}: '
    if fmt.syntax is ToolSyntax.MISTRAL:
        return f"{literal(head)} {arguments} \"}}\""
    return f"{spell.text(chr(10) + head)} {arguments} {spell.text('}' + chr(10) + fmt.end)}"


def xml_call_rules(fmt: ToolFormat, tools: Sequence[ToolSpec], spell: Spelling) -> list[str]:
    """Qwen3-Coder's calls: `<function=NAME>` and one `<parameter=KEY>` block per argument, in the
    schema's order (optional ones may be left out); strings are raw text, other values JSON."""
    rules = ["VALUE_TEXT: /(.|\\n)*/"]
    for k, tool in enumerate(tools):
        properties = tool.parameters.get("properties") or {}
        required = set(tool.parameters.get("required") or ())
        parts = []
        for j, (key, schema) in enumerate(properties.items()):
            rules += parameter_rules(f"p_{k}_{j}", key, schema if isinstance(schema, dict) else {}, spell)
            parts.append(f"p_{k}_{j}" if key in required else f"p_{k}_{j}?")
        head = spell.text(f"\n<function={tool.name}>\n")
        rules.append(f"call_{k}: {head} {' '.join(parts)} {spell.text('</function>' + chr(10) + fmt.end)}")
    rules.append("rest: " + " | ".join(f"call_{k}" for k in range(len(tools))))
    return rules


def parameter_rules(rule: str, key: str, schema: dict[str, Any], spell: Spelling) -> list[str]:
    """One `<parameter=KEY>` block: a string runs to the closing tag (one of its `enum` values, if
    it has them), any other type is JSON."""
    head = spell.text(f"<parameter={key}>\n")
    close = spell.text("\n</parameter>\n")
    if schema.get("type") != "string":
        return [f"{rule}: {head} {json_rule(schema)} {close}"]
    choices = [schema["const"]] if "const" in schema else schema.get("enum")
    if choices:
        return [f"{rule}: {head} ({' | '.join(literal(str(choice)) for choice in choices)}) {close}"]
    if spell.is_token("</parameter>"):  # the value's own last newline is the one before the tag
        return [f"{rule}: {head} VALUE_TEXT {spell.text('</parameter>' + chr(10))}"]
    return [f"{rule}_value[lazy]: VALUE_TEXT {literal(chr(10) + '</parameter>')}",
            f"{rule}: {head} {rule}_value \"\\n\""]


# String keywords the raw text of an XML parameter cannot be held to (JSON formats enforce them).
XML_UNENFORCEABLE = ("pattern", "minLength", "maxLength", "format")


def xml_refusals(tool: ToolSpec) -> list[str]:
    """The keywords of a tool's string parameters that Qwen3-Coder's raw-text values cannot follow,
    as `properties.KEY.KEYWORD` paths."""
    properties = tool.parameters.get("properties") or {}
    return [f"properties.{key}.{keyword}" for key, schema in properties.items()
            if isinstance(schema, dict) and schema.get("type") == "string"
            for keyword in XML_UNENFORCEABLE if keyword in schema]
