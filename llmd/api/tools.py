"""A chat request's tools: what the template renders, which calls the reply may make, and history.

`tool_choice` as OpenAI defines it: `"none"` (the tools are not offered: the reply is text),
`"auto"` (text or calls; the default when `tools` are given), `"required"` (at least one call),
or a named function (exactly one call of it). `parallel_tool_calls: false` caps a reply at one
call. The calls' grammar is `api/tool_grammar.py`'s; how the reply is read back, `api/reply.py`'s.

Assistant turns with `tool_calls` reach the template with their arguments as objects (templates
write them with `tojson`), ids kept; `tool` messages keep their `tool_call_id`. A model whose
template renders no tools gets them described in a system message, its calls and results
written as text in the turns (the generic format).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmd.api.tool_grammar import NO_PARAMETERS, CallPlan, ToolSpec
from llmd.engine.tool_format import ChatFormat, ToolSyntax
from llmd.errors import InvalidRequest
from llmd.protocol import ChatCompletionRequest, ChatMessage, FunctionTool, NamedToolChoice

# Mistral's templates insist on call ids of nine letters and digits.
MISTRAL_ID_LENGTH = 9


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The tools a reply may call and how: `plan` for the grammar, `named` when one is forced."""

    tools: Sequence[FunctionTool]
    plan: CallPlan
    named: bool

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        """Each tool's parameter schema by name (the parser types Qwen3-Coder's values with them)."""
        return {spec.name: spec.parameters for spec in self.plan.tools}


def tool_request(body: ChatCompletionRequest) -> ToolRequest | None:
    """The request's tools as the reply may call them; None when it calls none (no tools, `"none"`).

    Raises `InvalidRequest` naming `tool_choice` (a call asked of no tools, an unknown name) or
    `tools` (a name given twice).
    """
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest("`tool_choice` asks for a tool call, but the request has no `tools`",
                                 param="tool_choice")
        return None
    check_unique_names(body.tools)
    if choice == "none":
        return None
    specs = [ToolSpec(tool.function.name, tool.function.parameters or NO_PARAMETERS) for tool in body.tools]
    parallel = body.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        named = [spec for spec in specs if spec.name == choice.function.name]
        if not named:
            raise InvalidRequest(f"`tool_choice` names the function `{choice.function.name}`, which is "
                                 "not in `tools`", param="tool_choice.function.name")
        return ToolRequest(body.tools, CallPlan(named, required=True, parallel=False), named=True)
    return ToolRequest(body.tools, CallPlan(specs, required=choice == "required", parallel=parallel),
                       named=False)


def check_unique_names(tools: Sequence[FunctionTool]) -> None:
    """Refuse two tools of one name: a call could not say which it meant."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.function.name in seen:
            raise InvalidRequest(f"the function name `{tool.function.name}` is given twice",
                                 param=f"tools[{i}].function.name")
        seen.add(tool.function.name)


def template_tools(tools: Sequence[FunctionTool]) -> list[dict[str, Any]]:
    """`tools` as chat templates read them: OpenAI's objects, a description never null."""
    return [{"type": "function", "function": {
        "name": tool.function.name, "description": tool.function.description or "",
        "parameters": tool.function.parameters or {"type": "object", "properties": {}}}} for tool in tools]


def call_id(chat: ChatFormat) -> str:
    """A new call's id: `call_` and hex (OpenAI's look), or what Mistral's templates accept."""
    if chat.tools.syntax is ToolSyntax.MISTRAL:
        return uuid.uuid4().hex[:MISTRAL_ID_LENGTH]
    return f"call_{uuid.uuid4().hex[:24]}"


def history_calls(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    """An assistant turn's tool calls for the template, each call's arguments parsed to an object."""
    calls = []
    for j, call in enumerate(message.tool_calls or ()):
        param = f"messages[{index}].tool_calls[{j}].function.arguments"
        try:
            arguments = json.loads(call.function.arguments) if call.function.arguments.strip() else {}
        except json.JSONDecodeError:
            raise InvalidRequest(f"`{param}` is not valid JSON", param=param) from None
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": arguments}})
    return calls


def generic_call_text(calls: list[dict[str, Any]]) -> str:
    """An assistant turn's calls as the generic format writes them, for a template that cannot."""
    return "\n".join("<tool_call>\n" + json.dumps({"name": call["function"]["name"],
                                                  "arguments": call["function"]["arguments"]})
                     + "\n</tool_call>" for call in calls)


def generic_system_text(tools: Sequence[FunctionTool]) -> str:
    """The system instruction that teaches the generic format (the grammar enforces it)."""
    listed = "\n".join(json.dumps(tool) for tool in template_tools(tools))
    return ("You can call the functions described here, one JSON object each:\n<tools>\n" + listed
            + "\n</tools>\nTo call one, write <tool_call>, a new line, the JSON object "
            '{"name": <function name>, "arguments": <arguments object>}, a new line and </tool_call>; '
            "one such block per call. A function's result comes back in <tool_response> tags.")


def with_generic_tools(messages: list[dict[str, Any]], tools: Sequence[FunctionTool] | None
                       ) -> list[dict[str, Any]]:
    """Messages for a template that renders no tools: the tools in the system message, calls and
    results as text (results in a user turn: every template knows that role)."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            text = "\n".join(filter(None, [message.get("content"), generic_call_text(message["tool_calls"])]))
            message = {k: v for k, v in message.items() if k != "tool_calls"} | {"content": text}
        elif message["role"] == "tool":
            message = {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
        out.append(message)
    if not tools:
        return out
    instruction = generic_system_text(tools)
    if out and out[0]["role"] in ("system", "developer"):
        return [out[0] | {"content": f"{out[0]['content']}\n\n{instruction}"}, *out[1:]]
    return [{"role": "system", "content": instruction}, *out]
