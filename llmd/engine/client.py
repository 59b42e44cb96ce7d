"""The seam between the API layer and the engine: the `Engine` protocol and the native client.

`Engine` (and the `TokenStream` its `submit` returns) is all that `api/` sees of an engine;
a test's fake, the native `EngineClient` and the vLLM engine (`engine/vllm/`) all fit it.
`EngineClient` runs requests on llmd's worker thread: its `EngineFront` (shared with the vLLM
engine) admits them and streams their events, filled from the worker with
`loop.call_soon_threadsafe`; leaving a stream early aborts its request in the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Protocol

from llmd.engine.burst import BOUND_SECONDS, Arrival, carry
from llmd.engine.front import EngineFront
from llmd.engine.heartbeat import Heartbeat
from llmd.engine.stream import DirectSink, EventSink, GenerationStream
from llmd.engine.tool_format import ChatFormat
from llmd.engine.types import (
    CompletionPrompt,
    Constraint,
    EngineStats,
    GrammarRequest,
    InfillInput,
    Request,
    SamplingParams,
    TemplateOptions,
    TokenEvent,
)
from llmd.engine.worker import EngineWorker, WorkerHooks

log = logging.getLogger("llmd.engine")

# Re-exported for the HTTP connection, which counts a request on its way to the engine before its
# handler runs (api/connection.py; `ServedEngine.arrival` makes one, for `BOUND_SECONDS` at most)
# and carries the count to the encode.
__all__ = ["BOUND_SECONDS", "Arrival", "Engine", "EngineClient", "TokenStream", "carry"]


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

    def listen(self, sink: EventSink, direct: DirectSink | None = None) -> None:
        """Push every event to `sink` as it comes instead of being read; an error that ends the
        request is its last call. Token events may reach `direct` on the engine's thread
        instead (see `GenerationStream.listen`)."""
        ...

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


class EngineClient(EngineFront):
    """Submits requests to the one worker and streams their events back."""

    def __init__(self, worker: EngineWorker, max_context: int, fim_template: str | None = None) -> None:
        """Attach to `worker` (not started yet) as its one listener; `max_context` bounds every prompt.

        `fim_template` (settings) overrides the FIM layout detected from the tokenizer.
        """
        super().__init__(worker.profile, max_context)
        self.fim_template = fim_template
        self._worker = worker
        worker.hooks = WorkerHooks(
            deliver=self._deliver_from_worker,
            on_ready=self._ready_from_worker,
            on_fatal=self._fatal_from_worker,
            on_phase=self._phase_from_worker,
        )

    async def start(self) -> None:
        """Start loading in the worker; returns at once (see `ready` and `failed`)."""
        self._attach_loop()
        from llmd.engine.tokenizer import ChatTokenizer

        self._tokenizer = await asyncio.to_thread(
            ChatTokenizer, self._worker.model_dir, self.max_context, self.fim_template)
        self._worker.start()

    async def shutdown(self) -> None:
        """Stop the worker thread (and drop queued grammar compiles)."""
        self._close_grammars()
        await asyncio.to_thread(self._worker.stop, 10.0)

    @property
    def vocab_size(self) -> int | None:
        """The model's logits width, once it is loaded."""
        runner = self._worker.runner
        return runner.vocab_size if runner is not None else None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The model's and the tokenizer's EOS ids, once loaded."""
        return self._worker.eos_token_ids

    def _arriving(self, change: int) -> None:
        """An idle worker waits for a burst's stragglers instead of starting on the first alone."""
        self._worker.arriving(change)

    def _start(self, prompt_ids: list[int], choices: list[SamplingParams]) -> list[GenerationStream]:
        """The choices as one request to the worker: the first carries the others as followers,
        forked from its prefill (until then they hold slots beside it)."""
        streams = [self._open(len(prompt_ids), params.max_tokens) for params in choices]
        leader, *followers = [Request(stream.request_id, prompt_ids, params)
                              for stream, params in zip(streams, choices, strict=True)]
        leader.followers = followers
        self._worker.submit(leader)
        return streams

    def _abort(self, request_id: str) -> None:
        self._worker.abort(request_id)

    def _step_seconds(self) -> float | None:
        return self._worker.pace.seconds

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

    def _deliver_from_worker(self, batch: list[tuple[str, TokenEvent]]) -> None:
        """On the worker: a step's events. Those a stream's sink takes here (`take_direct`: a
        streamed response writing its token to the socket) cost the loop nothing; the rest go
        to the loop together, one wake for all of them."""
        assert self._loop is not None
        posted = []
        for request_id, event in batch:
            stream = self._streams.get(request_id)
            if stream is not None:
                try:
                    if stream.take_direct(event):
                        continue
                except Exception:  # the sink's own failure: its stream's next event ends it on the loop
                    log.exception("writing %s's event failed", request_id)
                stream.posted += 1
            posted.append((request_id, event))
        if posted:
            self._loop.call_soon_threadsafe(self._dispatch, posted)

    def _dispatch(self, batch: list[tuple[str, TokenEvent]]) -> None:
        """One step's events to their streams, one loop wake for all of them. A sink that fails
        ends its own request, never another's delivery."""
        for request_id, event in batch:
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            stream.landed += 1
            try:
                stream.deliver(event)
            except Exception:
                log.exception("delivering %s's event failed", request_id)
                stream.close()

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
