"""Pushed SSE (llmd/api/sse.py `PushedEvents`): events framed in the callback that delivers them,
written straight to the connection while the response's task waits, kept and sent by the task
otherwise, in order; errors end the response with one event and `[DONE]`; leaving closes all."""

from __future__ import annotations

import asyncio
import json
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


class Run:
    """A pushed response over `n` real streams; `sent` is what its task sent (ASGI's writes)."""

    def __init__(self, n: int = 1, wire: Wire | None = None, chunker: Pieces | None = None) -> None:
        self.closed: list[str] = []
        self.streams = [GenerationStream(self._closed, f"r{i}", 4, 16) for i in range(n)]
        self.errors: list[str] = []
        self.wire = wire
        write = wire.write if wire else None
        self.pushed = PushedEvents(self.streams, chunker or Pieces(), OPENAI_EVENTS, write,
                                   self.errors.append)
        self.sent: list[bytes] = []

    def _closed(self, stream: GenerationStream) -> None:
        self.closed.append(stream.request_id)

    async def send_all(self) -> None:
        async for chunk in self.pushed.body():
            self.sent.append(chunk)


def run(steps: Callable[[Run], Awaitable[None]], n: int = 1, wire: Wire | None = None,
        chunker: Pieces | None = None) -> Run:
    """Start the response's task, then drive `steps`; returns once the body has ended."""
    pushed = Run(n, wire, chunker)

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
