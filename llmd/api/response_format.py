"""A chat request's `response_format` (and its tools) as the grammar its reply must follow.

`text` is unconstrained; `json_object` is any JSON object; `json_schema` follows its `schema`
(whether `strict` or not: llmd always enforces it, with every keyword it cannot enforce refused by
name, `engine/grammar.py`). Options that would fight the grammar's own end are refused with it.
"""

from __future__ import annotations

import json
from typing import Any

from llmd.api.tool_grammar import Spelling, Thinking, ToolSpec, call_grammar, json_grammar, xml_refusals
from llmd.api.tools import ToolRequest
from llmd.engine.client import Engine
from llmd.engine.tool_format import ChatFormat, ToolSyntax
from llmd.engine.types import ANY_OBJECT, Constraint, GrammarRequest
from llmd.errors import InvalidRequest, UnsupportedParameter
from llmd.protocol import ChatCompletionRequest, JsonObjectFormat, JsonSchemaResponseFormat

ANY_OBJECT_SCHEMA: dict[str, Any] = json.loads(ANY_OBJECT)


def response_schema(body: ChatCompletionRequest) -> tuple[dict[str, Any], str] | None:
    """The schema `response_format` asks the reply to follow, and its field; None for plain text."""
    format_ = body.response_format
    if isinstance(format_, JsonObjectFormat):
        return ANY_OBJECT_SCHEMA, "response_format"
    if isinstance(format_, JsonSchemaResponseFormat):
        schema = format_.json_schema.schema
        return (ANY_OBJECT_SCHEMA if schema is None else schema), "response_format.json_schema.schema"
    return None


def reply_grammar(body: ChatCompletionRequest, tools: ToolRequest | None, chat: ChatFormat,
                  thinking: Thinking) -> GrammarRequest | None:
    """The grammar the reply follows: its calls (`tools`), its JSON (`response_format`), after any
    thinking; None for free text. Options that would fight the grammar's own end are refused."""
    schema = response_schema(body)
    if tools is not None:
        text = call_grammar(chat.tools, tools.plan, thinking, chat.reasoning, Spelling(dict(chat.tokens)),
                            None if schema is None else schema[0])
        request = GrammarRequest(text, "tools", lark=True)
    elif schema is None:
        return None
    elif thinking is Thinking.NONE or chat.reasoning is None:
        request = GrammarRequest(json.dumps(schema[0]), schema[1])  # `json_object`: ANY_OBJECT again
    else:
        grammar = json_grammar(schema[0], thinking, chat.reasoning, Spelling(dict(chat.tokens)))
        request = GrammarRequest(grammar, schema[1], lark=True)
    for name, value in (("ignore_eos", body.ignore_eos), ("min_tokens", body.min_tokens)):
        if value:
            field = "tools" if tools is not None else "response_format"
            raise InvalidRequest(f"`{name}` cannot be combined with `{field}`: the reply ends where its "
                                 "grammar does", param=name)
    return request


def thinking_at_start(chat: ChatFormat, opened: bool) -> Thinking:
    """Where a reply's thinking stands as generation starts (the prompt may have opened it)."""
    if chat.reasoning is None:
        return Thinking.NONE
    return Thinking.OPEN if opened else Thinking.OPTIONAL


async def reply_constraint(engine: Engine, body: ChatCompletionRequest, tools: ToolRequest | None,
                           chat: ChatFormat, thinking: Thinking) -> Constraint | None:
    """The compiled grammar of the reply, or None for free text. Each tool's parameter schema is
    checked on its own first, so a refusal names the tool's field."""
    grammar = reply_grammar(body, tools, chat, thinking)
    if grammar is None:
        return None
    called = {spec.name: spec for spec in tools.plan.tools} if tools is not None else {}
    for index, tool in enumerate(body.tools or ()):
        if tool.function.name in called:
            param = f"tools[{index}].function.parameters"
            check_xml_parameters(chat, called[tool.function.name], param)
            await engine.constrain(GrammarRequest(json.dumps(called[tool.function.name].parameters), param))
    return await engine.constrain(grammar)


def check_xml_parameters(chat: ChatFormat, tool: ToolSpec, param: str) -> None:
    """Refuse string keywords a Qwen3-Coder model's raw-text values could not be held to."""
    refused = xml_refusals(tool) if chat.tools.syntax is ToolSyntax.QWEN3_CODER else []
    if refused:
        path = f"{param}.{refused[0]}"
        raise UnsupportedParameter(f"`{path}` cannot be enforced in this model's XML tool-call format, "
                                   "whose string values are raw text", param=path)
