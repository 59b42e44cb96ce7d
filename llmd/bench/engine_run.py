"""`llmd bench --in-process MODEL --method engine`: llmd's engine with nothing in front of it.

The daemon's engine as it serves (the worker thread, its scheduler and continuous batching, the
event loop the worker delivers each step's events to, each stream's sink) is started in this
process and sent the HTTP bench's plan: C clients, started together, each submitting R chat
prompts back to back, distinct unless `--shared-prompt`. Each token event is timed where the
API's response would frame and write it (a token on the worker's thread, the end on the loop's),
so against `--base-url` on a daemon of the same model and profile it splits what a stream costs:
the engine's scheduling here, HTTP's framing, writes and client there; against `--method runner`
the engine's own cost over the bare step loop.

The model side (torch, transformers) is imported only when the engine starts.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmd.bench.http import BenchError
from llmd.bench.prompts import PromptFactory, calibrate_words
from llmd.bench.results import StreamResult
from llmd.config import load_profile
from llmd.engine.types import SamplingParams, TemplateOptions, TokenEvent
from llmd.errors import LlmdError
from llmd.preflight.plan import effective_context
from llmd.preflight.shape import read_model_shape

if TYPE_CHECKING:
    from llmd.engine.client import EngineClient

READY_TIMEOUT = 3600.0  # seconds to load and warm up (max-autotune compiles for minutes)


class EngineRun:
    """The engine on `--in-process`'s model under `--profile`, on an event loop of its own: `start`,
    then `measure`."""

    def __init__(self, args: argparse.Namespace) -> None:
        from llmd.runtime import event_loop_factory

        self._args = args
        self._runner = asyncio.Runner(loop_factory=event_loop_factory())
        self._engine: EngineClient | None = None
        self.prompts = PromptFactory(words=1, distinct=args.distinct_prompts)
        self.prompt_tokens: int | None = None

    def __enter__(self) -> EngineRun:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._engine is not None:
                self._runner.run(self._engine.shutdown())
        finally:
            self._runner.close()

    def start(self) -> None:
        """Load the model, warm it up as the daemon does, and fit the prompts to the token target."""
        self._runner.run(self._start())

    def measure(self, concurrency: int, requests: int) -> list[StreamResult]:
        """One run of the plan: `concurrency` clients, `requests` streams each (started apart by
        `--stagger-ms`)."""
        return self._runner.run(self._measure(concurrency, requests))

    async def _start(self) -> None:
        from llmd.engine.client import EngineClient
        from llmd.engine.worker import EngineWorker

        model, profile = self._args.in_process, load_profile(self._args.profile)
        context = effective_context(read_model_shape(model), profile)  # as the daemon's plan has it
        engine = EngineClient(EngineWorker(model, profile), context)
        self._engine = engine
        await engine.start()
        failed = engine.failed
        assert failed is not None
        ready = asyncio.ensure_future(engine.ready.wait())
        waiters: set[asyncio.Future[Any]] = {ready, failed}
        await asyncio.wait(waiters, timeout=READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if failed.done():
            ready.cancel()
            raise BenchError(f"the engine failed to start: {failed.result()}")
        if not ready.done():
            ready.cancel()
            raise BenchError(f"the engine was not ready within {READY_TIMEOUT:.0f} s")

        async def measure(words: int) -> int:
            self.prompts.words = words
            return len(await self._encode(self.prompts.next()))

        self.prompts.words, self.prompt_tokens, _ = await calibrate_words(self._args.prompt_tokens, measure)

    async def _encode(self, prompt: str) -> list[int]:
        assert self._engine is not None
        return await self._engine.encode_chat([{"role": "user", "content": prompt}], TemplateOptions())

    async def _measure(self, concurrency: int, requests: int) -> list[StreamResult]:
        stagger_s = self._args.stagger_ms / 1000

        async def client(index: int) -> list[StreamResult]:
            await asyncio.sleep(stagger_s * index)
            return [await self._stream(self.prompts.next()) for _ in range(requests)]

        per_client = await asyncio.gather(*(client(index) for index in range(concurrency)))
        return [result for results in per_client for result in results]

    async def _stream(self, prompt: str) -> StreamResult:
        """One request, timed as the API sees it: from before its prompt is templated to each
        token event handed to its sink."""
        assert self._engine is not None
        args = self._args
        result = StreamResult(sent=time.perf_counter())
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def sink(item: TokenEvent | LlmdError) -> None:
            now = time.perf_counter()
            if isinstance(item, LlmdError):
                result.error = f"{type(item).__name__}: {item}"
            else:
                if item.text:
                    result.chunk_times.append(now)
                result.completion_tokens = item.completion_tokens
                if item.finish_reason is None:
                    return
                result.finish_reason, result.finished, result.done = str(item.finish_reason), now, True
            if not ended.done():
                ended.set_result(None)

        def direct(item: TokenEvent, account: Callable[[TokenEvent], object]) -> bool:
            """A token on the worker's thread, where the API's response writes it to its socket."""
            account(item)
            sink(item)
            return True

        try:
            prompt_ids = await self._encode(prompt)
            result.prompt_tokens = len(prompt_ids)
            budget = self._engine.check_context(len(prompt_ids), args.max_tokens)
            params = SamplingParams(max_tokens=budget, temperature=args.temperature,
                                    ignore_eos=args.ignore_eos)
            with self._engine.submit(prompt_ids, params) as stream:
                stream.listen(sink, direct)
                async with asyncio.timeout(args.timeout):
                    await ended
        except (LlmdError, TimeoutError) as exc:  # refused, or too slow: this request's error
            result.error = result.error or f"{type(exc).__name__}: {exc}"
        return result
