"""Pushed SSE (llmd/api/sse.py `PushedEvents`): events framed in the callback that delivers them,
written straight to the connection while the response's task waits, kept and sent by the task
otherwise, in order; errors end the response with one event and `[DONE]`; leaving closes all.
With the server's socket, a token event is taken on the engine's thread (`take_direct`) and
written there, or declined untouched when it must go by the loop."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import pytest

from llmd.api.sse import DONE, OPENAI_EVENTS, PushedEvents, error_events
from llmd.engine.stream import GenerationStream
from llmd.engine.types import FinishReason, TokenEvent
from llmd.errors import ShuttingDown


class Piece(msgspec.Struct):
    text: str


class Pieces:
    """A chunker: an opening piece, one piece per event tagged with its choice, a closing piece."""

    def __init__(self, fail_on: str | None = None, stop_on: str | None = None) -> None:
        self.fail_on = fail_on
        self.stop_on = stop_on
        self.stopped = False

    def opening(self) -> list[Piece]:
        return [Piece("open")]

    def feed(self, index: int, event: TokenEvent) -> list[Piece]:
        if event.text == self.fail_on:
            raise KeyError("secret")
        self.stopped = event.text == self.stop_on
        return [Piece(f"{index}:{event.text}")]

    async def closing(self) -> list[Piece]:
        await asyncio.sleep(0)  # as a store's save would
        if self.fail_on == "closing":
            raise KeyError("secret")
        return [Piece("close")]

    failed = staticmethod(error_events)


def data(text: str) -> bytes:
    return b'data: {"text":"' + text.encode() + b'"}\n\n'


class Wire:
    """The connection's writer: takes bytes while `open`, refuses them otherwise."""

    def __init__(self) -> None:
        self.open = True
        self.written: list[bytes] = []

    def write(self, chunk: bytes) -> bool:
        if self.open:
            self.written.append(chunk)
        return self.open


