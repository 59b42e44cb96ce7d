"""A `/v1/responses` body read and checked: what llmd serves of it, every refusal named at once.

Served: `input` (`api/responses/inputs.py`), `instructions`, `max_output_tokens`, `temperature`,
`top_p`, function `tools`, `tool_choice`, `parallel_tool_calls`, `text.format`, `reasoning.effort`,
`store`, `previous_response_id`, `stream`. Accepted because they cannot change a local answer:
`include` (nothing it names is produced here: no encrypted reasoning, no hosted tools),
`metadata` (stored and echoed), `user`, `safety_identifier`, `prompt_cache_key` and
`_retention`, `service_tier` `auto`/`default`, `truncation: "disabled"`, `text.verbosity`,
`reasoning.summary` (the thinking comes whole), `stream_options`. Refused, with a 400 naming the
field: hosted tools (`web_search`, `file_search`, `computer_use_preview`, `code_interpreter`,
`mcp`, ...), `background`, `conversation`, `prompt`, `context_management`, `max_tool_calls`,
`top_logprobs`, `include: ["message.output_text.logprobs"]`, `truncation: "auto"`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from llmd.api.chat import decoded, validation_error
from llmd.api.lenient import Refusal, refuse
from llmd.errors import InvalidRequest
from llmd.responses_protocol import (
    FunctionToolChoice,
    FunctionToolParam,
    ResponsesRequest,
    ResponsesToolChoice,
)
from llmd.validation import split_validation_error

_decoder = msgspec.json.Decoder(ResponsesRequest)
TOOL_CHOICES = ("none", "auto", "required")
SERVICE_TIERS = ("auto", "default")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def parse_request(raw: bytes) -> ResponsesRequest:
    """Decode the body; a malformed one is a 400 naming the field, refused fields are one 400."""
    body = decoded(_decoder, raw)
    refusals = unsupported(body)
    if refusals:
        raise refuse(refusals)
    return body


def unsupported(body: ResponsesRequest) -> list[Refusal]:
    """The fields of `body` whose values ask for something llmd does not do."""
    checks = [
        ("background", bool(body.background), "is not supported: llmd answers while the request is open"),
        ("conversation", body.conversation is not None,
         "is not supported: continue a conversation with `previous_response_id`"),
        ("prompt", body.prompt is not None, "is not supported: llmd has no stored prompt templates"),
        ("context_management", body.context_management is not None, "is not supported by llmd"),
        ("max_tool_calls", body.max_tool_calls is not None,
         "is not supported; `parallel_tool_calls: false` caps a reply at one call"),
        ("top_logprobs", bool(body.top_logprobs),
         "is not supported on `/v1/responses` (chat serves logprobs)"),
        ("include", LOGPROBS_INCLUDE in (body.include or ()),
         f"may not hold `{LOGPROBS_INCLUDE}`: logprobs are not served on `/v1/responses`"),
        ("truncation", body.truncation not in (None, "disabled"),
         'must be "disabled": llmd never drops input to fit; a long input is a 400'),
        ("service_tier", body.service_tier not in (None, *SERVICE_TIERS), "has one tier here: this machine"),
    ]
    return [Refusal(param, reason) for param, refused, reason in checks if refused]


def function_tools(tools: list[dict[str, Any]] | None) -> list[FunctionToolParam]:
    """The request's tools, each a function tool; any other kind is a 400 naming its `type`."""
    out = []
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type")
        if kind != "function":
            reason = f"`{kind}` is not supported: llmd serves function tools only (no hosted tools)"
            raise refuse([Refusal(f"tools[{i}].type", reason)])
        out.append(convert(tool, FunctionToolParam, f"tools[{i}]"))
    return out


def tool_choice(value: str | dict[str, Any] | None) -> ResponsesToolChoice:
    """`tool_choice` as served: `none`, `auto` (the default), `required`, or one named function."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise InvalidRequest(f"`tool_choice` must be one of {', '.join(TOOL_CHOICES)} or a function",
                                 param="tool_choice")
        return value  # type: ignore[return-value]  # one of the literals, checked above
    if value.get("type") != "function":
        raise refuse([Refusal("tool_choice.type", f"`{value.get('type')}` is not supported: llmd serves "
                              "function tools only")])
    return convert(value, FunctionToolChoice, "tool_choice")


def convert(value: dict[str, Any], struct: type[msgspec.Struct], param: str) -> Any:
    """`value` as `struct`; a bad field is a 400 whose param starts at `param`."""
    try:
        return msgspec.convert(value, struct)
    except msgspec.ValidationError as exc:
        path, text = split_validation_error(str(exc))
        raise validation_error(f"{text} - at `$.{param}{'.' + path if path else ''}`") from None
