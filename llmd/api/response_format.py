"""A chat request's `response_format` as the grammar its reply must follow.

`text` is unconstrained; `json_object` is any JSON object; `json_schema` follows its `schema`
(whether `strict` or not: llmd always enforces it, with every keyword it cannot enforce refused by
name, `engine/grammar.py`). Options that would fight the grammar's own end are refused with it.
"""

from __future__ import annotations

import json

from llmd.engine.types import ANY_OBJECT, GrammarRequest
from llmd.errors import InvalidRequest
from llmd.protocol import ChatCompletionRequest, JsonObjectFormat, JsonSchemaResponseFormat


def grammar_request(body: ChatCompletionRequest) -> GrammarRequest | None:
    """The grammar `response_format` asks for; None for plain text (or none given)."""
    format_ = body.response_format
    if isinstance(format_, JsonObjectFormat):
        request = GrammarRequest(ANY_OBJECT, "response_format")
    elif isinstance(format_, JsonSchemaResponseFormat):
        schema = format_.json_schema.schema
        request = GrammarRequest(ANY_OBJECT if schema is None else json.dumps(schema),
                                 "response_format.json_schema.schema")
    else:
        return None
    for name, value in (("ignore_eos", body.ignore_eos), ("min_tokens", body.min_tokens)):
        if value:
            raise InvalidRequest(f"`{name}` cannot be combined with `response_format`: the reply ends "
                                 "where its grammar does", param=name)
    return request
