"""`POST /v1/chat/completions`: parse, convert, call the engine, wrap the result."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from llmd.api.dependencies import InjectedEngine, InjectedMetrics, InjectedModel
from llmd.api.lenient import log_ignored, refuse, unknown_fields, unsupported_values
from llmd.api.sse import sse_response
from llmd.engine.client import TokenStream
from llmd.engine.types import SamplingParams, TemplateOptions
from llmd.errors import ClientDisconnected, InvalidRequest, ModelNotFound, UnsupportedParameter
from llmd.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChunkChoice,
    Delta,
    Usage,
)
from llmd.validation import split_validation_error

_decoder = msgspec.json.Decoder(ChatCompletionRequest)


@dataclass(frozen=True, slots=True)
class CompletionMeta:
    """What every chunk or response of one completion repeats."""

    id: str
    created: int
    model: str
    prompt_tokens: int


@post("/v1/chat/completions", status_code=200)
async def create_chat_completion(
    request: Request, engine: InjectedEngine, metrics: InjectedMetrics, served: InjectedModel
) -> Response[ChatCompletion] | Stream:
    """Generate a chat completion, streamed as SSE when `stream` is true."""
    body = parse_body(await request.body())
    check_model(body.model, served.id)
    prompt_ids = await engine.encode_chat(to_template_messages(body.messages), template_options(body))
    params = to_sampling_params(body, engine.check_context(len(prompt_ids), requested_max_tokens(body)))
    meta = CompletionMeta(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.model, len(prompt_ids))
    stream = engine.submit(prompt_ids, params)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = stream_chunks(stream, meta, include_usage)
        return sse_response(chunks, metrics.observe_error)
    return Response(await complete_unless_disconnected(request, stream, meta))


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
    log_ignored(body)
    return body


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


def to_template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: role, plain-text content, and a name or an
    assistant turn's reasoning when given (a template that knows `reasoning_content` renders it)."""
    return [template_message(m, i) for i, m in enumerate(messages)]


def template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """One message for the template; an assistant's refusal text stands in for empty content."""
    content = message_text(message, index) or message.refusal or ""
    reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
    return ({"role": message.role, "content": content}
            | ({"name": message.name} if message.name else {})
            | ({"reasoning_content": reasoning} if reasoning is not None else {}))


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


def template_options(body: ChatCompletionRequest) -> TemplateOptions:
    """How to render the chat: `reasoning_effort` and `chat_template_kwargs` become template
    variables (the kwargs win); the generation prompt is on unless the last message is continued."""
    continued = bool(body.continue_final_message)
    generation_prompt = not continued if body.add_generation_prompt is None else body.add_generation_prompt
    variables = {"reasoning_effort": body.reasoning_effort} if body.reasoning_effort is not None else {}
    return TemplateOptions(generation_prompt, continued, variables | (body.chat_template_kwargs or {}))


def requested_max_tokens(body: ChatCompletionRequest) -> int | None:
    """`max_completion_tokens` wins over the deprecated `max_tokens`."""
    return body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens


def to_sampling_params(body: ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    """Engine sampling parameters from the request, with OpenAI's defaults."""
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(0, body.top_k or 0),
        seed=body.seed,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        stop=stop,
        min_p=body.min_p or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=bool(body.ignore_eos),
        min_tokens=body.min_tokens or 0,
    )


async def stream_chunks(
    stream: TokenStream, meta: CompletionMeta, include_usage: bool
) -> AsyncIterator[ChatCompletionChunk]:
    """Role chunk, one chunk per step with new text, the finish chunk, then usage."""
    with stream:
        yield chunk(meta, Delta(role="assistant", content=""))
        async for event in stream:
            if event.text:
                yield chunk(meta, Delta(content=event.text))
            if event.finish_reason is not None:
                yield chunk(meta, Delta(), event.finish_reason.value)
        if include_usage:
            yield ChatCompletionChunk(meta.id, [], meta.created, meta.model, usage=usage(meta, stream))


def chunk(meta: CompletionMeta, delta: Delta, finish_reason: str | None = None) -> ChatCompletionChunk:
    """A chunk with a single choice."""
    choice = ChunkChoice(0, delta, None, finish_reason)
    return ChatCompletionChunk(meta.id, [choice], meta.created, meta.model)


def usage(meta: CompletionMeta, stream: TokenStream) -> Usage:
    """Token accounting for a finished stream."""
    completion = stream.completion_tokens
    return Usage(meta.prompt_tokens, completion, meta.prompt_tokens + completion)


async def complete_unless_disconnected(
    request: Request, stream: TokenStream, meta: CompletionMeta
) -> ChatCompletion:
    """Collect the whole completion, aborting it if the client goes away first."""
    with stream:
        collect = asyncio.ensure_future(collect_completion(stream, meta))
        gone = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not collect.done():
            collect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collect
            raise ClientDisconnected("the client disconnected before the completion was ready")
        return collect.result()


async def collect_completion(stream: TokenStream, meta: CompletionMeta) -> ChatCompletion:
    """All of a stream's text as one `chat.completion`."""
    parts: list[str] = []
    finish_reason = "stop"
    async for event in stream:
        parts.append(event.text)
        if event.finish_reason is not None:
            finish_reason = event.finish_reason.value
    message = AssistantMessage("assistant", "".join(parts))
    choice = Choice(0, message, None, finish_reason)
    return ChatCompletion(meta.id, [choice], meta.created, meta.model, usage(meta, stream))


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has closed the connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
