"""`POST /infill`: llama.cpp's fill-in-the-middle endpoint, so llama.vim and llama.vscode work unchanged.

Not OpenAI: the names, defaults and shapes are llama.cpp's (tools/server). The prompt is the
model's FIM layout around `input_prefix` + `prompt` and `input_suffix`, after the
`input_extra` chunks (repo-level, `<file_sep>name`, where the vocabulary has a file
separator; `engine/fim.py`); what does not fit is cut as llama.cpp cuts it (oldest extra
context first, then the far ends of prefix and suffix) and `truncated` says so.

Honoured: `n_predict` (-1 until the context is full; 0 only evaluates the prompt, warming the
prefix cache as llama.vim's background requests mean to), `stop`, `temperature`, `top_k`,
`top_p`, `min_p`, `seed`, `repeat_penalty`, the presence and frequency penalties, `samplers`
(which of those apply), `n_indent` and `t_max_predict_ms` (`api/infill_limits.py`),
`stream`, `response_fields`. Accepted and ignored because they cannot change the answer:
`cache_prompt`, `id_slot` (llmd's prefix cache is automatic and it has no slots),
`t_max_prompt_ms` (llama.cpp ignores it too), a chunk's `time`. The `infill` sampler is
accepted in `samplers` and not applied (llmd has no such sampler). Any other field is
refused, all of them named in one 400. The stream is llama.cpp's: one
`data: {"content": ..., "stop": false}` event per piece, a last event with `stop: true` and
the timings, and no `[DONE]`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from llmd.api.chat import validation_error
from llmd.api.choices import unless_disconnected
from llmd.api.dependencies import InjectedEngine, InjectedMetrics, InjectedModel
from llmd.api.infill_limits import InfillLimits
from llmd.api.lenient import Refusal, extra_keys, json_object, refuse
from llmd.api.sse import LLAMA_EVENTS, error_events, pushed_sse_response
from llmd.engine.client import Engine, TokenStream
from llmd.engine.types import CompletionPrompt, ExtraFile, InfillInput, SamplingParams, TokenEvent
from llmd.errors import InvalidRequest
from llmd.infill_protocol import Infill, InfillExtraChunk, InfillPiece, InfillRequest, InfillTimings

log = logging.getLogger("llmd.api")
_decoder = msgspec.json.Decoder(InfillRequest)
Clock = Callable[[], float]

# llama.cpp's sampler names. Those llmd applies follow `samplers`; the others are no-ops at the
# defaults of parameters llmd does not accept (dry, typ_p, xtc, top_n_sigma), except `infill`.
SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
            "infill")
# llama.cpp's defaults for what a request leaves out.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
# Context kept free for the answer when `n_predict` is -1 (extra chunks are cut to leave it).
OPEN_ENDED_RESERVE = 256
IGNORED = ("cache_prompt", "id_slot", "t_max_prompt_ms")
# What the limits and timings read (seconds); a test swaps it for a clock it drives.
CLOCK: Clock = time.monotonic


@post("/infill", status_code=200)
async def create_infill(
    request: Request, engine: InjectedEngine, metrics: InjectedMetrics, served: InjectedModel
) -> Response[Infill | dict[str, Any]] | Stream:
    """Fill the hole between `input_prefix` + `prompt` and `input_suffix`, streamed when `stream` is true."""
    body = parse_infill_body(await request.body())
    prompt = await engine.encode_infill(to_infill_input(body))
    sampling = to_infill_sampling(body, infill_budget(engine, prompt, body.n_predict), prompt.end_token_ids)
    limits = InfillLimits(body.n_indent or 0, body.t_max_predict_ms or 0)
    run = InfillRun(prompt, served.id, CLOCK, limits, evaluate_only=body.n_predict == 0)
    stream = engine.submit(prompt.ids, sampling)
    if body.stream:
        events = InfillChunks(stream, run, body.response_fields)
        return pushed_sse_response(request, [stream], events, metrics.observe_error, LLAMA_EVENTS)
    with stream:
        content = await unless_disconnected(request, infill_content(stream, run))
    return Response(picked(run.result(content, stream), body.response_fields))


def parse_infill_body(raw: bytes) -> InfillRequest:
    """Decode and validate the body; unknown fields and sampler names are all named in one 400."""
    try:
        body = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        unknown = unknown_infill_fields(raw)
        raise (refuse(unknown) if unknown else validation_error(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    known = ", ".join(SAMPLERS)
    refusals = [Refusal(f"samplers[{i}]", f"`{name}` is not a sampler llmd knows (one of {known})")
                for i, name in enumerate(body.samplers or ()) if name not in SAMPLERS]
    if refusals:
        raise refuse(refusals)
    log_ignored(body)
    return body


def unknown_infill_fields(raw: bytes) -> list[Refusal]:
    """The body's fields, and its chunks' fields, that `/infill` does not declare."""
    document = json_object(raw)
    if document is None:
        return []
    found = extra_keys(document, InfillRequest, "")
    chunks = document.get("input_extra")
    for i, chunk in enumerate(chunks if isinstance(chunks, list) else []):
        if isinstance(chunk, dict):
            found += extra_keys(chunk, InfillExtraChunk, f"input_extra[{i}].")
    return found


def log_ignored(body: InfillRequest) -> None:
    """Say at debug level what was accepted and ignored."""
    if log.isEnabledFor(logging.DEBUG):
        names = [name for name in IGNORED if getattr(body, name) is not None]
        names += ["samplers: infill"] if "infill" in (body.samplers or ()) else []
        if names:
            log.debug("/infill accepted and ignored: %s", ", ".join(names))


def to_infill_input(body: InfillRequest) -> InfillInput:
    """What the engine lays out: `prompt` continues the prefix (llama.cpp appends it there)."""
    extra = tuple(ExtraFile(chunk.filename, chunk.text) for chunk in body.input_extra or ())
    prefix = body.input_prefix + body.prompt
    return InfillInput(prefix, body.input_suffix, extra, reserve_tokens(body.n_predict))


def reserve_tokens(n_predict: int | None) -> int:
    """Context to keep free for the answer: `n_predict`, at least 1; `OPEN_ENDED_RESERVE` for -1."""
    if n_predict is None or n_predict < 0:
        return OPEN_ENDED_RESERVE
    return max(1, n_predict)


def infill_budget(engine: Engine, prompt: CompletionPrompt, n_predict: int | None) -> int:
    """Tokens to generate: `n_predict` cut to the room left (all of it for -1); 1 for 0 (evaluate only)."""
    with naming_the_prefix():
        room = engine.check_context(len(prompt.ids), None)
    if n_predict is None or n_predict < 0:
        return room
    return min(max(1, n_predict), room)


@contextlib.contextmanager
def naming_the_prefix() -> Iterator[None]:
    """A prompt that leaves no room is refused naming `input_prefix`, not chat's `messages`."""
    try:
        yield
    except InvalidRequest as exc:
        if exc.param != "messages":
            raise
        message = exc.message.replace("in the messages", "in the prompt").replace("the messages", "the input")
        raise type(exc)(message, param="input_prefix", code=exc.code) from None


