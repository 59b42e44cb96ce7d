"""`POST /v1/completions`, the legacy text API: parse, convert, call the engine, wrap the result.

Each prompt of a list is its own engine request and its own choice, indexed in prompt order;
a non-null `suffix` asks the engine for the model's fill-in-the-middle prompt. Streamed
choices are interleaved as their tokens come, each chunk naming its `index`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from llmd.api.chat import check_model, validation_error, wait_for_disconnect
from llmd.api.dependencies import InjectedEngine, InjectedMetrics, InjectedModel
from llmd.api.sse import sse_response
from llmd.engine.client import Engine, TokenStream
from llmd.engine.types import CompletionPrompt, SamplingParams, TokenEvent
from llmd.errors import ClientDisconnected, InvalidRequest, UnsupportedParameter
from llmd.protocol import Completion, CompletionChoice, CompletionRequest, Usage

_decoder = msgspec.json.Decoder(CompletionRequest)
T = TypeVar("T")

# OpenAI's default for the completions API (chat's default is "all the room left").
DEFAULT_MAX_TOKENS = 16
# Prompts in one request: each is an engine request, so more than the queue holds get a 503.
MAX_PROMPTS = 128
PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"

PromptInput = str | list[int]


@dataclass(frozen=True, slots=True)
class TextMeta:
    """What every chunk or response of one `text_completion` repeats."""

    id: str
    created: int
    model: str


@post("/v1/completions", status_code=200)
async def create_completion(
    request: Request, engine: InjectedEngine, metrics: InjectedMetrics, served: InjectedModel
) -> Response[Completion] | Stream:
    """Complete each prompt, streamed as SSE when `stream` is true."""
    body = parse_completion_body(await request.body())
    check_model(body.model, served.id)
    prompts = await encode_prompts(engine, prompt_list(body.prompt), body.suffix)
    budgets = [budget(engine, prompt, body.max_tokens, i, len(prompts)) for i, prompt in enumerate(prompts)]
    params = [to_text_sampling_params(body, max_tokens, prompt.end_token_ids)
              for prompt, max_tokens in zip(prompts, budgets, strict=True)]
    meta = TextMeta(f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.model)
    streams = submit_all(engine, prompts, params)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = stream_text(streams, prompts, meta, bool(body.echo), include_usage)
        return sse_response(chunks, metrics.observe_error)
    with closing_all(streams):
        texts = await unless_disconnected(request, collect_texts(streams))
    return Response(text_completion(meta, prompts, streams, texts, bool(body.echo)))


def parse_completion_body(raw: bytes) -> CompletionRequest:
    """Decode and validate the body; every failure, and every option not served yet, names its param."""
    try:
        body = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    check_options(body)
    return body


def check_options(body: CompletionRequest) -> None:
    """Refuse what is not served yet (more than one choice, logprobs, logit bias) and bad combinations."""
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("`stream_options` is only allowed when `stream` is true", param="stream_options")
    for name, value in (("n", body.n), ("best_of", body.best_of)):
        if value not in (None, 1):
            raise UnsupportedParameter(f"`{name}` other than 1 is not supported yet", param=name)
    if body.logprobs:
        raise UnsupportedParameter("`logprobs` is not supported yet; send null or 0", param="logprobs")
    if body.logit_bias:
        raise UnsupportedParameter("`logit_bias` is not supported yet; send null or {}", param="logit_bias")
    if body.echo and body.suffix is not None:
        raise InvalidRequest("`echo` cannot be combined with `suffix`", param="echo")


def prompt_list(prompt: str | list[str | int | list[int]]) -> list[PromptInput]:
    """The request's prompts, one per choice: a string, or a list of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(item, int) for item in prompt):
        return [[item for item in prompt if isinstance(item, int)]]
    prompts = [item for item in prompt if not isinstance(item, int)]
    if len(prompts) < len(prompt) or len({type(item) for item in prompts}) > 1:
        raise InvalidRequest(f"`prompt` must be {PROMPT_FORMS}, not a mix", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequest(f"`prompt` holds {len(prompts)} prompts; at most {MAX_PROMPTS} are served "
                             "in one request", param="prompt")
    return prompts


async def encode_prompts(engine: Engine, prompts: list[PromptInput], suffix: str | None
                         ) -> list[CompletionPrompt]:
    """Each prompt's ids; an error about one of several prompts names it (`prompt[2]`)."""
    encoded = []
    for i, prompt in enumerate(prompts):
        with naming_the_prompt(i, len(prompts)):
            encoded.append(await engine.encode_completion(prompt, suffix))
    return encoded


def budget(engine: Engine, prompt: CompletionPrompt, max_tokens: int | None, index: int, count: int) -> int:
    """The prompt's completion budget: `max_tokens` (default 16), cut to the room the context has left.

    Cut, not refused, as llama.cpp and Ollama do: editor plugins send `max_tokens` 4096 whatever
    the model's context. A prompt that leaves no room is refused as chat's is.
    """
    wanted = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    with naming_the_prompt(index, count):
        return min(wanted, engine.check_context(len(prompt.ids), None))


@contextlib.contextmanager
def naming_the_prompt(index: int, count: int) -> Iterator[None]:
    """Re-raise a prompt's 400 (the engine's name `prompt`, or `messages` for the context) as `prompt[i]`."""
    try:
        yield
    except InvalidRequest as exc:
        if exc.param not in ("prompt", "messages"):
            raise
        param = "prompt" if count == 1 else f"prompt[{index}]"
        message = exc.message.replace("messages have", "prompt has").replace("messages", "prompt")
        raise type(exc)(message, param=param, code=exc.code) from None


def to_text_sampling_params(body: CompletionRequest, max_tokens: int,
                            end_token_ids: tuple[int, ...] = ()) -> SamplingParams:
    """Engine sampling parameters from the request, with OpenAI's defaults.

    `end_token_ids` (a FIM layout's pad and file-separator tokens) end generation as EOS does:
    a fill-in-the-middle answer is over when the model pads or starts another file.
    """
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
        stop_token_ids=end_token_ids,
    )


