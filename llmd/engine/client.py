"""The seam between the API layer and the engine: the `Engine` protocol and the native client.

`Engine` (and the `TokenStream` its `submit` returns) is all that `api/` sees of an engine;
a test's fake and the native `EngineClient` both fit it. `EngineClient` owns the asyncio side
of every request over its worker thread: a queue of `TokenEvent`s filled from the worker with
`loop.call_soon_threadsafe`, the admission bound, and the abort in `finally` that frees a
vanished client's slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from llmd.engine.grammar import GrammarRequest, SharedGrammars
from llmd.engine.heartbeat import Heartbeat
from llmd.engine.prompt_limits import LARGE_PROMPT_CHARS, LARGE_PROMPT_SLOTS, release_free_memory, text_length
from llmd.engine.retry_after import CompletionLengths, OpenRequest, retry_after
from llmd.engine.stream import GenerationStream
from llmd.engine.tool_format import ChatFormat
from llmd.engine.types import (
    DEFAULT_TEMPLATE,
    SEED_LIMIT,
    CompletionPrompt,
    Constraint,
    EngineStats,
    InfillInput,
    Request,
    SamplingParams,
    TemplateOptions,
    TokenEvent,
)
from llmd.engine.worker import EngineWorker, WorkerHooks
from llmd.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    Overloaded,
    ShuttingDown,
)

if TYPE_CHECKING:
    from llmd.engine.tokenizer import ChatTokenizer

log = logging.getLogger("llmd.engine")
T = TypeVar("T")
GRAMMAR_SECONDS = 10.0  # a schema that takes longer to compile is refused (llguidance: ~1 ms typically)


class TokenStream(Protocol):
    """One submitted request's events, in order; leaving the `with` before the end aborts it."""

    @property
    def completion_tokens(self) -> int:
        """Tokens generated so far (all of them once the stream has ended)."""
        ...

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache supplied (known from the first event on)."""
        ...

    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    def __enter__(self) -> TokenStream: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class Engine(Protocol):
    """Everything the API layer uses of an engine: readiness, the prompt's ids, its budget, submit, stats."""

    @property
    def ready(self) -> asyncio.Event:
        """Set once the model is loaded and warmed up."""
        ...

    @property
    def draining(self) -> bool:
        """True from the first stop signal on: new requests are refused."""
        ...

    async def encode_chat(self, messages: list[dict[str, Any]], template: TemplateOptions) -> list[int]:
        """Prompt ids for chat messages (role and text content, as the chat template takes them),
        rendered as `template` says (generation prompt, continued last message, variables)."""
        ...

    async def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt:
        """A completions prompt: text (control tokens parsed), token ids, or with `suffix` the FIM layout."""
        ...

    async def encode_infill(self, infill: InfillInput) -> CompletionPrompt:
        """llama.cpp's `/infill` prompt: extra files (repo-level where the model has the tokens), then FIM."""
        ...

    def check_context(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The completion budget for this prompt; raises `ContextLengthExceeded` when it cannot fit."""
        ...

    async def constrain(self, request: GrammarRequest) -> Constraint:
        """The grammar a request's output must follow (`SamplingParams.constraint`), compiled off the
        event loop; raises `InvalidRequest` naming `request.param` for a schema it cannot follow."""
        ...

    @property
    def chat_format(self) -> ChatFormat:
        """How the model writes tool calls and thinking (its chat template's formats)."""
        ...

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """Whether a chat prompt ends inside a thinking section, so the reply starts as thinking."""
        ...

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> TokenStream:
        """Admit a request; raises `Overloaded` (full, loading) or `ShuttingDown` (draining)."""
        ...

    def submit_choices(self, prompt_ids: list[int], params: SamplingParams, n: int) -> Sequence[TokenStream]:
        """`n` choices of one prompt, prefilled once: a stream each (its own abort), choice i seeded
        `seed + i` when `params.seed` is set. Raises as `submit` does, and `InvalidRequest` naming
        `n` when the choices cannot all run at once."""
        ...

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters."""
        ...


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed of a request seeded `seed` (wrapping at 2**64); None stays unseeded."""
    return None if seed is None else (seed + index) % SEED_LIMIT


def context_budget(max_context: int, prompt_tokens: int, max_tokens: int | None) -> int:
    """Completion tokens a prompt may have in `max_context`: all the room, or `max_tokens` if it fits."""
    room = max_context - prompt_tokens
    if max_tokens is None and room >= 1:
        return room
    if max_tokens is not None and max_tokens <= room:
        return max_tokens
    asked = prompt_tokens + (max_tokens or 1)
    raise ContextLengthExceeded(
        f"This model's maximum context length is {max_context} tokens. However, you "
        f"requested {asked} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens or 1} in the completion). Please reduce the length of the messages "
        "or completion.",
        param="messages",
    )


class EngineClient:
    """Submits requests to the one worker and streams their events back."""

    def __init__(self, worker: EngineWorker, max_context: int, fim_template: str | None = None) -> None:
        """Attach to `worker` (not started yet) as its one listener; `max_context` bounds every prompt.

        `fim_template` (settings) overrides the FIM layout detected from the tokenizer.
        """
        self.profile = worker.profile
        self.max_context = max_context
        self.fim_template = fim_template
        self._worker = worker
        worker.hooks = WorkerHooks(
            deliver=self._deliver_from_worker,
            on_ready=self._ready_from_worker,
            on_fatal=self._fatal_from_worker,
            on_phase=self._phase_from_worker,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, GenerationStream] = {}
        self._ids = itertools.count()
        self._tokenizer: ChatTokenizer | None = None
        self._grammars = SharedGrammars(self._grammar_view)  # the view built on the first constrained request
        self._large_prompt_slots = asyncio.Semaphore(LARGE_PROMPT_SLOTS)
        self._lengths = CompletionLengths()  # of requests that ended by themselves, for Retry-After
        self.ready = asyncio.Event()
        self.failed: asyncio.Future[BaseException] | None = None
        self.draining = False
        # called with each stream as it closes (metrics); must not raise
        self.observers: list[Callable[[GenerationStream], None]] = []
        # called on the event loop with each start-up phase (systemd STATUS); must not raise
        self.phase_listeners: list[Callable[[str], None]] = []
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        """Start loading in the worker; returns at once (see `ready` and `failed`)."""
        self._loop = asyncio.get_running_loop()
        self.failed = self._loop.create_future()
        from llmd.engine.tokenizer import ChatTokenizer

        self._tokenizer = await asyncio.to_thread(
            ChatTokenizer, self._worker.model_dir, self.max_context, self.fim_template)
        self._worker.start()

    async def shutdown(self) -> None:
        """Stop the worker thread (and drop queued grammar compiles)."""
        self._grammars.close()
        await asyncio.to_thread(self._worker.stop, 10.0)

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, let running ones finish for up to `timeout` seconds, end the rest.

        A request still going at the deadline ends with `ShuttingDown` (a stream's last event,
        then `[DONE]`; a 503 for a non-stream request). Returns how many were cut.
        """
        self.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return await self.cut(f"the server is shutting down; its drain timeout ({timeout:g} s) ran out")

    async def cut(self, message: str, grace: float = 5.0) -> int:
        """End every open request now with `ShuttingDown(message)`; refuse new ones.

        Each is aborted in the worker; then up to `grace` seconds pass for their handlers to
        take the error and close. Returns how many were cut.
        """
        self.draining = True
        cut = list(self._streams.values())
        for stream in cut:
            stream.fail(ShuttingDown(message))
            self._worker.abort(stream.request_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace)
        return len(cut)

    async def encode_chat(self, messages: list[dict[str, Any]], template: TemplateOptions = DEFAULT_TEMPLATE
                          ) -> list[int]:
        """Prompt ids for chat messages, rendered off the event loop as `template` says.

        A chat of more than `LARGE_PROMPT_CHARS` characters waits for one of
        `LARGE_PROMPT_SLOTS` encodes (small ones never queue behind it); one that cannot fit
        the context is refused after work bounded by the context (`ChatTokenizer.refuse_early`).
        Meanwhile the worker counts the request as arriving: an idle worker waits for a
        burst's stragglers instead of starting on the first alone (`EngineWorker.arriving`).
        """
        assert self._tokenizer is not None, "start() first"
        large = text_length(messages) > LARGE_PROMPT_CHARS
        return await self._encode(self._tokenizer.encode_chat, messages, template, large=large)

    async def encode_completion(self, prompt: str | list[int], suffix: str | None) -> CompletionPrompt:
        """A completions prompt's ids (see `ChatTokenizer.encode_completion`), encoded as `encode_chat` is."""
        assert self._tokenizer is not None, "start() first"
        chars = len(prompt) + len(suffix or "") if isinstance(prompt, str) else 0
        large = chars > LARGE_PROMPT_CHARS
        return await self._encode(self._tokenizer.encode_completion, prompt, suffix, large=large)

    async def encode_infill(self, infill: InfillInput) -> CompletionPrompt:
        """An `/infill` prompt's ids (see `ChatTokenizer.encode_infill`), encoded as `encode_chat` is."""
        assert self._tokenizer is not None, "start() first"
        chars = len(infill.prefix) + len(infill.suffix) + sum(len(f.text) for f in infill.extra)
        return await self._encode(self._tokenizer.encode_infill, infill, large=chars > LARGE_PROMPT_CHARS)

    async def _encode(self, encode: Callable[..., T], *args: Any, large: bool) -> T:
        assert self._loop is not None, "start() first"
        async with self._large_prompt_slots if large else contextlib.nullcontext():
            self._worker.arriving(+1)
            try:
                return await asyncio.to_thread(self._encode_and_release, encode, args, large)
            finally:
                # Uncounted only after the caller's synchronous `submit` (same task step, no
                # await between) has posted the request, or after it has failed instead.
                self._loop.call_soon(self._worker.arriving, -1)

    @staticmethod
    def _encode_and_release(encode: Callable[..., T], args: tuple[Any, ...], large: bool) -> T:
        try:
            return encode(*args)
        finally:
            if large:  # glibc keeps a big encode's freed arenas unless asked to return them
                release_free_memory()

    def check_context(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The completion budget for this prompt; raises when it cannot fit."""
        return context_budget(self.max_context, prompt_tokens, max_tokens)

    @property
    def chat_format(self) -> ChatFormat:
        """How the model writes tool calls and thinking (read from its chat template)."""
        assert self._tokenizer is not None, "the engine has not started"
        return self._tokenizer.chat_format

    def opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """Whether a chat prompt ends inside a thinking section (a short decode of its tail)."""
        assert self._tokenizer is not None, "the engine has not started"
        return self._tokenizer.opens_reasoning(prompt_ids)

    async def constrain(self, request: GrammarRequest) -> Constraint:
        """The request's grammar (see `Engine.constrain`): a cached one at once, else validated in
        a thread within `GRAMMAR_SECONDS` (the vocabulary's grammar view built on the first)."""
        return await self._grammars.bound(request, GRAMMAR_SECONDS)

    def _grammar_view(self) -> Any:
        """llguidance's view of the vocabulary, sized to the model's logits (once the model is loaded)."""
        runner = self._worker.runner
        assert self._tokenizer is not None and runner is not None, "ready first"
        return self._tokenizer.grammar_view(runner.vocab_size, self._worker.eos_token_ids)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> GenerationStream:
        """Admit a request and hand it to the worker; raises `Overloaded` when full.

        Use the returned stream as a context manager: leaving it before the last event
        (disconnect, error, cancellation) aborts the request in the worker.
        """
        return self._submit_group(prompt_ids, [params])[0]

    def submit_choices(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[GenerationStream]:
        """`n` streams over one prompt, prefilled once (see `Engine.submit_choices`).

        The first choice's request carries the others as followers: the worker forks them from
        its prefill, and until then they hold slots beside it.
        """
        if n > self.profile.max_running:
            raise InvalidRequest(f"`n` ({n}) exceeds the {self.profile.max_running} requests this "
                                 "profile runs at once", param="n")
        choices = [dataclasses.replace(params, seed=choice_seed(params.seed, index)) for index in range(n)]
        return self._submit_group(prompt_ids, choices)

    def _submit_group(self, prompt_ids: list[int], choices: list[SamplingParams]) -> list[GenerationStream]:
        self._admit(len(choices))
        self._check_token_ids(choices[0])
        streams, requests = [], []
        for params in choices:
            request_id = f"req-{next(self._ids)}"
            stream = self._streams[request_id] = GenerationStream(self._close, request_id, len(prompt_ids),
                                                                  params.max_tokens)
            streams.append(stream)
            requests.append(Request(request_id, prompt_ids, self._with_special_stops(params)))
        self._idle.clear()
        leader, *followers = requests
        leader.followers = followers
        self._worker.submit(leader)
        return streams

    def _check_token_ids(self, params: SamplingParams) -> None:
        """Refuse `logit_bias` ids outside the model's vocabulary (its logits row has no such column)."""
        runner = self._worker.runner
        vocab = runner.vocab_size if runner is not None else None
        wrong = [token for token, _ in params.logit_bias if vocab is not None and not 0 <= token < vocab]
        if wrong:
            raise InvalidRequest(f"`logit_bias` names token id {wrong[0]}, outside this model's vocabulary "
                                 f"of {vocab} ids", param="logit_bias")

    def _with_special_stops(self, params: SamplingParams) -> SamplingParams:
        """Stop strings that are one special token also stop as that token.

        Decoding skips special tokens, so their text never appears for a stop string to match
        (Continue stops a coder model at `<|fim_pad|>`, `<|file_sep|>`, `<|endoftext|>`).
        """
        if not params.stop or self._tokenizer is None:
            return params
        ids = self._tokenizer.special_stop_ids(params.stop)
        if not ids:
            return params
        stop_ids = tuple(dict.fromkeys((*params.stop_token_ids, *ids)))
        return dataclasses.replace(params, stop_token_ids=stop_ids)

    def _close(self, stream: GenerationStream) -> None:
        del self._streams[stream.request_id]
        if not self._streams:
            self._idle.set()
        if not stream.done:
            self._worker.abort(stream.request_id)
        self._lengths.observe(stream.completion_tokens, stream.finish_reason)
        log.info("%s", stream.summary())
        for observer in self.observers:
            observer(stream)

    def stats(self) -> EngineStats:
        """The worker's counters."""
        return self._worker.stats()

    @property
    def heartbeat(self) -> Heartbeat:
        """The worker thread's step stamps, for the systemd watchdog."""
        return self._worker.heartbeat

    def alive(self) -> bool:
        """Whether the worker thread runs (or is being stopped on purpose)."""
        return self._worker.alive()

    def gpu_memory(self) -> tuple[int, int] | None:
        """(reserved, total) bytes on the model's GPU; None on the CPU or before loading."""
        return self._worker.gpu_memory()

    @property
    def device_bytes(self) -> int:
        """Bytes the loaded model occupies on its device (0 before loading)."""
        runner = self._worker.runner
        return runner.load_report.device_bytes if runner is not None else 0

    @property
    def startup_seconds(self) -> tuple[float, float]:
        """Model load and warm-up (compile included) seconds, once ready."""
        return self._worker.load_seconds, self._worker.warmup_seconds

    def _admit(self, count: int = 1) -> None:
        if self.draining:
            raise ShuttingDown("the server is shutting down; retry against its successor")
        if not self.ready.is_set():
            raise Overloaded("the model is still loading", retry_after=5, code="not_ready")
        capacity = self.profile.max_running + self.profile.max_queue
        if len(self._streams) + count > capacity:
            raise Overloaded(
                f"the server is at capacity ({capacity} requests running or waiting); retry later",
                retry_after=self._retry_after(),
                code="queue_full",
            )

    def _retry_after(self) -> int:
        """Seconds until a place likely frees (`retry_after`): open streams in arrival order, as scheduled."""
        open_requests = (OpenRequest(s.completion_tokens, s.max_tokens) for s in self._streams.values())
        return retry_after(open_requests, self.profile.max_running, self._worker.pace.seconds,
                           self._lengths.tokens)

    def _deliver_from_worker(self, batch: list[tuple[str, TokenEvent]]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._dispatch, batch)

    def _dispatch(self, batch: list[tuple[str, TokenEvent]]) -> None:
        for request_id, event in batch:
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.events.put_nowait(event)

    def _ready_from_worker(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.ready.set)

    def _phase_from_worker(self, phase: str) -> None:
        assert self._loop is not None
        for listener in self.phase_listeners:
            self._loop.call_soon_threadsafe(listener, phase)

    def _fatal_from_worker(self, exc: BaseException) -> None:
        assert self._loop is not None and self.failed is not None
        self._loop.call_soon_threadsafe(self.failed.set_result, exc)