def to_infill_sampling(body: InfillRequest, max_tokens: int, end_token_ids: tuple[int, ...]
                       ) -> SamplingParams:
    """Engine sampling from llama.cpp's parameters: its defaults, and only the samplers `samplers` lists."""
    chain = set(SAMPLERS if body.samplers is None else body.samplers)
    penalties = "penalties" in chain
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=pick(body.temperature, DEFAULT_TEMPERATURE) if "temperature" in chain else 1.0,
        top_p=pick(body.top_p, DEFAULT_TOP_P) if "top_p" in chain else 1.0,
        top_k=max(0, pick(body.top_k, DEFAULT_TOP_K)) if "top_k" in chain else 0,
        seed=None if body.seed is None or body.seed < 0 else body.seed,
        presence_penalty=(body.presence_penalty or 0.0) if penalties else 0.0,
        frequency_penalty=(body.frequency_penalty or 0.0) if penalties else 0.0,
        stop=tuple(body.stop or ()),
        min_p=pick(body.min_p, DEFAULT_MIN_P) if "min_p" in chain else 0.0,
        repetition_penalty=pick(body.repeat_penalty, 1.0) if penalties else 1.0,
        stop_token_ids=end_token_ids,
    )


def pick(value: float | None, default: float) -> Any:
    """`value`, or llama.cpp's default when the request left it out."""
    return default if value is None else value


