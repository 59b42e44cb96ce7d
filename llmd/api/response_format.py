"""A chat request's `response_format` (and its tools) as the grammar its reply must follow.

`text` is unconstrained; `json_object` is any JSON object; `json_schema` follows its `schema`
(whether `strict` or not: llmd always enforces it, with every keyword it cannot enforce refused by
name, `engine/grammar.py`). Options that would fight the grammar's own end are refused with it.
"""

from __future__ import annotations

import json
from typing import Any

from llmd.api.tool_grammar import Spelling, Thinking, call_grammar, json_grammar
from llmd.api.tools import ToolRequest
from llmd.engine.tool_format import ChatFormat
from llmd.engine.types import ANY_OBJECT, GrammarRequest
from llmd.errors import InvalidRequest
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
        request = GrammarRequest(json.dumps(schema[0]) if schema[0] is not ANY_OBJECT_SCHEMA else ANY_OBJECT,
                                 schema[1])
    else:
        grammar = json_grammar(schema[0], thinking, chat.reasoning, Spelling(dict(chat.tokens)))
        request = GrammarRequest(grammar, schema[1], lark=True)
    for name, value in (("ignore_eos", body.ignore_eos), ("min_tokens", body.min_tokens)):
        if value:
            field = "tools" if tools is not None else "response_format"
            raise InvalidRequest(f"`{name}` cannot be combined with `{field}`: the reply ends where its "
                                 "grammar does", param=name)
    return request
