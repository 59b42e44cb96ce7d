"""`POST /v1/chat/completions`: parse, convert, call the engine, wrap the result."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from llmd.api.choices import Generated, closing_all, collect_all, unless_disconnected
from llmd.api.dependencies import InjectedEngine, InjectedMetrics, InjectedModel
from llmd.api.lenient import log_ignored, refuse, unknown_fields, unsupported_values
from llmd.api.logprobs import chat_logprobs
from llmd.api.reply import Message, ReplyParser, ReplyShape
from llmd.api.response_format import reply_constraint, thinking_at_start
from llmd.api.sampling import sampling_params
from llmd.api.sse import error_events, pushed_sse_response
from llmd.api.tool_grammar import Thinking
from llmd.api.tools import (
    ToolRequest,
    call_id,
    history_calls,
    template_tools,
    tool_request,
    with_generic_tools,
)
from llmd.engine.client import Engine, TokenStream
from llmd.engine.tool_format import PLAIN, ChatFormat
from llmd.engine.types import (
    Constraint,
    SamplingParams,
    TemplateOptions,
    TokenEvent,
    TokenLogprobs,
)
from llmd.errors import InvalidRequest, ModelNotFound, UnsupportedParameter
from llmd.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionTokensDetails,
    Delta,
    Usage,
)
from llmd.validation import split_validation_error

T = TypeVar("T")
_decoder = msgspec.json.Decoder(ChatCompletionRequest)
PLAIN_REPLY = ReplyShape()  # no tools, no thinking: the text is the content


@dataclass(frozen=True, slots=True)
class CompletionMeta:
    """What every chunk or response of one completion repeats, and how its replies are read:
    `named` when `tool_choice` forced one function (its reply finishes as `"stop"`, as OpenAI's)."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    shape: ReplyShape = PLAIN_REPLY
    named: bool = False
    chat: ChatFormat = PLAIN

    def parser(self) -> ReplyParser:
        """A fresh reader of one choice's reply."""
        return ReplyParser(self.shape, lambda: call_id(self.chat))

    def finish_reason(self, reason: str, parser: ReplyParser | None) -> str:
        """`tool_calls` for a reply that called tools and ended by itself (not a named call)."""
        called = parser is not None and parser.calls > 0
        return "tool_calls" if called and reason == "stop" and not self.named else reason


@post("/v1/chat/completions", status_code=200)
async def create_chat_completion(
    request: Request, engine: InjectedEngine, metrics: InjectedMetrics, served: InjectedModel
) -> Response[ChatCompletion] | Stream:
    """Generate `n` chat completion choices, streamed as SSE when `stream` is true."""
    body = parse_body(await request.body())
    check_model(body.model, served.id)
    prompt_ids, params, meta = await prepared(engine, body)
    streams = engine.submit_choices(prompt_ids, params, body.n or 1)
    logprobs = params.logprobs is not None
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = ChatChunks(streams, meta, include_usage, logprobs)
        return pushed_sse_response(request, streams, chunks, metrics.observe_error)
    with closing_all(streams):
        generated = await unless_disconnected(request, collect_all(streams, logprobs))
    return Response(chat_completion(meta, generated, streams))


async def prepared(engine: Engine, body: ChatCompletionRequest
                   ) -> tuple[list[int], SamplingParams, CompletionMeta]:
    """The prompt, the sampling (with the reply's grammar) and how the replies are read: the
    tools offered, the template's formats, whether the prompt opened the thinking."""
    chat = engine.chat_format
    tools = tool_request(body)
    messages = chat_messages(body, chat, tools)
    prompt_ids = await engine.encode_chat(messages, template_options(body, chat, tools))
    thinking = thinking_at_start(chat, engine.opens_reasoning(prompt_ids))
    constraint = await reply_constraint(engine, body, tools, chat, thinking)
    budget = engine.check_context(len(prompt_ids), requested_max_tokens(body))
    shape = ReplyShape(chat.tools if tools else None, tools.parameters if tools else {}, chat.reasoning,
                       thinking is Thinking.OPEN)
    meta = CompletionMeta(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.model, len(prompt_ids),
                          shape, tools is not None and tools.named, chat)
    return prompt_ids, to_sampling_params(body, budget, constraint), meta


def parse_body(raw: bytes) -> ChatCompletionRequest:
    """Decode and validate the JSON body; every failure names the offending param.

    Unsupported fields and values (`api/lenient.py`'s allow-list) are refused all in one 400.
    """
    try:
        body = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        unknown = unknown_fields(raw)  # only now: a valid body is decoded once
        raise (refuse(unknown) if unknown else validation_error(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    refusals = unsupported_values(body)
    if refusals:
        raise refuse(refusals)
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("`top_logprobs` needs `logprobs` set to true", param="top_logprobs")
    log_ignored(body)
    return body


def decoded(decoder: msgspec.json.Decoder[T], raw: bytes) -> T:
    """The body decoded and validated; a malformed one is a 400 naming the field (`validation_error`)."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None


def validation_error(message: str) -> InvalidRequest:
    """Turn a msgspec validation message into a 400 that names the param."""
    path, text = split_validation_error(message)
    unknown = re.match(r"Object contains unknown field `(?P<field>[^`]+)`", text)
    if unknown:
        param = ".".join(p for p in (path, unknown["field"]) if p)
        return UnsupportedParameter(f"`{param}` is not supported by llmd", param=param)
    missing = re.match(r"Object missing required field `(?P<field>[^`]+)`", text)
    if missing:
        param = ".".join(p for p in (path, missing["field"]) if p)
        return InvalidRequest(f"`{param}` is required", param=param)
    if not path:
        return InvalidRequest(f"invalid request body: {text}")
    return InvalidRequest(f"invalid value for `{path}`: {text}", param=path)


def check_model(requested: str, served: str) -> None:
    """Refuse a model name this daemon does not serve."""
    if requested != served:
        message = f"The model `{requested}` does not exist; this server serves `{served}`"
        raise ModelNotFound(message, param="model")


def chat_messages(body: ChatCompletionRequest, chat: ChatFormat, tools: ToolRequest | None
                  ) -> list[dict[str, Any]]:
    """The request's messages for the template; for one that renders no tools, with the generic
    format's instruction and calls written as text (`api/tools.py`)."""
    messages = to_template_messages(body.messages)
    if chat.template_renders_tools:
        return messages
    return with_generic_tools(messages, tools.tools if tools is not None else None)


def to_template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: role, plain-text content, and a name, an
    assistant turn's reasoning and tool calls, or a tool result's call id when given (a template
    that knows `reasoning_content` renders it)."""
    return [template_message(m, i) for i, m in enumerate(messages)]


def template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """One message for the template; an assistant's refusal text stands in for empty content."""
    content = message_text(message, index) or message.refusal or ""
    reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
    return ({"role": message.role, "content": content}
            | ({"name": message.name} if message.name else {})
            | ({"reasoning_content": reasoning} if reasoning is not None else {})
            | ({"tool_calls": history_calls(message, index)} if message.tool_calls else {})
            | ({"tool_call_id": message.tool_call_id} if message.tool_call_id is not None else {}))


def message_text(message: ChatMessage, index: int) -> str:
    """The text of one message; only text content parts, each with a string, are accepted."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    for j, part in enumerate(message.content):
        if part.type != "text":
            problem = f"content part type `{part.type}` is not supported; send text"
            raise UnsupportedParameter(problem, param=f"messages[{index}].content[{j}].type")
        if part.text is None:
            param = f"messages[{index}].content[{j}].text"
            raise InvalidRequest(f"`{param}` must be a string", param=param)
    return "".join(part.text or "" for part in message.content)


def template_options(body: ChatCompletionRequest, chat: ChatFormat = PLAIN, tools: ToolRequest | None = None
                     ) -> TemplateOptions:
    """How to render the chat: `reasoning_effort` and `chat_template_kwargs` become template
    variables (the kwargs win; `reasoning_effort: "none"` also turns `enable_thinking` off); the
    generation prompt is on unless the last message is continued; the tools offered, for a template
    that renders them."""
    continued = bool(body.continue_final_message)
    generation_prompt = not continued if body.add_generation_prompt is None else body.add_generation_prompt
    variables: dict[str, Any] = {}
    if body.reasoning_effort is not None:
        variables["reasoning_effort"] = body.reasoning_effort
        if body.reasoning_effort == "none":
            variables["enable_thinking"] = False
    offered = template_tools(tools.tools) if tools is not None and chat.template_renders_tools else None
    variables |= body.chat_template_kwargs or {}
    return TemplateOptions(generation_prompt, continued, variables, offered)


def requested_max_tokens(body: ChatCompletionRequest) -> int | None:
    """`max_completion_tokens` wins over the deprecated `max_tokens`."""
    return body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens


def to_sampling_params(body: ChatCompletionRequest, max_tokens: int,
                       constraint: Constraint | None = None) -> SamplingParams:
    """Engine sampling parameters from the request, with OpenAI's defaults.

    `logprobs: true` asks the engine for each sampled token's logprob and `top_logprobs` more;
    a bad `logit_bias` is a 400 naming it (`parse_logit_bias`).
    """
    return sampling_params(
        body, max_tokens,
        min_p=body.min_p or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=bool(body.ignore_eos),
        min_tokens=body.min_tokens or 0,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        constraint=constraint,
    )


class ChatChunks:
    """The chunks of a streamed chat completion (`sse.Chunker`): every choice's role chunk (index
    order), then a chunk per event with new text, each choice's finish chunk, then usage. With
    `logprobs`, a chunk carries the tokens since its choice's last chunk: a token whose text is
    still an incomplete character goes with the next one."""

    stopped = False  # ends only with its streams

    def __init__(self, streams: Sequence[TokenStream], meta: CompletionMeta, include_usage: bool,
                 logprobs: bool) -> None:
        self.streams = streams
        self.meta = meta
        self.include_usage = include_usage
        self.held: list[list[TokenLogprobs]] | None = [[] for _ in streams] if logprobs else None
        self.parsers = [meta.parser() for _ in streams] if meta.shape.parsed else None

    def opening(self) -> list[ChatCompletionChunk]:
        """Each choice's role chunk."""
        role = Delta(role="assistant", content="")
        return [chunk(self.meta, index, role) for index in range(len(self.streams))]

    def feed(self, index: int, event: TokenEvent) -> list[ChatCompletionChunk]:
        """Choice `index`'s deltas from one event, and its finish chunk on the last."""
        if self.held is not None and event.logprobs is not None:
            self.held[index].append(event.logprobs)
        parser = self.parsers[index] if self.parsers is not None else None
        made = [chunk(self.meta, index, delta, None, release(self.held, index))
                for delta in reply_deltas(parser, event)]
        if event.finish_reason is not None:
            reason = self.meta.finish_reason(event.finish_reason.value, parser)
            made.append(chunk(self.meta, index, Delta(), reason, release(self.held, index)))
        return made

    async def closing(self) -> list[ChatCompletionChunk]:
        """The usage chunk, when asked."""
        if not self.include_usage:
            return []
        meta, counted = self.meta, usage(self.meta, self.streams, self.parsers)
        return [ChatCompletionChunk(meta.id, [], meta.created, meta.model, usage=counted)]

    failed = staticmethod(error_events)


def reply_deltas(parser: ReplyParser | None, event: TokenEvent) -> list[Delta]:
    """The deltas one event's text makes: the text itself for a plain reply, else what the reply's
    parser reads in it (and, on the last event, all it still held)."""
    if parser is None:
        return [Delta(content=event.text)] if event.text else []
    deltas = parser.feed(event.text, event.completion_tokens) if event.text else []
    return deltas + parser.finish() if event.finish_reason is not None else deltas


def release(held: list[list[TokenLogprobs]] | None, index: int) -> ChoiceLogprobs | None:
    """The logprobs choice `index` holds for its next chunk, taken out; None when there are none."""
    if held is None or not held[index]:
        return None
    positions, held[index] = held[index], []
    return chat_logprobs(positions)


def chunk(meta: CompletionMeta, index: int, delta: Delta, finish_reason: str | None = None,
          logprobs: ChoiceLogprobs | None = None) -> ChatCompletionChunk:
    """A chunk with one choice's delta."""
    choice = ChunkChoice(index, delta, logprobs, finish_reason)
    return ChatCompletionChunk(meta.id, [choice], meta.created, meta.model)


def usage(meta: CompletionMeta, streams: Sequence[TokenStream],
          parsers: Sequence[ReplyParser] | None = None) -> Usage:
    """Token accounting of finished choices: the prompt once (it is prefilled once), every choice's
    tokens; for a reasoning model, how many of them were thinking."""
    completion = sum(stream.completion_tokens for stream in streams)
    if meta.shape.reasoning is None or parsers is None:
        return Usage(meta.prompt_tokens, completion, meta.prompt_tokens + completion)
    details = CompletionTokensDetails(sum(parser.reasoning_tokens for parser in parsers))
    return Usage(meta.prompt_tokens, completion, meta.prompt_tokens + completion, details)


def chat_completion(meta: CompletionMeta, generated: list[Generated], streams: Sequence[TokenStream]
                    ) -> ChatCompletion:
    """The non-streamed `chat.completion`: choice i is stream i's whole output."""
    if not meta.shape.parsed:
        choices = [Choice(index, AssistantMessage("assistant", choice.text), choice_logprobs(choice),
                          choice.finish_reason) for index, choice in enumerate(generated)]
        return ChatCompletion(meta.id, choices, meta.created, meta.model, usage(meta, streams))
    parsers = [meta.parser() for _ in generated]
    choices = [parsed_choice(meta, index, choice, parser)
               for index, (choice, parser) in enumerate(zip(generated, parsers, strict=True))]
    return ChatCompletion(meta.id, choices, meta.created, meta.model, usage(meta, streams, parsers))


def parsed_choice(meta: CompletionMeta, index: int, choice: Generated, parser: ReplyParser) -> Choice:
    """A choice whose text was read for thinking and calls, part by part as it was generated (so
    the thinking's tokens are counted); content null when it only calls tools."""
    message = Message()
    for text, tokens in zip(choice.parts, choice.counts, strict=True):
        for delta in parser.feed(text, tokens) if text else ():
            message.add(delta)
    for delta in parser.finish():
        message.add(delta)
    content = "".join(message.content)
    reply = AssistantMessage("assistant", None if message.calls and not content else content)
    if message.calls:
        reply.tool_calls = message.calls
    if message.reasoning:
        reply.reasoning_content = "".join(message.reasoning)
    return Choice(index, reply, choice_logprobs(choice), meta.finish_reason(choice.finish_reason, parser))


def choice_logprobs(choice: Generated) -> ChoiceLogprobs | None:
    """A whole choice's chat `logprobs`, or None when they were not asked."""
    if choice.scored is None:
        return None
    return chat_logprobs([s.position for s in choice.scored if s.position is not None])
