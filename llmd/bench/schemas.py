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
`to_strict_json_schema`) and kept as data, so the bench needs neither package.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

JsonSchema = dict[str, Any]
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


SCHEMAS: tuple[BenchSchema, ...] = (
    BenchSchema(
        "CalendarEvent",
        "strict",
        {
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "date": {"title": "Date", "type": "string"},
                "participants": {"items": {"type": "string"}, "title": "Participants", "type": "array"},
            },
            "required": ["name", "date", "participants"],
            "title": "CalendarEvent",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "MathReasoning",
        "strict",
        {
            "$defs": {
                "Step": {
                    "properties": {
                        "explanation": {"title": "Explanation", "type": "string"},
                        "output": {"title": "Output", "type": "string"},
                    },
                    "required": ["explanation", "output"],
                    "title": "Step",
                    "type": "object",
                    "additionalProperties": False,
                }
            },
            "properties": {
                "steps": {"items": {"$ref": "#/$defs/Step"}, "title": "Steps", "type": "array"},
                "final_answer": {"title": "Final Answer", "type": "string"},
            },
            "required": ["steps", "final_answer"],
            "title": "MathReasoning",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "UserProfile",
        "strict",
        {
            "$defs": {
                "Address": {
                    "properties": {
                        "street": {"title": "Street", "type": "string"},
                        "city": {"title": "City", "type": "string"},
                        "postal_code": {"title": "Postal Code", "type": "string"},
                        "country": {
                            "description": "ISO 3166-1 alpha-2 code",
                            "title": "Country",
                            "type": "string",
                        },
                    },
                    "required": ["street", "city", "postal_code", "country"],
                    "title": "Address",
                    "type": "object",
                    "additionalProperties": False,
                },
                "Role": {"enum": ["admin", "editor", "viewer"], "title": "Role", "type": "string"},
            },
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "age": {"maximum": 150, "minimum": 0, "title": "Age", "type": "integer"},
                "email": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Email"},
                "role": {"$ref": "#/$defs/Role"},
                "address": {"$ref": "#/$defs/Address"},
                "previous_addresses": {
                    "default": [],
                    "items": {"$ref": "#/$defs/Address"},
                    "title": "Previous Addresses",
                    "type": "array",
                },
            },
            "required": ["name", "age", "email", "role", "address", "previous_addresses"],
            "title": "UserProfile",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "Sentiment",
        "strict",
        {
            "properties": {
                "label": {"enum": ["positive", "negative", "neutral"], "title": "Label", "type": "string"},
                "confidence": {"maximum": 1, "minimum": 0, "title": "Confidence", "type": "number"},
                "keywords": {
                    "items": {"type": "string"},
                    "maxItems": 5,
                    "title": "Keywords",
                    "type": "array",
                },
            },
            "required": ["label", "confidence", "keywords"],
            "title": "Sentiment",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "Entities",
        "strict",
        {
            "$defs": {
                "Entity": {
                    "properties": {
                        "text": {"title": "Text", "type": "string"},
                        "type": {"$ref": "#/$defs/EntityType"},
                        "start": {"title": "Start", "type": "integer"},
                        "end": {"title": "End", "type": "integer"},
                    },
                    "required": ["text", "type", "start", "end"],
                    "title": "Entity",
                    "type": "object",
                    "additionalProperties": False,
                },
                "EntityType": {
                    "enum": ["PERSON", "ORG", "LOCATION", "DATE", "OTHER"],
                    "title": "EntityType",
                    "type": "string",
                },
            },
            "properties": {
                "entities": {"items": {"$ref": "#/$defs/Entity"}, "title": "Entities", "type": "array"}
            },
            "required": ["entities"],
            "title": "Entities",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "Recipe",
        "strict",
        {
            "$defs": {
                "Ingredient": {
                    "properties": {
                        "name": {"title": "Name", "type": "string"},
                        "amount": {"title": "Amount", "type": "number"},
                        "unit": {"anyOf": [{"$ref": "#/$defs/Unit"}, {"type": "null"}]},
                    },
                    "required": ["name", "amount", "unit"],
                    "title": "Ingredient",
                    "type": "object",
                    "additionalProperties": False,
                },
                "Unit": {
                    "enum": ["g", "kg", "ml", "l", "cup", "tbsp", "tsp", "piece"],
                    "title": "Unit",
                    "type": "string",
                },
            },
            "properties": {
                "title": {"title": "Title", "type": "string"},
                "servings": {"minimum": 1, "title": "Servings", "type": "integer"},
                "prep_minutes": {"title": "Prep Minutes", "type": "integer"},
                "ingredients": {
                    "items": {"$ref": "#/$defs/Ingredient"},
                    "title": "Ingredients",
                    "type": "array",
                },
                "steps": {"items": {"type": "string"}, "title": "Steps", "type": "array"},
                "vegetarian": {"title": "Vegetarian", "type": "boolean"},
            },
            "required": ["title", "servings", "prep_minutes", "ingredients", "steps", "vegetarian"],
            "title": "Recipe",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "Invoice",
        "strict",
        {
            "$defs": {
                "Address": {
                    "properties": {
                        "street": {"title": "Street", "type": "string"},
                        "city": {"title": "City", "type": "string"},
                        "postal_code": {"title": "Postal Code", "type": "string"},
                        "country": {
                            "description": "ISO 3166-1 alpha-2 code",
                            "title": "Country",
                            "type": "string",
                        },
                    },
                    "required": ["street", "city", "postal_code", "country"],
                    "title": "Address",
                    "type": "object",
                    "additionalProperties": False,
                },
                "Customer": {
                    "properties": {
                        "id": {"title": "Id", "type": "string"},
                        "name": {"title": "Name", "type": "string"},
                        "billing_address": {"$ref": "#/$defs/Address"},
                    },
                    "required": ["id", "name", "billing_address"],
                    "title": "Customer",
                    "type": "object",
                    "additionalProperties": False,
                },
                "LineItem": {
                    "properties": {
                        "description": {"title": "Description", "type": "string"},
                        "quantity": {"minimum": 1, "title": "Quantity", "type": "integer"},
                        "unit_price": {"title": "Unit Price", "type": "number"},
                    },
                    "required": ["description", "quantity", "unit_price"],
                    "title": "LineItem",
                    "type": "object",
                    "additionalProperties": False,
                },
            },
            "properties": {
                "invoice_number": {"title": "Invoice Number", "type": "string"},
                "issued_at": {"format": "date-time", "title": "Issued At", "type": "string"},
                "currency": {"enum": ["USD", "EUR", "GBP", "JPY"], "title": "Currency", "type": "string"},
                "customer": {"$ref": "#/$defs/Customer"},
                "line_items": {
                    "items": {"$ref": "#/$defs/LineItem"},
                    "minItems": 1,
                    "title": "Line Items",
                    "type": "array",
                },
                "notes": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Notes"},
            },
            "required": ["invoice_number", "issued_at", "currency", "customer", "line_items", "notes"],
            "title": "Invoice",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "IssueTriage",
        "strict",
        {
            "$defs": {
                "Priority": {
                    "enum": ["low", "medium", "high", "critical"],
                    "title": "Priority",
                    "type": "string",
                }
            },
            "properties": {
                "title": {"title": "Title", "type": "string"},
                "summary": {"title": "Summary", "type": "string"},
                "labels": {
                    "items": {
                        "enum": ["bug", "feature", "docs", "question", "performance"],
                        "type": "string",
                    },
                    "title": "Labels",
                    "type": "array",
                },
                "priority": {"$ref": "#/$defs/Priority"},
                "assignee": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Assignee"},
                "duplicate_of": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Duplicate Of"},
            },
            "required": ["title", "summary", "labels", "priority", "assignee", "duplicate_of"],
            "title": "IssueTriage",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "Comment",
        "strict",
        {
            "$defs": {
                "Comment": {
                    "properties": {
                        "author": {"title": "Author", "type": "string"},
                        "text": {"title": "Text", "type": "string"},
                        "replies": {
                            "items": {"$ref": "#/$defs/Comment"},
                            "title": "Replies",
                            "type": "array",
                        },
                    },
                    "required": ["author", "text", "replies"],
                    "title": "Comment",
                    "type": "object",
                    "additionalProperties": False,
                }
            },
            "properties": {
                "author": {"title": "Author", "type": "string"},
                "text": {"title": "Text", "type": "string"},
                "replies": {"items": {"$ref": "#/$defs/Comment"}, "title": "Replies", "type": "array"},
            },
            "required": ["author", "text", "replies"],
            "title": "Comment",
            "type": "object",
            "additionalProperties": False,
        },
    ),
    BenchSchema(
        "SearchQuery",
        "loose",
        {
            "$defs": {
                "Filter": {
                    "properties": {
                        "field": {"title": "Field", "type": "string"},
                        "op": {"enum": ["eq", "ne", "lt", "gt", "contains"], "title": "Op", "type": "string"},
                        "value": {
                            "anyOf": [
                                {"type": "string"},
                                {"type": "integer"},
                                {"type": "number"},
                                {"type": "boolean"},
                            ],
                            "title": "Value",
                        },
                    },
                    "required": ["field", "op", "value"],
                    "title": "Filter",
                    "type": "object",
                }
            },
            "properties": {
                "query": {"title": "Query", "type": "string"},
                "filters": {"items": {"$ref": "#/$defs/Filter"}, "title": "Filters", "type": "array"},
                "sort_by": {
                    "anyOf": [{"type": "string"}, {"type": "null"}],
                    "default": None,
                    "title": "Sort By",
                },
                "limit": {"default": 10, "maximum": 100, "minimum": 1, "title": "Limit", "type": "integer"},
            },
            "required": ["query", "filters"],
            "title": "SearchQuery",
            "type": "object",
        },
    ),
    BenchSchema(
        "Weather",
        "loose",
        {
            "$defs": {
                "DayForecast": {
                    "properties": {
                        "date": {"format": "date", "title": "Date", "type": "string"},
                        "high_c": {"title": "High C", "type": "number"},
                        "low_c": {"title": "Low C", "type": "number"},
                        "conditions": {
                            "enum": ["sunny", "cloudy", "rain", "snow", "storm"],
                            "title": "Conditions",
                            "type": "string",
                        },
                    },
                    "required": ["date", "high_c", "low_c", "conditions"],
                    "title": "DayForecast",
                    "type": "object",
                }
            },
            "properties": {
                "location": {"title": "Location", "type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"], "title": "Unit", "type": "string"},
                "days": {"items": {"$ref": "#/$defs/DayForecast"}, "title": "Days", "type": "array"},
            },
            "required": ["location", "unit", "days"],
            "title": "Weather",
            "type": "object",
        },
    ),
    BenchSchema(
        "AgentStep",
        "loose",
        {
            "$defs": {
                "Action": {
                    "properties": {
                        "tool": {
                            "enum": ["search", "calculator", "finish"],
                            "title": "Tool",
                            "type": "string",
                        },
                        "arguments": {
                            "additionalProperties": {"type": "string"},
                            "title": "Arguments",
                            "type": "object",
                        },
                    },
                    "required": ["tool", "arguments"],
                    "title": "Action",
                    "type": "object",
                }
            },
            "properties": {
                "thought": {"title": "Thought", "type": "string"},
                "action": {"anyOf": [{"$ref": "#/$defs/Action"}, {"type": "null"}]},
                "final_answer": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Final Answer"},
            },
            "required": ["thought", "action", "final_answer"],
            "title": "AgentStep",
            "type": "object",
        },
    ),
)


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
