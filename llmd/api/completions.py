"""`POST /v1/completions`, the legacy text API: parse, convert, call the engine, wrap the result.

Each prompt of a list is its own engine prompt, with `n` choices each (`best_of` generated, the
`n` likeliest kept), indexed `prompt_index * n + choice_index` as OpenAI and vLLM do; a non-null
`suffix` asks the engine for the model's fill-in-the-middle prompt. Streamed choices are
interleaved as their tokens come, each chunk naming its `index`. `logprobs` come in the legacy
shape (`api/logprobs.py`), the echoed prompt's first when `echo` asks for it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from llmd.api.chat import check_model, decoded
from llmd.api.choices import Generated, closing_all, collect_all, unless_disconnected
from llmd.api.dependencies import InjectedEngine, InjectedMetrics, InjectedModel
from llmd.api.logprobs import Scored, completion_logprobs, prompt_scored, shifted
from llmd.api.sampling import sampling_params
from llmd.api.sse import error_events, pushed_sse_response
from llmd.engine.client import Engine, TokenStream
from llmd.engine.types import CompletionPrompt, SamplingParams, TokenEvent
from llmd.errors import InvalidRequest
from llmd.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Usage,
)

_decoder = msgspec.json.Decoder(CompletionRequest)

# OpenAI's default for the completions API (chat's default is "all the room left").
DEFAULT_MAX_TOKENS = 16
# Engine requests (prompts times choices) in one request: more than the queue holds get a 503.
MAX_PROMPTS = 128
PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of token-id lists"

PromptInput = str | list[int]


@dataclass(frozen=True, slots=True)
class TextMeta:
    """What every chunk or response of one `text_completion` repeats."""

    id: str
    created: int
    model: str


@dataclass(frozen=True, slots=True)
class TextOptions:
    """How a request's choices are made and shown: per prompt `best_of` generated and `n` kept,
    the prompt echoed or not, `logprobs` (top count) returned or not (None)."""

    n: int = 1
    best_of: int = 1
    echo: bool = False
    logprobs: int | None = None

    @property
    def ranked(self) -> bool:
        """Whether choices are dropped by rank (`best_of` above `n`): their logprobs are needed."""
        return self.best_of > self.n


def text_options(body: CompletionRequest) -> TextOptions:
    """The request's choice options (`best_of` defaults to `n`)."""
    n = body.n or 1
    return TextOptions(n, body.best_of or n, bool(body.echo), body.logprobs)


@post("/v1/completions", status_code=200)
async def create_completion(
    request: Request, engine: InjectedEngine, metrics: InjectedMetrics, served: InjectedModel
) -> Response[Completion] | Stream:
    """Complete each prompt `n` times, streamed as SSE when `stream` is true."""
    body = parse_completion_body(await request.body())
    check_model(body.model, served.id)
    options = text_options(body)
    prompts = await encode_prompts(engine, prompt_list(body.prompt, options.best_of), body.suffix)
    budgets = [budget(engine, prompt, body.max_tokens, i, len(prompts)) for i, prompt in enumerate(prompts)]
    params = [to_text_sampling_params(body, max_tokens, prompt.end_token_ids)
              for prompt, max_tokens in zip(prompts, budgets, strict=True)]
    meta = TextMeta(f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.model)
    streams = submit_all(engine, prompts, params, options)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = TextChunks(streams, prompts, meta, options, include_usage)
        return pushed_sse_response(request, streams, chunks, metrics.observe_error)
    with closing_all(streams):
        kept_logprobs = options.logprobs is not None or options.ranked
        generated = await unless_disconnected(request, collect_all(streams, kept_logprobs))
    return Response(text_completion(meta, prompts, streams, generated, options))


def parse_completion_body(raw: bytes) -> CompletionRequest:
    """Decode and validate the body; every failure names its param."""
    body = decoded(_decoder, raw)
    check_options(body)
    return body


