"""A response's input items: read one by one, turned into the chat the template renders, and
written down as they are stored and listed.

`input` is a string (one user message) or a list of items: messages (`user`, `system`,
`developer` with text or `input_text` parts; `assistant` with `output_text` or `refusal` parts),
`function_call` (an earlier reply's call), `function_call_output` (its result) and `reasoning`
(an earlier reply's thinking); an `item_reference` has been replaced by the stored item it names
before these are read (`api/responses/create.py`). Consecutive assistant-side items (thinking,
text, calls) are one assistant turn, as the chat template expects it: its text, its `tool_calls`,
its `reasoning_content`. Any other item or part kind is a 400 naming its `type`.

The stored form of an item is OpenAI's listed form (an id on every item, text as parts), and it
reads back as the same chat: continuing from a stored response renders the same tokens as sending
its history again, so the prefix cache serves it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llmd.api.lenient import Refusal, refuse
from llmd.api.responses.request import convert
from llmd.errors import InvalidRequest
from llmd.protocol import ChatMessage, FunctionCallIn, ToolCallIn
from llmd.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    ItemContent,
    MessageItem,
    ReasoningItem,
)

ITEM_KINDS: dict[str, type[msgspec.Struct]] = {
    "message": MessageItem, "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem,
}
# The part kinds each item's text may come in (echoed output included).
USER_PARTS = ("input_text",)
ASSISTANT_PARTS = ("output_text", "refusal")
REASONING_PARTS = ("summary_text", "reasoning_text")
ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def parse_items(raw: str | list[dict[str, Any]], path: str = "input") -> list[InputItem]:
    """The request's `input` as typed items; `path` names them in errors."""
    if isinstance(raw, str):
        return [MessageItem(role="user", content=raw)]
    return [parse_item(item, f"{path}[{i}]") for i, item in enumerate(raw)]


def parse_item(item: dict[str, Any], param: str) -> InputItem:
    """One input item by its `type` (a message when it has none, as the SDKs send a plain one)."""
    kind = item.get("type", "message")
    struct = ITEM_KINDS.get(kind) if isinstance(kind, str) else None
    if struct is None:
        raise refuse([Refusal(f"{param}.type", f"`{kind}` is not supported: llmd reads messages, "
                              "function calls, their outputs and reasoning")])
    parsed: InputItem = convert(item, struct, param)
    check_parts(parsed, param)
    if isinstance(parsed, FunctionCallItem):
        check_arguments(parsed.arguments, f"{param}.arguments")
    return parsed


def check_parts(item: InputItem, param: str) -> None:
    """Refuse a part llmd cannot read (images, files, audio), or one of the wrong kind for its item."""
    groups: list[tuple[str, str | list[ItemContent] | None, tuple[str, ...]]]
    if isinstance(item, MessageItem):
        allowed = ASSISTANT_PARTS if item.role == "assistant" else USER_PARTS
        groups = [("content", item.content, allowed)]
    elif isinstance(item, FunctionCallOutputItem):
        groups = [("output", item.output, USER_PARTS)]
    elif isinstance(item, ReasoningItem):
        groups = [("summary", item.summary, REASONING_PARTS), ("content", item.content, REASONING_PARTS)]
    else:
        return
    for name, parts, kinds in groups:
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            check_part(part, f"{param}.{name}[{j}]", kinds)


def check_part(part: ItemContent, param: str, kinds: tuple[str, ...]) -> None:
    """One part: of an allowed kind, with its text."""
    if part.type not in kinds:
        raise refuse([Refusal(f"{param}.type", f"`{part.type}` is not supported here; llmd reads "
                              + " or ".join(f"`{kind}`" for kind in kinds) + " parts")])
    if (part.refusal if part.type == "refusal" else part.text) is None:
        field_name = "refusal" if part.type == "refusal" else "text"
        raise InvalidRequest(f"`{param}.{field_name}` must be a string", param=f"{param}.{field_name}")


