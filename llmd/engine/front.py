"""The asyncio front every engine shares: admission, one stream per request, drain and cut.

`EngineFront` owns what a request is on the event loop whichever engine generates it: the
admission bound (`max_running + max_queue` of the profile; full, loading or draining each
refused with its 503), a `GenerationStream` per request whose early close aborts it in the
engine, the count of open requests a drain waits on, and the observers told of every stream as
it closes (metrics, the request log line). A subclass hands admitted requests to its engine
(`_start`) and stops one on request (`_abort`): the native worker thread, or vLLM's AsyncLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable

from llmd.config import Profile
from llmd.engine.prompts import PromptSide
from llmd.engine.retry_after import CompletionLengths, OpenRequest, retry_after
from llmd.engine.stream import GenerationStream
from llmd.engine.types import SEED_LIMIT, SamplingParams
from llmd.errors import InvalidRequest, Overloaded, ShuttingDown

log = logging.getLogger("llmd.engine")


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed of a request seeded `seed` (wrapping at 2**64); None stays unseeded."""
    return None if seed is None else (seed + index) % SEED_LIMIT


class EngineFront(PromptSide, ABC):
    """Admits requests and streams their events; the engine behind generates them."""

    def __init__(self, profile: Profile, max_context: int) -> None:
        """Bounds from `profile` (`max_running`, `max_queue`); `max_context` for every prompt."""
        super().__init__(max_context)
        self.profile = profile
        self.ready = asyncio.Event()
        self.failed: asyncio.Future[BaseException] | None = None  # set with what stopped the engine
        self.draining = False
        # called with each stream as it closes (metrics); must not raise
        self.observers: list[Callable[[GenerationStream], None]] = []
        # called on the event loop with each start-up phase (systemd STATUS); must not raise
        self.phase_listeners: list[Callable[[str], None]] = []
        self._streams: dict[str, GenerationStream] = {}
        self._ids = itertools.count()
        self._lengths = CompletionLengths()  # of requests that ended by themselves, for Retry-After
        self._idle = asyncio.Event()
        self._idle.set()

    @abstractmethod
    def _start(self, prompt_ids: list[int], choices: list[SamplingParams]) -> list[GenerationStream]:
        """Hand admitted choices of one prompt to the engine: a stream each, opened with `_open`."""

    @abstractmethod
    def _abort(self, request_id: str) -> None:
        """Stop generating a request whose stream closed before its end (or was cut)."""

    def _step_seconds(self) -> float | None:
        """Recent seconds per decode step (None until known), for Retry-After."""
        return None

    def _attach_loop(self) -> None:
        """Bind to the running event loop, and make `failed`: call first thing in `start`."""
        self._loop = asyncio.get_running_loop()
        self.failed = self._loop.create_future()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> GenerationStream:
        """Admit a request and hand it to the engine; raises `Overloaded` when full.

        Use the returned stream as a context manager: leaving it before the last event
        (disconnect, error, cancellation) aborts the request in the engine.
        """
        return self._submit_group(prompt_ids, [params])[0]

    def submit_choices(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[GenerationStream]:
        """`n` streams over one prompt (see `Engine.submit_choices`), choice i seeded `seed + i`."""
        if n > self.profile.max_running:
            raise InvalidRequest(f"`n` ({n}) exceeds the {self.profile.max_running} requests this "
                                 "profile runs at once", param="n")
        choices = [dataclasses.replace(params, seed=choice_seed(params.seed, index)) for index in range(n)]
        return self._submit_group(prompt_ids, choices)

    def _submit_group(self, prompt_ids: list[int], choices: list[SamplingParams]) -> list[GenerationStream]:
        self._admit(len(choices))
        self._check_token_ids(choices[0])
        return self._start(prompt_ids, [self._with_special_stops(params) for params in choices])

    def _open(self, prompt_tokens: int, max_tokens: int) -> GenerationStream:
        """A new request's stream, counted open until it closes."""
        request_id = f"req-{next(self._ids)}"
        stream = GenerationStream(self._close, request_id, prompt_tokens, max_tokens)
        self._streams[request_id] = stream
        self._idle.clear()
        return stream

    def _close(self, stream: GenerationStream) -> None:
        del self._streams[stream.request_id]
        if not self._streams:
            self._idle.set()
        if not stream.done:
            self._abort(stream.request_id)
        self._lengths.observe(stream.completion_tokens, stream.finish_reason)
        log.info("%s", stream.summary())
        for observer in self.observers:
            observer(stream)

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

        Each is aborted in the engine; then up to `grace` seconds pass for their handlers to
        take the error and close. Returns how many were cut.
        """
        self.draining = True
        cut = list(self._streams.values())
        for stream in cut:
            stream.fail(ShuttingDown(message))
            self._abort(stream.request_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace)
        return len(cut)

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
        step_seconds = self._step_seconds()
        return retry_after(open_requests, self.profile.max_running, step_seconds, self._lengths.tokens)
