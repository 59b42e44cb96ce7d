"""The schema set's data: name, how a client sent it, and the JSON schema (see llmd/bench/schemas.py).

Generated once from Pydantic models (pydantic 2.14; "strict" through openai-python's
`to_strict_json_schema`, "loose" as `model_json_schema()`) and kept as data.
"""

from __future__ import annotations

from typing import Any

JsonSchema = dict[str, Any]

MODELS: tuple[tuple[str, str, JsonSchema], ...] = (
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
    (
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
