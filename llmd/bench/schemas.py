"""The JSON schemas `llmd bench` constrains replies with: the shapes real clients send.

Each one is the schema of a Pydantic model as a client library sends it in
`response_format: {type: json_schema, json_schema: {name, schema, strict}}`: "strict" ones as
openai-python's `chat.completions.parse` does (`to_strict_json_schema`: every property
required, `additionalProperties: false`, optionals as `anyOf [..., null]`), "loose" ones as
`model_json_schema()` writes them for LangChain's `with_structured_output(method="json_schema")`
and instructor (defaults kept, optional properties not required). Between them: nested objects
through `$defs`/`$ref`, a recursive `$ref`, enums (Enum classes and `Literal`s), arrays of
objects, bounds (`minimum`, `maxItems`, `minItems`), unions, `format` date and date-time, and a
free-form `additionalProperties` map. Generated once (pydantic 2.14 and openai-python's
`to_strict_json_schema`) and kept as data in llmd/bench/schema_set.py, so the bench needs neither
package.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from llmd.bench.schema_set import MODELS, JsonSchema

Format = dict[str, Any]  # a request's `response_format`


@dataclass(frozen=True, slots=True)
class BenchSchema:
    """One schema of the set: the model's name, how a client sent it, and the schema itself."""

    name: str
    source: str  # "strict" (openai-python `parse`) or "loose" (`model_json_schema()`)
    schema: JsonSchema

    def response_format(self, nonce: str | None = None) -> Format:
        """The request's `response_format`; a `nonce` makes the schema's text new to a server's
        grammar cache (it only changes the `title`, which constrains nothing)."""
        schema = self.schema if nonce is None else _titled(self.schema, f"{self.name} {nonce}")
        spec: Format = {"name": self.name, "schema": schema}
        if self.source == "strict":
            spec["strict"] = True
        return {"type": "json_schema", "json_schema": spec}


def _titled(schema: JsonSchema, title: str) -> JsonSchema:
    renamed = copy.deepcopy(schema)
    renamed["title"] = title
    return renamed


def parses_as_object(text: str) -> bool:
    """True when `text` is one JSON object and nothing else (what every schema here asks for)."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


SCHEMAS: tuple[BenchSchema, ...] = tuple(BenchSchema(*entry) for entry in MODELS)


@dataclass(slots=True)
class SchemaMix:
    """Which of a run's C clients send every request under a JSON schema (the first `clients`),
    and the schemas of the set they take in turn, so concurrent rows follow different grammars."""

    clients: int
    schemas: tuple[BenchSchema, ...] = SCHEMAS
    sent: int = 0

    def format_for(self, client: int) -> Format | None:
        """The `response_format` client number `client` sends next; None for a plain request."""
        if client >= self.clients:
            return None
        schema = self.schemas[self.sent % len(self.schemas)]
        self.sent += 1
        return schema.response_format()
