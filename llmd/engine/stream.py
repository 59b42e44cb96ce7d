"""One submitted request's events as the API reads them: an async iterator and a context manager.

The engine hands each event to `deliver` on the event loop (`EngineClient` from the worker's
deliveries). They wait in `events` for the reader, or, once a sink `listen`s, go straight to it
as they come: a streamed response made by callback, with no task woken per token. A sink may also
take token events on the engine's own thread (`take_direct`): a response that writes them to its
socket there costs the event loop no wake at all. Leaving the stream before its last event calls
back `on_close`, which aborts the request in the worker.
Timing stamps and the outcome are kept for the request's log line and the metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType

from llmd.engine.types import TokenEvent
from llmd.errors import EngineFailure, LlmdError

# Takes each event of a stream as it comes, or the error that ended it (its last call either way).
EventSink = Callable[[TokenEvent | LlmdError], None]
# A sink's side on the engine's thread (`GenerationStream.take_direct`): takes a token event that
# ends nothing, noting it with the `account` it is handed once it is sure to take it (True), or
# declines, touching nothing (False), and the event is delivered on the event loop as usual.
DirectSink = Callable[[TokenEvent, Callable[[TokenEvent], object]], bool]


class GenerationStream:
    """The events of one submitted request, in order; an async iterator and a context manager."""

    def __init__(self, on_close: Callable[[GenerationStream], None], request_id: str, prompt_tokens: int,
                 max_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens  # the completion budget it was admitted with
        # the worker's events, or an error the client ends the request with (the drain's cut)
        self.events: asyncio.Queue[TokenEvent | LlmdError] = asyncio.Queue()
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.queued_seconds: float | None = None  # arrival → admitted to the running set
        self.cached_tokens = 0  # prompt tokens the prefix cache supplied
        self.last_event_at: float | None = None
        self.token_gaps: list[float] = []  # seconds between events that carried tokens
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = False
        self._on_close = on_close
        self._closed = False
        self._sink: EventSink | None = None
        self._direct: DirectSink | None = None
        # Events the engine sent by the loop and how many of those arrived: while some are on the
        # way, a later one may not overtake them by `take_direct`. Each is counted by one thread.
        self.posted = 0
        self.landed = 0

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self.done:
            raise StopAsyncIteration
        item = self._account(await self.events.get())
        if isinstance(item, LlmdError):
            raise item
        return item

    def deliver(self, item: TokenEvent | LlmdError) -> None:
        """The engine's next event for this request, or an error that ends it: to the sink that
        listens, else kept for the reader. Nothing reaches a sink after the stream's end."""
        if self._sink is None:
            self.events.put_nowait(item)
        elif not self.done:
            self._sink(self._account(item))

    def listen(self, sink: EventSink, direct: DirectSink | None = None) -> None:
        """From now on push every event to `sink` as it is delivered (those kept so far first),
        instead of being read; an error that ends the request is its last call. With `direct`,
        token events may reach it on the engine's thread instead (`take_direct`)."""
        while not self.events.empty() and not self.done:
            sink(self._account(self.events.get_nowait()))
        self._sink = sink
        self._direct = direct

    def take_direct(self, item: TokenEvent) -> bool:
        """On the engine's thread: hand a token event that ends nothing to the listening sink's
        direct side, the loop left asleep. False, nothing done, when the event must go by the loop:
        no direct side, an end or error, earlier events still on their way, or the sink declines."""
        direct = self._direct
        if direct is None or item.finish_reason is not None or item.error is not None or self.done \
                or self.posted != self.landed:
            return False
        return direct(item, self._account)

    def fail(self, error: LlmdError) -> None:
        """End the request with `error`, raised to whoever reads the stream next."""
        self.deliver(error)

    def _account(self, item: TokenEvent | LlmdError) -> TokenEvent | LlmdError:
        """Note one delivered item's timing and outcome; an event that carries the engine's error
        comes back as that error (`EngineFailure`)."""
        if isinstance(item, LlmdError):
            return self._ended_by(item)
        now = time.monotonic()
        if item.queued_seconds is not None:
            self.queued_seconds = item.queued_seconds
        if item.cached_tokens is not None:
            self.cached_tokens = item.cached_tokens
        if item.completion_tokens > self.completion_tokens:
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_event_at is not None:
                self.token_gaps.append(now - self.last_event_at)
            self.last_event_at = now
            self.completion_tokens = item.completion_tokens
        self.done = item.finish_reason is not None
        if item.finish_reason is not None:
            self.finish_reason = item.finish_reason.value
        if item.error is not None:
            return self._ended_by(EngineFailure(item.error))
        return item

    def _ended_by(self, error: LlmdError) -> LlmdError:
        self.done = True
        self.error = error.message
        return error

    @property
    def outcome(self) -> str:
        """finish reason, `error`, or `disconnected` (the client left before the end)."""
        return self.finish_reason or ("error" if self.error else "disconnected")

    def summary(self) -> str:
        """The one log line of a request: tokens, TTFT, speed, how it ended."""
        ttft = "-" if self.first_token_at is None else f"{(self.first_token_at - self.started) * 1000:.0f} ms"
        rate = "-"
        if self.first_token_at is not None and self.last_event_at is not None and self.completion_tokens > 1:
            span = self.last_event_at - self.first_token_at
            rate = f"{(self.completion_tokens - 1) / span:.1f} tok/s" if span > 0 else "-"
        total = time.monotonic() - self.started
        tokens = f"prompt {self.prompt_tokens}, completion {self.completion_tokens}"
        return (f"request {self.request_id}: {tokens}, ttft {ttft}, {rate}, {total:.2f} s, {self.outcome}"
                + (f" ({self.error})" if self.error else ""))

    def close(self) -> None:
        """Stop listening; aborts the request if it has not finished."""
        if not self._closed:
            self._closed = True
            self._on_close(self)

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
