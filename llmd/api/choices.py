"""A request's choices, read side by side: `n` chat choices, `n` or `best_of` per completions prompt.

Each choice is its own engine stream. Streamed, their events are merged as they come, each tagged
with its choice's index; not streamed, each is collected whole (`Generated`), and a failing one
stops the reading of all. Either way every stream is left on the way out, so an unfinished one
is aborted (a vanished client frees every slot it held).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from litestar import Request

from llmd.api.logprobs import Scored
from llmd.engine.client import TokenStream
from llmd.engine.types import TokenEvent, TokenLogprobs
from llmd.errors import ClientDisconnected

T = TypeVar("T")


@dataclass(slots=True)
class Generated:
    """One choice's whole output: text, finish reason and, when asked, the logprobs it carried.

    `scored` (None unless logprobs were asked) holds each sampled token's logprobs and where its
    text starts in `text`; `prompt` the prompt's logprobs, when those were asked.
    """

    parts: list[str] = field(default_factory=list)
    finish_reason: str = "stop"
    scored: list[Scored] | None = None
    prompt: tuple[TokenLogprobs, ...] | None = None
    length: int = 0  # characters of text so far

    @property
    def text(self) -> str:
        """The choice's generated text."""
        return "".join(self.parts)

    @property
    def sampled_logprob(self) -> float:
        """The sum of the sampled tokens' logprobs (`best_of`'s ranking); 0 when none were asked."""
        return sum(s.logprob for s in self.scored or ())

    def add(self, event: TokenEvent) -> None:
        """Take one event's text, finish reason and logprobs."""
        if self.scored is not None and event.logprobs is not None:
            self.scored.append(Scored(self.length, event.logprobs.chosen.text, event.logprobs))
        if event.prompt_logprobs is not None:
            self.prompt = event.prompt_logprobs
        self.parts.append(event.text)
        self.length += len(event.text)
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason.value


async def collect(stream: TokenStream, logprobs: bool) -> Generated:
    """All of a stream's output; its logprobs kept only when `logprobs`."""
    generated = Generated(scored=[] if logprobs else None)
    async for event in stream:
        generated.add(event)
    return generated


async def collect_all(streams: Sequence[TokenStream], logprobs: bool) -> list[Generated]:
    """Every stream's output, read side by side; one failing stops the others' reading."""
    readers = [asyncio.ensure_future(collect(stream, logprobs)) for stream in streams]
    try:
        return list(await asyncio.gather(*readers))
    finally:
        for reader in readers:
            reader.cancel()


async def merged_events(streams: Sequence[TokenStream]) -> AsyncIterator[tuple[int, TokenEvent]]:
    """Every stream's events tagged with its index, as they come (one stream: read directly).

    Events that are ready together come in index order.
    """
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


@contextlib.contextmanager
def closing_all(streams: Sequence[TokenStream]) -> Iterator[None]:
    """Leave every stream on the way out: one that has not finished is aborted."""
    with contextlib.ExitStack() as stack:
        for stream in streams:
            stack.enter_context(stream)
        yield


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


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has closed the connection."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
