"""OpenAI wire objects, one Struct each, fields in the order of the OpenAI API reference.

No conversion logic lives here: the API layer turns these into engine parameters.
Request Structs forbid unknown fields, so a field llmd does not implement is refused
with a 400 naming it instead of being silently ignored. Some declared fields are accepted
only with values that cannot change a local answer (`modalities: ["text"]`, ...) or
are ignored outright (`store`, `metadata`, ...): `llmd/api/lenient.py` is that allow-list.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
# Choices per chat request (and per completions prompt): each is a running slot of the engine.
MAX_CHOICES = 8
Choices = Annotated[int, Meta(ge=1, le=MAX_CHOICES)]
# `logit_bias` maps token-id strings to -100..100; the handler checks keys and values (api/logit_bias.py).
LogitBias = dict[str, float]


class ContentPart(msgspec.Struct, forbid_unknown_fields=True):
    """One part of a multi-part message content; only `text` parts are served."""

    type: str
    text: str | None = None
    cache_control: dict[str, Any] | None = None  # a prompt-caching hint (Anthropic style): ignored


class FunctionCallIn(msgspec.Struct):
    """The function of an assistant turn's tool call: its name and arguments as a JSON string."""

    name: str
    arguments: str


class ToolCallIn(msgspec.Struct):
    """A tool call of an assistant turn sent back in the history. Unknown fields are ignored, not
    refused: the SDKs' stream helpers echo what they accumulated (`index`, ...)."""

    id: str
    function: FunctionCallIn
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True):
    """A message in `messages` of a chat completion request.

    The fields after `name` are an assistant turn's, as the SDKs echo a reply back; a `tool`
    message answers the call `tool_call_id`.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    annotations: list[Any] | None = None
    reasoning_content: str | None = None  # vLLM's and DeepSeek's name
    reasoning: str | None = None  # OpenRouter's and newer vLLM's name
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    """`stream_options` of a streaming request."""

    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    """`response_format.json_schema`: the schema the reply must follow (`strict` or not, it is enforced)."""

    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None  # None: any JSON object
    strict: bool | None = None


class TextFormat(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    """`response_format: {"type": "text"}`: plain text, the default."""


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    """`response_format: {"type": "json_object"}`: a JSON object, any shape."""


class JsonSchemaResponseFormat(msgspec.Struct, tag="json_schema", tag_field="type",
                               forbid_unknown_fields=True):
    """`response_format: {"type": "json_schema", "json_schema": {...}}`: JSON following a schema."""

    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat
# OpenAI's limit on tools per request; a tool name is letters, digits, `_` and `-`, 1 to 64 of them.
MAX_TOOLS = 128
ToolName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class FunctionDefinition(msgspec.Struct, forbid_unknown_fields=True):
    """A function tool: its name, description and parameters' JSON schema (none: no arguments).

    `strict` or not, the arguments follow the schema: llmd always enforces it.
    """

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(msgspec.Struct, tag="function", tag_field="type", forbid_unknown_fields=True):
    """An entry of `tools`: only function tools exist in chat completions."""

    function: FunctionDefinition


class ToolChoiceFunction(msgspec.Struct, forbid_unknown_fields=True):
    """The function a named `tool_choice` forces."""

    name: str


class NamedToolChoice(msgspec.Struct, tag="function", tag_field="type", forbid_unknown_fields=True):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: call this tool."""

    function: ToolChoiceFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatCompletionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of `POST /v1/chat/completions`: the implemented subset, the allow-listed fields,
    and the sampling and template extensions local servers (vLLM, llama.cpp) share."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    model: str
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    logprobs: bool | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    metadata: dict[str, str] | None = None
    modalities: list[str] | None = None  # only "text"
    n: Choices | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: Penalty | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    reasoning_effort: str | None = None  # a template variable
    response_format: ResponseFormat | None = None
    safety_identifier: str | None = None
    seed: Annotated[int, Meta(ge=0)] | None = None  # below 2**64: SamplingParams checks
    service_tier: str | None = None
    stop: str | Annotated[list[str], Meta(max_length=16)] | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    tool_choice: ToolChoice | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None  # needs logprobs true, unless 0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    user: str | None = None
    verbosity: str | None = None
    # Extensions shared with vLLM and llama.cpp. top_k: -1 and 0 both mean "off".
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=64)] | None = None
    ignore_eos: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None  # true, unless `continue_final_message`
    continue_final_message: bool | None = None