def check_options(body: CompletionRequest) -> None:
    """Refuse bad combinations: `best_of` below `n` or streamed, `echo` with `suffix`, ..."""
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("`stream_options` is only allowed when `stream` is true", param="stream_options")
    n = body.n or 1
    if body.best_of is not None and body.best_of < n:
        raise InvalidRequest(f"`best_of` ({body.best_of}) must be at least `n` ({n})", param="best_of")
    if body.stream and body.best_of is not None and body.best_of > n:
        raise InvalidRequest("`best_of` above `n` cannot be streamed: the best are known only at the end",
                             param="best_of")
    if body.echo and body.suffix is not None:
        raise InvalidRequest("`echo` cannot be combined with `suffix`", param="echo")


def prompt_list(prompt: str | list[str | int | list[int]], choices: int = 1) -> list[PromptInput]:
    """The request's prompts, `choices` generated for each: a string, or a list of token ids.

    At most `MAX_PROMPTS` engine requests (prompts times choices) are served in one request.
    """
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(item, int) for item in prompt):
        return [[item for item in prompt if isinstance(item, int)]]
    prompts = [item for item in prompt if not isinstance(item, int)]
    if len(prompts) < len(prompt) or len({type(item) for item in prompts}) > 1:
        raise InvalidRequest(f"`prompt` must be {PROMPT_FORMS}, not a mix", param="prompt")
    if len(prompts) * choices > MAX_PROMPTS:
        each = "" if choices == 1 else f", {choices} choices each"
        raise InvalidRequest(f"`prompt` holds {len(prompts)} prompts{each}; at most {MAX_PROMPTS} "
                             "choices are served in one request", param="prompt")
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
    a fill-in-the-middle answer is over when the model pads or starts another file. Logprobs
    are asked when returned, or (top 0) when `best_of` ranks choices by them; the prompt's
    when `echo` returns them too.
    """
    options = text_options(body)
    return sampling_params(
        body, max_tokens,
        stop_token_ids=end_token_ids,
        logprobs=0 if options.logprobs is None and options.ranked else options.logprobs,
        prompt_logprobs=options.logprobs if options.echo else None,
    )


def submit_all(engine: Engine, prompts: list[CompletionPrompt], params: list[SamplingParams],
               options: TextOptions) -> list[TokenStream]:
    """`best_of` choices per prompt, prompt by prompt; if one is refused (full, draining), those
    already in are aborted."""
    streams: list[TokenStream] = []
    try:
        for prompt, sampling in zip(prompts, params, strict=True):
            with naming_the_choices(options):
                streams.extend(engine.submit_choices(prompt.ids, sampling, options.best_of))
    except BaseException:
        with closing_all(streams):
            raise
    return streams


@contextlib.contextmanager
def naming_the_choices(options: TextOptions) -> Iterator[None]:
    """An engine's refusal of too many choices (`n`) names `best_of` when that is what asked for them."""
    try:
        yield
    except InvalidRequest as exc:
        if exc.param != "n" or not options.ranked:
            raise
        raise type(exc)(exc.message.replace("`n`", "`best_of`"), param="best_of", code=exc.code) from None


@dataclass(slots=True)
class StreamedChoice:
    """One streamed choice's state: its prompt, characters sent so far, logprobs not sent yet.

    `held` is None unless logprobs were asked; `echo_waits` while an echo waits for the prompt's
    logprobs (they come with the choice's first event).
    """

    prompt: CompletionPrompt
    echo_waits: bool = False
    sent: int = 0
    held: list[Scored] | None = None

    def release(self) -> CompletionLogprobs | None:
        """The held logprobs for the next chunk, taken out; None when none are asked."""
        if self.held is None:
            return None
        scored, self.held = self.held, []
        return completion_logprobs(scored)


def streamed_choices(prompts: list[CompletionPrompt], options: TextOptions) -> list[StreamedChoice]:
    """Each stream's state, in index order (`n` per prompt)."""
    return [StreamedChoice(prompt, options.echo and options.logprobs is not None, 0,
                           [] if options.logprobs is not None else None)
            for prompt in prompts for _ in range(options.n)]