def check_arguments(arguments: str, param: str) -> None:
    """A call's `arguments` must be a JSON object (the template writes it as one)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        raise InvalidRequest(f"`{param}` is not valid JSON", param=param) from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"`{param}` must be a JSON object", param=param)


def check_call_outputs(history: list[InputItem], items: list[InputItem]) -> None:
    """Every `function_call_output` must answer a call made before it (in the stored history or the
    input), as OpenAI requires; else a 400 naming its `call_id`."""
    called = {item.call_id for item in history if isinstance(item, FunctionCallItem)}
    for i, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            called.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id not in called:
            raise InvalidRequest(f"No tool call found for function call output with call_id {item.call_id}.",
                                 param=f"input[{i}].call_id")


def parts_text(parts: str | list[ItemContent] | None) -> str:
    """An item's text: a string as it is, parts joined (a refusal part counts as its text)."""
    if parts is None or isinstance(parts, str):
        return parts or ""
    return "".join((part.refusal if part.type == "refusal" else part.text) or "" for part in parts)


@dataclass(slots=True)
class AssistantTurn:
    """Consecutive assistant-side items, gathered into one chat turn."""

    text: list[str] = field(default_factory=list)
    calls: list[ToolCallIn] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)

    def message(self) -> ChatMessage:
        """The turn as a chat message."""
        return ChatMessage(role="assistant", content="".join(self.text), tool_calls=self.calls or None,
                           reasoning_content="\n".join(self.thinking) if self.thinking else None)


def chat_messages(instructions: str | None, items: list[InputItem]) -> list[ChatMessage]:
    """The chat the template renders: `instructions` first, as a system message, then the items."""
    out = [ChatMessage(role="system", content=instructions)] if instructions else []
    turn: AssistantTurn | None = None
    for item in items:
        if is_assistant_side(item):
            turn = turn or AssistantTurn()
            add_to_turn(turn, item)
            continue
        if turn is not None:
            out.append(turn.message())
            turn = None
        out.append(chat_message(item))
    if turn is not None:
        out.append(turn.message())
    return out


def is_assistant_side(item: InputItem) -> bool:
    """Whether the item is part of an assistant's reply (its text, calls or thinking)."""
    return isinstance(item, (FunctionCallItem, ReasoningItem)) or (
        isinstance(item, MessageItem) and item.role == "assistant")


def add_to_turn(turn: AssistantTurn, item: InputItem) -> None:
    """Add one assistant-side item's part to its turn."""
    if isinstance(item, FunctionCallItem):
        turn.calls.append(ToolCallIn(item.call_id, FunctionCallIn(item.name, item.arguments)))
    elif isinstance(item, ReasoningItem):
        turn.thinking.append(parts_text(item.content) or parts_text(item.summary))
    elif isinstance(item, MessageItem):
        turn.text.append(parts_text(item.content))


def chat_message(item: InputItem) -> ChatMessage:
    """A user, system or developer message, or a function's result as a `tool` message."""
    if isinstance(item, FunctionCallOutputItem):
        return ChatMessage(role="tool", content=parts_text(item.output), tool_call_id=item.call_id)
    assert isinstance(item, MessageItem)
    return ChatMessage(role=item.role, content=parts_text(item.content))


def stored_item(item: InputItem) -> dict[str, Any]:
    """The item as it is stored and listed: OpenAI's listed form, with an id."""
    item_id = item.id or f"{ID_PREFIXES[item.type]}_{uuid.uuid4().hex[:24]}"
    if isinstance(item, MessageItem):
        kind = "output_text" if item.role == "assistant" else "input_text"
        parts = item.content if isinstance(item.content, list) else [ItemContent(kind, item.content)]
        content = [part_dict(part) for part in parts]
        return {"id": item_id, "type": "message", "role": item.role, "content": content,
                "status": "completed"}
    if isinstance(item, FunctionCallItem):
        return {"id": item_id, "type": "function_call", "call_id": item.call_id, "name": item.name,
                "arguments": item.arguments, "status": "completed"}
    if isinstance(item, FunctionCallOutputItem):
        return {"id": item_id, "type": "function_call_output", "call_id": item.call_id,
                "output": parts_text(item.output), "status": "completed"}
    assert isinstance(item, ReasoningItem)
    reasoning = {"id": item_id, "type": "reasoning", "summary": [part_dict(p) for p in item.summary]}
    return reasoning | ({"content": [part_dict(p) for p in item.content]} if item.content else {})


def part_dict(part: ItemContent) -> dict[str, Any]:
    """One part as stored: its kind and its text (an output text with its empty annotations)."""
    if part.type == "refusal":
        return {"type": "refusal", "refusal": part.refusal}
    annotations: dict[str, Any] = {"annotations": []} if part.type == "output_text" else {}
    return {"type": part.type, "text": part.text} | annotations
