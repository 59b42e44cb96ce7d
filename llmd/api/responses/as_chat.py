"""A response request as the chat request it runs as: the same engine path, the same grammar and
tool-call reading, a different wire shape. Errors the chat path raises name the chat's fields;
`responses_params` renames them to the Responses fields the client sent.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from llmd.errors import LlmdError
from llmd.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionDefinition,
    FunctionTool,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    ResponseFormat,
    TextFormat,
    ToolChoice,
    ToolChoiceFunction,
)
from llmd.responses_protocol import (
    FunctionToolChoice,
    FunctionToolParam,
    ResponsesRequest,
    ResponsesToolChoice,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)

# A chat field's name (a prefix of a param) → the Responses field the client sent.
RENAMED = [
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^max_completion_tokens$"), "max_output_tokens"),
    (re.compile(r"^reasoning_effort$"), "reasoning.effort"),
    (re.compile(r"^messages"), "input"),
]
QUOTED = re.compile(r"`([^`]+)`")


def chat_request(body: ResponsesRequest, tools: list[FunctionToolParam], choice: ResponsesToolChoice,
                 messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request `body` runs as, with its input already turned into `messages`."""
    return ChatCompletionRequest(
        messages=messages, model=body.model, max_completion_tokens=body.max_output_tokens,
        parallel_tool_calls=body.parallel_tool_calls,
        reasoning_effort=body.reasoning.effort if body.reasoning is not None else None,
        response_format=response_format(body), seed=body.seed, stream=body.stream,
        temperature=body.temperature, tool_choice=chat_tool_choice(choice),
        tools=[chat_tool(tool) for tool in tools] or None, top_p=body.top_p, top_k=body.top_k,
        min_p=body.min_p, repetition_penalty=body.repetition_penalty, min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
    )


def chat_tool(tool: FunctionToolParam) -> FunctionTool:
    """A Responses function tool in chat's shape."""
    return FunctionTool(FunctionDefinition(tool.name, tool.description, tool.parameters, tool.strict))


def chat_tool_choice(choice: ResponsesToolChoice) -> ToolChoice:
    """`tool_choice` in chat's shape: a named function gains its `function` wrapper."""
    if isinstance(choice, FunctionToolChoice):
        return NamedToolChoice(ToolChoiceFunction(choice.name))
    return choice


def response_format(body: ResponsesRequest) -> ResponseFormat | None:
    """`text.format` as chat's `response_format`."""
    format_ = body.text.format if body.text is not None else None
    if isinstance(format_, TextFormatJsonObject):
        return JsonObjectFormat()
    if isinstance(format_, TextFormatJsonSchema):
        schema = JsonSchemaFormat(format_.name, format_.description, format_.schema, format_.strict)
        return JsonSchemaResponseFormat(schema)
    return TextFormat() if format_ is not None else None


def renamed(param: str) -> str:
    """A chat param as the Responses field it came from (unchanged when it has no other name)."""
    for pattern, replacement in RENAMED:
        if pattern.search(param):
            return pattern.sub(replacement, param, count=1)
    return param


@contextlib.contextmanager
def responses_params() -> Iterator[None]:
    """Let errors raised inside name the Responses fields: their `param`, and the message's quoted
    field names."""
    try:
        yield
    except LlmdError as exc:
        if exc.param is not None:
            exc.param = renamed(exc.param)
        exc.message = QUOTED.sub(lambda match: f"`{renamed(match[1])}`", exc.message)
        exc.args = (exc.message,)
        raise
