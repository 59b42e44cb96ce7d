"""OpenAI's Responses API wire objects (`/v1/responses`), one Struct each.

Like `llmd/protocol.py`: no conversion logic here. The request forbids unknown fields, so a field
llmd does not implement is a 400 naming it. Input items and tools are decoded one by one by the
API layer (`api/responses/inputs.py`): an item's or tool's `type` picks its Struct there, so an
unsupported kind is refused by name rather than as a failed union. Input items tolerate fields
they do not declare, since the SDKs echo a response's output items back with more than the model
needs to read them (`status`, `logprobs`, `phase`, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from llmd.protocol import MAX_TOOLS, ToolName


class TextFormatText(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    """`text.format: {"type": "text"}`: free text (the default)."""


class TextFormatJsonObject(msgspec.Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    """`text.format: {"type": "json_object"}`: any JSON object."""


class TextFormatJsonSchema(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    """`text.format: {"type": "json_schema", ...}`: JSON that follows `schema`."""

    name: str
    schema: dict[str, Any] | None = None  # None: any JSON object
    description: str | None = None
    strict: bool | None = None


TextFormat = TextFormatText | TextFormatJsonObject | TextFormatJsonSchema


class TextOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The request's `text`: the reply's format, and a verbosity hint."""

    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The request's `reasoning`: `effort` becomes a template variable, as chat's `reasoning_effort`."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesStreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    """`stream_options` of a streamed response."""

    include_obfuscation: bool | None = None


class FunctionToolParam(msgspec.Struct, tag="function", tag_field="type", forbid_unknown_fields=True):
    """A function tool in the Responses shape (flat: no `function` wrapper)."""

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(msgspec.Struct, tag="function", tag_field="type", forbid_unknown_fields=True):
    """`tool_choice: {"type": "function", "name": ...}`: exactly one call of that function."""

    name: str


ResponsesToolChoice = Literal["none", "auto", "required"] | FunctionToolChoice


class ResponsesRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /v1/responses`. `input` items and `tools` are read one by one (see the module doc);
    `tool_choice` objects other than a function are refused by their `type` there too."""

    model: str
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]
    background: bool | None = None
    context_management: Any | None = None
    conversation: Any | None = None
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: Any | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    reasoning: ReasoningOptions | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    text: TextOptions | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: Annotated[list[dict[str, Any]], Meta(max_length=MAX_TOOLS)] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    truncation: str | None = None
    user: str | None = None
    # llmd's extensions, as on chat (vLLM's names)
    seed: Annotated[int, Meta(ge=0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None
    ignore_eos: bool | None = None


class ItemContent(msgspec.Struct):
    """One content part of an input item: `input_text`, an echoed `output_text` or `refusal`, or a
    kind llmd refuses by its `type` (images, files, audio)."""

    type: str
    text: str | None = None
    refusal: str | None = None


class MessageItem(msgspec.Struct):
    """A message: the user's, a system or developer instruction, or an earlier assistant reply."""

    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ItemContent]
    type: Literal["message"] = "message"
    id: str | None = None


class FunctionCallItem(msgspec.Struct):
    """An earlier reply's call of a function tool."""

    call_id: str
    name: str
    arguments: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None


class FunctionCallOutputItem(msgspec.Struct):
    """A function's result, answering the call `call_id`."""

    call_id: str
    output: str | list[ItemContent]
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None


class ReasoningItem(msgspec.Struct):
    """An earlier reply's thinking: its summary parts, or its raw `reasoning_text` content."""

    summary: list[ItemContent] = msgspec.field(default_factory=list)
    content: list[ItemContent] | None = None
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    encrypted_content: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