class TextChunks:
    """The chunks of a streamed text completion (`sse.Chunker`): each choice's echoed prompt, a
    chunk per event with new text or a finish, then usage. Echoed with logprobs, a choice's
    prompt waits for its first event (which carries them)."""

    stopped = False  # ends only with its streams

    def __init__(self, streams: list[TokenStream], prompts: list[CompletionPrompt], meta: TextMeta,
                 options: TextOptions, include_usage: bool) -> None:
        self.streams = streams
        self.prompts = prompts
        self.meta = meta
        self.include_usage = include_usage
        self.echo_now = options.echo and options.logprobs is None
        self.choices = streamed_choices(prompts, options)

    def opening(self) -> list[Completion]:
        """The echoed prompts that need not wait for their logprobs."""
        echoed = enumerate(self.choices if self.echo_now else [])
        return [chunk(self.meta, CompletionChoice(choice.prompt.text, index)) for index, choice in echoed]

    def feed(self, index: int, event: TokenEvent) -> list[Completion]:
        """Choice `index`'s chunks from one event."""
        return list(event_chunks(self.meta, index, self.choices[index], event))

    async def closing(self) -> list[Completion]:
        """The usage chunk, when asked."""
        if not self.include_usage:
            return []
        meta = self.meta
        return [Completion(meta.id, [], meta.created, meta.model, usage=usage(self.prompts, self.streams))]

    failed = staticmethod(error_events)


def event_chunks(meta: TextMeta, index: int, choice: StreamedChoice, event: TokenEvent
                 ) -> Iterator[Completion]:
    """The chunks one event of choice `index` makes: the echo it waited for, then its text or finish."""
    if choice.echo_waits:
        choice.echo_waits = False
        choice.sent = len(choice.prompt.text)
        echoed = completion_logprobs(prompt_scored(choice.prompt.text, event.prompt_logprobs or ()))
        yield chunk(meta, CompletionChoice(choice.prompt.text, index, echoed))
    if choice.held is not None and event.logprobs is not None:
        choice.held.append(Scored(choice.sent, event.logprobs.chosen.text, event.logprobs))
    if event.text or event.finish_reason is not None:
        finish = None if event.finish_reason is None else event.finish_reason.value
        yield chunk(meta, CompletionChoice(event.text, index, choice.release(), finish))
        choice.sent += len(event.text)


def chunk(meta: TextMeta, choice: CompletionChoice) -> Completion:
    """A streamed `text_completion` with a single choice."""
    return Completion(meta.id, [choice], meta.created, meta.model)


def text_completion(meta: TextMeta, prompts: list[CompletionPrompt], streams: list[TokenStream],
                    generated: list[Generated], options: TextOptions) -> Completion:
    """The non-streamed `text_completion`: `n` choices per prompt (the likeliest of `best_of`),
    indexed `prompt_index * n + rank`, echoed prompt first when asked."""
    choices = [
        text_choice(prompt, choice, p * options.n + rank, options)
        for p, prompt in enumerate(prompts)
        for rank, choice in enumerate(kept(generated[p * options.best_of:(p + 1) * options.best_of], options))
    ]
    return Completion(meta.id, choices, meta.created, meta.model, usage=usage(prompts, streams))


def kept(choices: list[Generated], options: TextOptions) -> list[Generated]:
    """A prompt's `n` choices: all of them, or the `n` whose sampled tokens' logprobs sum highest."""
    if not options.ranked:
        return choices
    return sorted(choices, key=lambda choice: choice.sampled_logprob, reverse=True)[: options.n]


def text_choice(prompt: CompletionPrompt, choice: Generated, index: int, options: TextOptions
                ) -> CompletionChoice:
    """One choice of the response: its text (after the prompt, when echoed) and legacy logprobs when asked."""
    echoed = prompt.text if options.echo else ""
    logprobs = None
    if options.logprobs is not None:
        head = prompt_scored(prompt.text, choice.prompt or ()) if options.echo else []
        logprobs = completion_logprobs([*head, *shifted(choice.scored or [], len(echoed))])
    return CompletionChoice(echoed + choice.text, index, logprobs, choice.finish_reason)


def usage(prompts: list[CompletionPrompt], streams: list[TokenStream]) -> Usage:
    """Token accounting: every prompt once, every generated choice's tokens (`best_of`'s dropped ones too)."""
    prompt = sum(len(p.ids) for p in prompts)
    completion = sum(stream.completion_tokens for stream in streams)
    return Usage(prompt, completion, prompt + completion)
