"""A constrained request's grammar as vLLM takes it: Lark text for its `guidance` backend. Pure.

llmd validates every grammar itself (`engine/grammar.py`: llguidance over the model's vocabulary,
the same code for both engines) and keeps it in llguidance's serialized form: Lark text for a
Lark request (tool calls, thinking first), or `{"grammars": [{"json_schema": ...}]}` for a JSON
schema, llmd's JSON layout in its `x-guidance` options. vLLM's structured outputs take a grammar
as Lark text and hand it to llguidance (`StructuredOutputsParams(grammar=...)`, with the engine's
`structured_outputs_config` backend `guidance`). A schema travels as Lark's `%json` rule over the
same schema and options, so vLLM builds the matcher llmd would.
"""

from __future__ import annotations

import json

from llmd.engine.types import Constraint


def lark_grammar(grammar: str) -> str:
    """Lark text of a grammar llmd validated (llguidance's serialized form); raises `ValueError`
    for one with no single Lark or JSON-schema part (llmd makes none such)."""
    if not grammar.lstrip().startswith("{"):
        return grammar  # Lark already
    parts = json.loads(grammar).get("grammars", [])
    if len(parts) != 1:
        raise ValueError(f"a grammar of {len(parts)} parts has no single Lark form")
    (part,) = parts
    if part.get("lark_grammar"):
        return str(part["lark_grammar"])
    if part.get("json_schema") is not None:
        return "start: %json " + json.dumps(part["json_schema"])
    raise ValueError(f"a grammar part of {sorted(part)} has no Lark form")


def structured_outputs(constraint: Constraint | None) -> dict[str, str] | None:
    """Keywords of vLLM's `StructuredOutputsParams` for a request's constraint, or None without one."""
    return None if constraint is None else {"grammar": lark_grammar(constraint.grammar)}