class CompletionTokensDetails(msgspec.Struct):
    """How the completion's tokens divide: those a reasoning model spent thinking."""

    reasoning_tokens: int


class Usage(msgspec.Struct):
    """Token accounting of one completion; the details only for a reasoning model."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | msgspec.UnsetType = msgspec.UNSET


class FunctionCall(msgspec.Struct):
    """The function a reply calls: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    """A tool call of a non-streamed reply."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(msgspec.Struct):
    """The message of a non-streamed choice: `content` null when the reply is only tool calls;
    `tool_calls` and `reasoning_content` present only when there are some."""

    role: Literal["assistant"]
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET


class TopLogprob(msgspec.Struct):
    """One of the likeliest tokens at a position: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    """A chat choice's token with its logprob and the position's likeliest tokens
    (OpenAI's `ChatCompletionTokenLogprob`)."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    """`logprobs` of a chat choice (or of a chunk's choice: the tokens of its delta)."""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class Choice(msgspec.Struct):
    """One choice of a `chat.completion`."""

    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class ChatCompletion(msgspec.Struct):
    """A non-streamed chat completion."""

    id: str
    choices: list[Choice]
    created: int
    model: str
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionDelta(msgspec.Struct, omit_defaults=True):
    """A piece of a streamed call's function: the name once (with `arguments: ""`), then arguments."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    """A piece of a streamed tool call: `index` always; `id` and `type` on the call's first delta."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class Delta(msgspec.Struct, omit_defaults=True):
    """The incremental message of one chunk: role first, then content, thinking or tool-call pieces
    (one kind per delta)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct):
    """One choice of a `chat.completion.chunk`."""

    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct):
    """One streamed event of a chat completion."""

    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | None = None


class Model(msgspec.Struct, kw_only=True):
    """An entry of `GET /v1/models` and the body of `GET /v1/models/{id}`.

    OpenAI's four fields, then the context window in the names clients look for: vLLM's
    `max_model_len` (Continue's vLLM provider reads it) and `context_length` (llama.vscode and
    others). Both are the context the engine enforces per request, prompt plus completion.
    """

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int
    context_length: int


class ModelList(msgspec.Struct):
    """Body of `GET /v1/models`."""

    data: list[Model]
    object: Literal["list"] = "list"


class ErrorDetail(msgspec.Struct):
    """The inner object of an OpenAI error body."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    """`{"error": {...}}`, the one error shape llmd answers with."""

    error: ErrorDetail


# --- Completions (`POST /v1/completions`, the legacy text API) ----------------------------------

TokenId = Annotated[int, Meta(ge=0)]
# Stop strings per request: far above what editor plugins send (Continue sends 12-20); each
# costs a scan per generated token.
MAX_STOP_STRINGS = 256


class CompletionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of `POST /v1/completions` (the implemented subset, plus `top_k`).

    `prompt` is a string, a list of strings, a token-id list or a list of them; msgspec cannot
    tell two list types apart in a union, so which of the list forms it is the handler checks.
    """

    model: str
    prompt: str | Annotated[list[str | TokenId | list[TokenId]], Meta(min_length=1)]
    best_of: Choices | None = None
    echo: bool | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    n: Choices | None = None
    presence_penalty: Penalty | None = None
    seed: Annotated[int, Meta(ge=0)] | None = None  # below 2**64: SamplingParams checks
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    user: str | None = None
    # Extension shared with vLLM and llama.cpp; -1 and 0 both mean "off".
    top_k: Annotated[int, Meta(ge=-1)] | None = None


class CompletionLogprobs(msgspec.Struct):
    """The legacy `logprobs` of a `text_completion` choice: one entry per token in each list.

    `text_offset` is where each token starts in the choice's text (the echoed prompt included);
    the first prompt token has no `token_logprobs` or `top_logprobs` (null).
    """

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(msgspec.Struct):
    """One choice of a `text_completion`; in a streamed chunk, `text` is the new piece."""

    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(msgspec.Struct):
    """A `text_completion`: the whole response, or one streamed chunk of it (same object, as OpenAI)."""

    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: Literal["text_completion"] = "text_completion"
    system_fingerprint: str | None = None
    usage: Usage | None = None
