"""OpenAI's response object (`/v1/responses`): output items, usage, the request's settings echoed.

One Struct per wire object, as `llmd/protocol.py`; no conversion logic here.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from llmd.responses_protocol import FunctionToolParam, ResponsesToolChoice, TextFormat


class OutputText(msgspec.Struct, kw_only=True):
    """A message's text part."""

    annotations: list[Any] = msgspec.field(default_factory=list)
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputMessage(msgspec.Struct, kw_only=True):
    """The reply's text, as one assistant message."""

    id: str
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"
    status: str
    type: Literal["message"] = "message"


class OutputFunctionCall(msgspec.Struct, kw_only=True):
    """One call of a function tool; `call_id` is what its `function_call_output` answers."""

    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: str
    status: str


class SummaryText(msgspec.Struct, kw_only=True):
    """A reasoning item's text: a thinking model's whole thinking (llmd does not shorten it)."""

    text: str
    type: Literal["summary_text"] = "summary_text"


class OutputReasoning(msgspec.Struct, kw_only=True):
    """A thinking model's reasoning before its answer."""

    id: str
    summary: list[SummaryText]
    type: Literal["reasoning"] = "reasoning"
    status: str


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning


class InputTokensDetails(msgspec.Struct):
    """Prompt tokens the prefix cache held already."""

    cached_tokens: int


class OutputTokensDetails(msgspec.Struct):
    """Output tokens spent thinking."""

    reasoning_tokens: int


class ResponseUsage(msgspec.Struct):
    """A response's token accounting."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(msgspec.Struct):
    """Why a response failed."""

    code: str
    message: str


class IncompleteDetails(msgspec.Struct):
    """Why a response stopped short: `max_output_tokens`."""

    reason: str


class ReasoningEcho(msgspec.Struct):
    """The request's `reasoning`, echoed."""

    effort: str | None = None
    summary: str | None = None


class TextEcho(msgspec.Struct):
    """The request's `text`, echoed."""

    format: TextFormat
    verbosity: str | None = None


class Response(msgspec.Struct, kw_only=True):
    """A response object: the request's settings echoed, its output items, its usage."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None = None
    metadata: dict[str, str]
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningEcho
    service_tier: str = "default"
    store: bool
    temperature: float
    text: TextEcho
    tool_choice: ResponsesToolChoice
    tools: list[FunctionToolParam]
    top_p: float
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None


class DeletedResponse(msgspec.Struct):
    """`DELETE /v1/responses/{id}`'s answer."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class InputItemList(msgspec.Struct):
    """`GET /v1/responses/{id}/input_items`: one page of a stored response's input items."""

    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: Literal["list"] = "list"