class Socket:
    """The connection's socket for other threads (`BodySocket`): takes chunks while `ready`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.is_ready = True
        self.opened = self.closed = False
        self.written: list[tuple[bytes, str]] = []  # each chunk, with the thread that wrote it

    def open(self) -> bool:
        self.opened = True
        return True

    def ready(self) -> bool:
        assert self.lock.locked()
        return self.opened and not self.closed and self.is_ready

    def write(self, data: bytes) -> None:
        assert self.lock.locked() and self.ready()
        self.written.append((data, threading.current_thread().name))

    def close(self) -> None:
        assert self.lock.locked()
        self.closed = True


class Run:
    """A pushed response over `n` real streams; `sent` is what its task sent (ASGI's writes)."""

    def __init__(self, n: int = 1, wire: Wire | None = None, chunker: Pieces | None = None,
                 socket: Socket | None = None) -> None:
        self.closed: list[str] = []
        self.streams = [GenerationStream(self._closed, f"r{i}", 4, 16) for i in range(n)]
        self.errors: list[str] = []
        self.wire = wire
        self.socket = socket
        write = wire.write if wire else None
        self.pushed = PushedEvents(self.streams, chunker or Pieces(), OPENAI_EVENTS, write,
                                   self.errors.append, socket)
        self.sent: list[bytes] = []

    def _closed(self, stream: GenerationStream) -> None:
        self.closed.append(stream.request_id)

    async def send_all(self) -> None:
        async for chunk in self.pushed.body():
            self.sent.append(chunk)


def run(steps: Callable[[Run], Awaitable[None]], n: int = 1, wire: Wire | None = None,
        chunker: Pieces | None = None, socket: Socket | None = None) -> Run:
    """Start the response's task, then drive `steps`; returns once the body has ended."""
    pushed = Run(n, wire, chunker, socket)

    async def main() -> None:
        task = asyncio.ensure_future(pushed.send_all())
        await asyncio.sleep(0)  # the task sends the opening, listens, and waits
        await steps(pushed)
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    return pushed


def token(text: str, count: int, finish: FinishReason | None = None) -> TokenEvent:
    return TokenEvent(text, count, finish)


def deliver(streams: Sequence[GenerationStream], *events: tuple[int, TokenEvent]) -> None:
    for index, event in events:
        streams[index].deliver(event)


def test_while_the_task_waits_each_event_is_written_at_once_by_its_delivery() -> None:
    async def steps(pushed: Run) -> None:
        assert pushed.sent == [data("open")] and pushed.wire is not None
        pushed.streams[0].deliver(token("a", 1))
        assert pushed.wire.written == [data("0:a")]  # written inside the delivery: no task ran
        pushed.streams[0].deliver(token("b", 2, FinishReason.STOP))

    pushed = run(steps, wire=Wire())
    assert pushed.wire is not None and pushed.wire.written == [data("0:a")]
    # the task sent what came before it first waited, and the end once `closing` had run
    assert pushed.sent == [data("open"), data("0:b") + data("close") + DONE]
    assert pushed.closed == ["r0"] and pushed.errors == []


def test_a_refused_write_is_kept_and_what_follows_waits_behind_it_in_order() -> None:
    async def steps(pushed: Run) -> None:
        assert pushed.wire is not None
        pushed.wire.open = False  # the client's socket is full
        pushed.streams[0].deliver(token("a", 1))
        pushed.wire.open = True
        pushed.streams[0].deliver(token("b", 2))  # the writer would take it, but "a" is still kept
        assert pushed.wire.written == []
        await asyncio.sleep(0)
        assert pushed.sent[1:] == [data("0:a") + data("0:b")]  # one write of both, by the task
        pushed.streams[0].deliver(token("c", 3, FinishReason.LENGTH))

    pushed = run(steps, wire=Wire())
    assert pushed.wire is not None and pushed.wire.written == []
    assert pushed.sent[-1] == data("0:c") + data("close") + DONE


def test_without_a_writer_the_task_sends_everything_kept_since_it_last_woke() -> None:
    async def steps(pushed: Run) -> None:
        deliver(pushed.streams, (0, token("a", 1)), (0, token("b", 2)), (0, token("c", 3, FinishReason.STOP)))

    pushed = run(steps)
    assert pushed.sent == [data("open"), data("0:a") + data("0:b"), data("0:c") + data("close") + DONE]


def test_events_delivered_before_the_response_listens_come_first_in_order() -> None:
    pushed = Run(1, Wire())
    pushed.streams[0].deliver(token("early", 1))

    async def main() -> None:
        task = asyncio.ensure_future(pushed.send_all())
        await asyncio.sleep(0)
        pushed.streams[0].deliver(token("late", 2, FinishReason.STOP))
        await task

    asyncio.run(main())
    assert pushed.sent == [data("open") + data("0:early"), data("0:late") + data("close") + DONE]


def test_choices_end_the_response_only_when_all_have_finished() -> None:
    async def steps(pushed: Run) -> None:
        deliver(pushed.streams, (1, token("x", 1, FinishReason.STOP)), (0, token("a", 1)))
        assert pushed.wire is not None and DONE not in b"".join(pushed.wire.written)
        deliver(pushed.streams, (0, token("b", 2, FinishReason.STOP)))

    pushed = run(steps, n=2, wire=Wire())
    assert pushed.wire is not None
    assert pushed.wire.written == [data("1:x"), data("0:a")]
    assert pushed.sent == [data("open"), data("0:b") + data("close") + DONE]
    assert sorted(pushed.closed) == ["r0", "r1"]


def test_an_error_ends_the_response_with_one_counted_event_and_aborts_the_other_choices() -> None:
    async def steps(pushed: Run) -> None:
        deliver(pushed.streams, (0, token("a", 1)))
        pushed.streams[1].fail(ShuttingDown("the drain timeout ran out"))
        deliver(pushed.streams, (0, token("b", 2)))  # after the end: dropped

    pushed = run(steps, n=2, wire=Wire())
    assert pushed.wire is not None and pushed.wire.written[0] == data("0:a")
    error, done = pushed.wire.written[1].removesuffix(DONE), pushed.wire.written[1].endswith(DONE)
    assert done and json.loads(error.removeprefix(b"data: "))["error"]["code"] == "shutting_down"
    assert len(pushed.wire.written) == 2 and pushed.errors == ["shutting_down"]
    assert sorted(pushed.closed) == ["r0", "r1"] and not pushed.streams[0].done  # r0 was aborted


def test_a_failing_chunker_is_reported_without_its_internals() -> None:
    async def steps(pushed: Run) -> None:
        deliver(pushed.streams, (0, token("a", 1)), (0, token("boom", 2)))

    pushed = run(steps, wire=Wire(), chunker=Pieces(fail_on="boom"))
    assert pushed.wire is not None and pushed.wire.written[-1].endswith(DONE)
    error = json.loads(pushed.wire.written[-1].removesuffix(DONE).removeprefix(b"data: "))["error"]
    assert error["type"] == "server_error" and "secret" not in error["message"]
    assert pushed.errors == ["engine_error"]


def test_the_last_event_waits_for_closing_and_a_failing_closing_ends_with_the_error_instead() -> None:
    async def steps(pushed: Run) -> None:
        deliver(pushed.streams, (0, token("a", 1)), (0, token("b", 2, FinishReason.STOP)))
        assert pushed.wire is not None and pushed.wire.written == [data("0:a")]  # "b" is held

    pushed = run(steps, wire=Wire(), chunker=Pieces(fail_on="closing"))
    assert len(pushed.sent) == 2 and pushed.sent[-1].endswith(DONE) and b"0:b" not in pushed.sent[-1]
    error = json.loads(pushed.sent[-1].removesuffix(DONE).removeprefix(b"data: "))["error"]
    assert error["type"] == "server_error" and "secret" not in error["message"]
    assert pushed.errors == ["engine_error"]


def test_a_chunker_that_stops_ends_the_response_at_once_and_aborts_the_stream() -> None:
    async def steps(pushed: Run) -> None:
        deliver(pushed.streams, (0, token("a", 1)), (0, token("enough", 2)), (0, token("c", 3)))

    pushed = run(steps, wire=Wire(), chunker=Pieces(stop_on="enough"))
    assert pushed.wire is not None and pushed.wire.written == [data("0:a")]
    assert pushed.sent == [data("open"), data("0:enough") + data("close") + DONE]
    assert pushed.closed == ["r0"] and not pushed.streams[0].done  # closed before its end: aborted


def test_leaving_the_body_early_closes_every_stream_and_later_events_write_nothing() -> None:
    pushed = Run(2, Wire())

    async def main() -> None:
        task = asyncio.ensure_future(pushed.send_all())
        await asyncio.sleep(0)
        task.cancel()  # the client went away: the server cancels the response
        with pytest.raises(asyncio.CancelledError):
            await task
        deliver(pushed.streams, (0, token("a", 1)))

    asyncio.run(main())
    assert sorted(pushed.closed) == ["r0", "r1"]
    assert pushed.wire is not None and pushed.wire.written == []


def test_an_event_carrying_the_engine_s_error_reaches_the_sink_as_the_error_and_ends_the_stream() -> None:
    stream = GenerationStream(lambda stream: None, "r0", 4, 16)
    got: list[object] = []
    stream.deliver(token("a", 1))
    stream.listen(got.append)
    stream.deliver(TokenEvent("b", 2, error="the step failed"))
    stream.deliver(token("c", 3))  # after the end: not pushed
    assert [type(item).__name__ for item in got] == ["TokenEvent", "EngineFailure"]
    assert stream.done and stream.error == "the step failed" and stream.completion_tokens == 2


async def from_engine(stream: GenerationStream, event: TokenEvent) -> bool:
    """`take_direct` called as the worker calls it: on a thread of its own, the loop running."""
    return await asyncio.to_thread(stream.take_direct, event)


def test_a_token_is_written_on_the_engine_s_thread_while_the_task_waits_and_its_end_by_the_loop() -> None:
    async def steps(pushed: Run) -> None:
        assert pushed.socket is not None and pushed.socket.opened
        assert await from_engine(pushed.streams[0], token("a", 1))
        assert await from_engine(pushed.streams[0], token("b", 2))
        assert pushed.sent == [data("open")]  # the task never woke
        assert [data for data, _ in pushed.socket.written] == [data("0:a"), data("0:b")]
        assert all(thread != threading.current_thread().name for _, thread in pushed.socket.written)
        assert pushed.streams[0].completion_tokens == 2 and len(pushed.streams[0].token_gaps) == 1
        assert not await from_engine(pushed.streams[0], token("c", 3, FinishReason.STOP))  # an end
        pushed.streams[0].deliver(token("c", 3, FinishReason.STOP))

    pushed = run(steps, wire=Wire(), socket=Socket())
    assert pushed.sent == [data("open"), data("0:c") + data("close") + DONE]
    assert pushed.socket is not None and pushed.socket.closed and pushed.wire is not None
    assert pushed.wire.written == [] and pushed.closed == ["r0"]


def test_the_engine_s_thread_is_declined_untouched_when_its_event_must_go_by_the_loop() -> None:
    async def steps(pushed: Run) -> None:
        stream, socket, wire = pushed.streams[0], pushed.socket, pushed.wire
        assert socket is not None and wire is not None
        socket.is_ready = False  # the server's own bytes wait to go, or the client is not reading
        assert not await from_engine(stream, token("a", 1)) and stream.completion_tokens == 0
        socket.is_ready = True
        assert not await from_engine(stream, TokenEvent("x", 1, error="the step failed"))
        stream.posted += 1  # an event sent by the loop has not arrived: nothing may overtake it
        assert not await from_engine(stream, token("a", 1))
        stream.landed += 1
        wire.open = False  # the loop could not write "a": it is kept, and what follows waits behind it
        stream.deliver(token("a", 1))
        # (asked before the loop runs again: once the task has sent "a" the way is clear)
        assert not stream.take_direct(token("b", 2)) and stream.completion_tokens == 1
        stream.deliver(token("b", 2))
        await asyncio.sleep(0)  # the task sends what was kept and waits again
        wire.open = True
        assert await from_engine(stream, token("c", 3))
        stream.deliver(token("d", 4, FinishReason.STOP))

    pushed = run(steps, wire=Wire(), socket=Socket())
    assert pushed.socket is not None and [data for data, _ in pushed.socket.written] == [data("0:c")]
    assert pushed.sent == [data("open"), data("0:a") + data("0:b"), data("0:d") + data("close") + DONE]


def test_a_chunker_failing_or_stopping_on_the_engine_s_thread_ends_the_response_from_the_loop() -> None:
    async def failing(pushed: Run) -> None:
        assert await from_engine(pushed.streams[0], token("a", 1))
        assert await from_engine(pushed.streams[0], token("boom", 2))  # taken: the loop ends it
        assert not await from_engine(pushed.streams[0], token("c", 3))

    pushed = run(failing, socket=Socket(), chunker=Pieces(fail_on="boom"))
    assert pushed.sent[-1].endswith(DONE) and pushed.errors == ["engine_error"]
    error = json.loads(pushed.sent[-1].removesuffix(DONE).removeprefix(b"data: "))["error"]
    assert error["type"] == "server_error" and "secret" not in error["message"]

    async def stopping(pushed: Run) -> None:
        assert await from_engine(pushed.streams[0], token("enough", 1))
        assert not await from_engine(pushed.streams[0], token("c", 2))

    pushed = run(stopping, socket=Socket(), chunker=Pieces(stop_on="enough"))
    assert pushed.socket is not None and pushed.socket.written == []
    assert pushed.sent == [data("open"), data("0:enough") + data("close") + DONE]
    assert pushed.closed == ["r0"] and not pushed.streams[0].done  # closed before its end: aborted


def test_after_the_body_ends_the_engine_s_thread_writes_nothing() -> None:
    pushed = Run(1, socket=Socket())

    async def main() -> None:
        task = asyncio.ensure_future(pushed.send_all())
        await asyncio.sleep(0)
        task.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await from_engine(pushed.streams[0], token("a", 1))

    asyncio.run(main())
    assert pushed.socket is not None and pushed.socket.closed and pushed.socket.written == []