def submit_all(engine: Engine, prompts: list[CompletionPrompt], params: list[SamplingParams]
               ) -> list[TokenStream]:
    """One engine request per prompt; if one is refused (full, draining), those already in are aborted."""
    streams: list[TokenStream] = []
    try:
        for prompt, sampling in zip(prompts, params, strict=True):
            streams.append(engine.submit(prompt.ids, sampling))
    except BaseException:
        with closing_all(streams):
            raise
    return streams


@contextlib.contextmanager
def closing_all(streams: Sequence[TokenStream]) -> Iterator[None]:
    """Leave every stream on the way out: one that has not finished is aborted."""
    with contextlib.ExitStack() as stack:
        for stream in streams:
            stack.enter_context(stream)
        yield


async def stream_text(streams: list[TokenStream], prompts: list[CompletionPrompt], meta: TextMeta,
                      echo: bool, include_usage: bool) -> AsyncIterator[Completion]:
    """Each choice's echoed prompt, a chunk per step with new text or a finish, then usage."""
    with closing_all(streams):
        for index, prompt in enumerate(prompts if echo else ()):
            yield chunk(meta, CompletionChoice(prompt.text, index))
        async for index, event in merged_events(streams):
            if event.text or event.finish_reason is not None:
                finish = None if event.finish_reason is None else event.finish_reason.value
                yield chunk(meta, CompletionChoice(event.text, index, None, finish))
        if include_usage:
            yield Completion(meta.id, [], meta.created, meta.model, usage=usage(prompts, streams))


def chunk(meta: TextMeta, choice: CompletionChoice) -> Completion:
    """A streamed `text_completion` with a single choice."""
    return Completion(meta.id, [choice], meta.created, meta.model)


async def merged_events(streams: list[TokenStream]) -> AsyncIterator[tuple[int, TokenEvent]]:
    """Every stream's events tagged with its index, as they come (one stream: read directly)."""
    if len(streams) == 1:
        async for event in streams[0]:
            yield 0, event
        return
    readers = [aiter(stream) for stream in streams]
    pending = {asyncio.ensure_future(anext(reader)): i for i, reader in enumerate(readers)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                index = pending.pop(task)
                try:
                    event = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(readers[index]))] = index
                yield index, event
    finally:
        for task in pending:
            task.cancel()


async def collect_texts(streams: list[TokenStream]) -> list[tuple[str, str]]:
    """(text, finish reason) of every stream, read side by side; one failing stops the others' reading."""
    readers = [asyncio.ensure_future(collect_text(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*readers))
    finally:
        for reader in readers:
            reader.cancel()


async def collect_text(stream: TokenStream) -> tuple[str, str]:
    """All of a stream's text and its finish reason."""
    parts: list[str] = []
    finish_reason = "stop"
    async for event in stream:
        parts.append(event.text)
        if event.finish_reason is not None:
            finish_reason = event.finish_reason.value
    return "".join(parts), finish_reason


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of `work`, cancelled (and a `ClientDisconnected` raised) if the client leaves first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnected("the client disconnected before the completion was ready")
    return task.result()


def text_completion(meta: TextMeta, prompts: list[CompletionPrompt], streams: list[TokenStream],
                    texts: list[tuple[str, str]], echo: bool) -> Completion:
    """The non-streamed `text_completion`: one choice per prompt, echoed prompt first when asked."""
    choices = [
        CompletionChoice((prompt.text if echo else "") + text, index, None, finish)
        for index, (prompt, (text, finish)) in enumerate(zip(prompts, texts, strict=True))
    ]
    return Completion(meta.id, choices, meta.created, meta.model, usage=usage(prompts, streams))


def usage(prompts: list[CompletionPrompt], streams: list[TokenStream]) -> Usage:
    """Token accounting over every prompt and its finished stream."""
    prompt = sum(len(p.ids) for p in prompts)
    completion = sum(stream.completion_tokens for stream in streams)
    return Usage(prompt, completion, prompt + completion)