@dataclass(slots=True)
class InfillRun:
    """One request's readings: when it was submitted, began and ended, for llama.cpp's `timings`."""

    prompt: CompletionPrompt
    model: str
    clock: Clock
    limits: InfillLimits
    evaluate_only: bool = False  # `n_predict: 0`: the prompt is evaluated, nothing is answered
    submitted: float = field(init=False)
    first: float | None = None
    last: float | None = None
    queued: float = 0.0

    def __post_init__(self) -> None:
        self.submitted = self.clock()

    def record(self, event: TokenEvent) -> float:
        """Note an event's arrival (the first one's queue wait too); returns the time."""
        now = self.clock()
        if self.first is None:
            self.first = now
            self.queued = event.queued_seconds or 0.0
        self.last = now
        return now

    def take(self, event: TokenEvent) -> str:
        """The event's text as far as the limits let it through ("" when none, or nothing is answered)."""
        text = self.limits.add(event.text, self.record(event))
        return "" if self.evaluate_only else text

    def result(self, content: str, stream: TokenStream) -> Infill:
        """The final object: `content` (empty when streamed), counts, timings."""
        evaluated = len(self.prompt.ids)
        predicted = 0 if self.evaluate_only else stream.completion_tokens
        return Infill(content, self.model, predicted, evaluated, self.prompt.truncated, evaluated + predicted,
                      self.timings(predicted))

    def timings(self, predicted: int) -> InfillTimings:
        """Prompt time (submission to the first token, less the queue wait) and generation time."""
        first, last = self.first, self.last
        prompt_ms = 0.0 if first is None else max(0.0, (first - self.submitted - self.queued) * 1000)
        predicted_ms = 0.0 if first is None or last is None else (last - first) * 1000
        prompt_n = len(self.prompt.ids)
        return InfillTimings(
            prompt_n, prompt_ms, per_token(prompt_ms, prompt_n), per_second(prompt_ms, prompt_n),
            predicted, predicted_ms, per_token(predicted_ms, predicted), per_second(predicted_ms, predicted))


def per_token(ms: float, count: int) -> float:
    """Milliseconds per token (0 without tokens)."""
    return ms / count if count else 0.0


def per_second(ms: float, count: int) -> float:
    """Tokens per second (0 when no time was measured)."""
    return 1000.0 * count / ms if ms > 0 else 0.0


async def infill_content(stream: TokenStream, run: InfillRun) -> str:
    """The whole text to send, until the stream ends or a limit (`n_indent`, time) stops it.

    Stopping early returns while the stream is open: the caller's `with stream` aborts the request.
    """
    pieces = []
    async for event in stream:
        pieces.append(run.take(event))
        if run.limits.stopped:
            break
    return "".join(pieces)


class InfillChunks:
    """llama.cpp's stream (`sse.Chunker`): a `stop: false` event per piece of text, then the final
    one (content empty); a limit (`n_indent`, time) ends it before the engine does (`stopped`)."""

    def __init__(self, stream: TokenStream, run: InfillRun, fields: list[str] | None) -> None:
        self.stream = stream
        self.run = run
        self.fields = fields
        self.stopped = False

    def opening(self) -> list[InfillPiece]:
        """Nothing before the first piece."""
        return []

    def feed(self, index: int, event: TokenEvent) -> list[InfillPiece]:
        """The event's text as far as the limits let it through."""
        text = self.run.take(event)
        self.stopped = self.run.limits.stopped
        return [InfillPiece(text, self.stream.completion_tokens, len(self.run.prompt.ids))] if text else []

    async def closing(self) -> list[Infill | dict[str, Any]]:
        """The final event: counts and timings (only the `response_fields`, when asked)."""
        return [picked(self.run.result("", self.stream), self.fields)]

    failed = staticmethod(error_events)


def picked(result: Infill, fields: list[str] | None) -> Infill | dict[str, Any]:
    """`result`, or only the `response_fields` paths (`timings/prompt_n`), keyed by path as llama.cpp does."""
    if not fields:
        return result
    document = msgspec.to_builtins(result)
    found: dict[str, Any] = {}
    for path in fields:
        value: Any = document
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            found[path] = value
    return found
