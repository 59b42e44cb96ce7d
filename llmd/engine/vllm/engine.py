"""llmd's `Engine` over vLLM's `AsyncLLM`: the scale-out engine (issue 18), tested with a typed fake.

Everything but generating is llmd's and the same code as the native engine (`EngineFront`):
prompts are encoded with llmd's tokenizer and chat templates, the context is checked against the
`max_model_len` vLLM serves, grammars are validated by llmd, admission is bounded by the profile.
Each admitted choice is one vLLM request (token ids in, DELTA outputs out, seed `seed + i`), read
by a task that turns its outputs into llmd's events one per token through llmd's detokenizer and
finish rule (`deltas.token_events`). A stream closed early cancels that task and aborts the
request in vLLM, so a vanished client frees its place.

Errors: a request vLLM refuses ends its stream with `InvalidRequest` (400); any other failure of
one request with `EngineFailure` (500). A dead vLLM engine (`EngineDeadError`, `errored`, or a
failed `check_health`) sets `failed`, which stops the daemon (exit 1: systemd restarts it), and
ends every open request with `ShuttingDown` (503). The health probe, run every `health_seconds`,
stamps `heartbeat` like the native worker's steps, so the systemd watchdog withholds its pings
from an engine whose probe hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import psutil

from llmd.config import Profile
from llmd.engine.detokenizer import OutputText
from llmd.engine.front import EngineFront
from llmd.engine.heartbeat import Heartbeat
from llmd.engine.prompts import PromptTokenizer
from llmd.engine.stream import GenerationStream
from llmd.engine.token_bytes import prompt_logprobs
from llmd.engine.types import EngineStats, SamplingParams, TokenLogprobs
from llmd.engine.vllm.counters import RequestCounters
from llmd.engine.vllm.deltas import PromptScorer, ScoredToken, Scorer, prompt_raw_scores, token_events
from llmd.engine.vllm.llm import VllmLaunch
from llmd.engine.vllm.sampling import request_kwargs
from llmd.engine.vllm.vocabulary import check_vocabularies, llmd_vocabulary, vllm_vocabulary
from llmd.errors import EngineFailure, InvalidRequest, LlmdError, ShuttingDown

log = logging.getLogger("llmd.engine.vllm")
HEALTH_SECONDS = 5.0  # between `check_health` probes (the watchdog's stall limit is minutes)
STOP_POLL_SECONDS = 0.5  # a stop during vLLM's start: between passes over the processes it spawned
DEAD = "the vLLM engine has died; the server is restarting"


def stop_child_processes() -> int:
    """SIGTERM to every process this one has spawned, and theirs: vLLM's engine core, its workers and
    multiprocessing's helpers (llmd starts no other process). Returns how many were told."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    return len(children)


class VllmEngine(EngineFront):
    """Serves requests on vLLM's AsyncLLM, started by `launch` (in a thread) after llmd's tokenizer."""

    def __init__(self, launch: Callable[[], VllmLaunch], load_tokenizer: Callable[[], PromptTokenizer],
                 profile: Profile, max_context: int, health_seconds: float = HEALTH_SECONDS,
                 stop_processes: Callable[[], int] = stop_child_processes) -> None:
        """`launch` builds the AsyncLLM (blocking: minutes on a large model); `load_tokenizer` llmd's
        `ChatTokenizer` for the same model; `max_context` until vLLM says what it serves;
        `stop_processes` ends the processes a start has spawned so far (a stop during the start)."""
        super().__init__(profile, max_context)
        self._launch_vllm = launch
        self._load_tokenizer = load_tokenizer
        self._health_seconds = health_seconds
        self._stop_processes = stop_processes
        self._stopping = False  # shutdown was asked for: a start still going is cut short
        self._vllm: VllmLaunch | None = None
        self._starting: asyncio.Task[None] | None = None
        self._pumps: dict[str, asyncio.Task[None]] = {}  # by request id, until vLLM's outputs end
        self._producing: set[str] = set()  # requests vLLM has begun to answer
        self._tasks: set[asyncio.Task[Any]] = set()  # the health watch and aborts, held until done
        self._launch_seconds = 0.0
        self.heartbeat = Heartbeat()
        self.counters = RequestCounters()
        self.observers.append(self.counters.observe)

    async def start(self) -> None:
        """Load llmd's tokenizer, then start vLLM in a thread; returns at once (see `ready`, `failed`)."""
        self._attach_loop()
        self._tokenizer = await asyncio.to_thread(self._load_tokenizer)
        self._starting = asyncio.get_running_loop().create_task(self._launch())

    async def _launch(self) -> None:
        for listener in self.phase_listeners:
            listener("starting the vLLM engine")
        started = time.monotonic()
        try:
            self._vllm = await asyncio.to_thread(self._launch_vllm)
            if self._stopping:  # the start outran the stop: shut down what it started
                return
            self._adopt(self._vllm)
        except Exception as exc:
            if self._stopping:
                log.info("vLLM's start was cut short by the stop (%s)", type(exc).__name__)
            else:
                self._set_failed(exc)
            return
        self._launch_seconds = time.monotonic() - started
        self._spawn(self._watch_health())
        self.ready.set()

    def _adopt(self, launched: VllmLaunch) -> None:
        """Check vLLM's tokenizer against llmd's (`ConfigError` when they differ); take its context."""
        assert self._tokenizer is not None
        check_vocabularies(llmd_vocabulary(self._tokenizer), vllm_vocabulary(launched.llm.get_tokenizer()))
        self.max_context = launched.llm.model_config.max_model_len

    async def shutdown(self) -> None:
        """Stop probing and shut vLLM down (`AsyncLLM.shutdown`: its processes). A start still going
        (loading a large model takes minutes) is cut short: the processes it has spawned are
        stopped, so that vLLM's start fails at once, every `STOP_POLL_SECONDS` until the start
        thread returns (a process spawned after one pass is caught by the next)."""
        self._close_grammars()
        self._stopping = True
        told = False
        while self._starting is not None and not self._starting.done():
            if self._stop_processes() and not told:
                log.info("stopping vLLM's start: its processes are told to stop")
                told = True
            await asyncio.wait([self._starting], timeout=STOP_POLL_SECONDS)
        for task in [*self._tasks, *self._pumps.values()]:
            task.cancel()
        if self._vllm is not None:
            await asyncio.to_thread(self._vllm.llm.shutdown)

    @property
    def vocab_size(self) -> int | None:
        """The model's logits width as vLLM loaded it."""
        return None if self._vllm is None else self._vllm.llm.model_config.get_vocab_size()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids vLLM ends a request at (its tokenizer's and the generation config's)."""
        return super().eos_token_ids if self._vllm is None else self._vllm.eos_token_ids

    def _start(self, prompt_ids: list[int], choices: list[SamplingParams]) -> list[GenerationStream]:
        """A vLLM request per choice, each read by its own task into its stream."""
        launched = self._running()
        built = [self._vllm_params(launched, params) for params in choices]
        streams = [self._open(len(prompt_ids), params.max_tokens) for params in choices]
        for stream, params, sampling in zip(streams, choices, built, strict=True):
            self._pump(stream, self._generate(launched, stream, prompt_ids, params, sampling))
        return streams

    def _vllm_params(self, launched: VllmLaunch, params: SamplingParams) -> Any:
        """vLLM's SamplingParams for a choice; a refusal is raised as the request's 400."""
        try:
            return launched.sampling(request_kwargs(params))
        except launched.invalid_errors as exc:
            raise InvalidRequest(f"vLLM refused the request: {exc}") from None

    def _pump(self, stream: GenerationStream, generating: Coroutine[Any, Any, None]) -> None:
        request_id = stream.request_id
        task = asyncio.get_running_loop().create_task(generating)
        self._pumps[request_id] = task
        task.add_done_callback(lambda _: self._pumps.pop(request_id, None))

    def _scorer(self, params: SamplingParams) -> Scorer | None:
        """What turns a token's scores into the API's logprobs, when the request asks for them."""
        assert self._tokenizer is not None
        return self._tokenizer.token_bytes.token_logprobs if params.logprobs is not None else None

    def _prompt_scorer(self, prompt_ids: list[int], params: SamplingParams) -> PromptScorer | None:
        """What turns vLLM's prompt positions into the API's prompt logprobs, when asked for, as the
        native engine makes them (`prompt_logprobs`)."""
        assert self._tokenizer is not None
        if params.prompt_logprobs is None:
            return None
        pieces, top = self._tokenizer.token_bytes, params.prompt_logprobs

        def score(positions: Sequence[Mapping[int, ScoredToken] | None]) -> tuple[TokenLogprobs, ...]:
            return prompt_logprobs(pieces, prompt_ids, prompt_raw_scores(prompt_ids, positions, top))

        return score

    async def _generate(self, launched: VllmLaunch, stream: GenerationStream, prompt_ids: list[int],
                        params: SamplingParams, sampling: Any) -> None:
        """vLLM's outputs for one request as events into its stream, or the error that ended it."""
        assert self._tokenizer is not None
        request_id = stream.request_id
        output = OutputText(self._tokenizer, prompt_ids, params.stop)
        try:
            outputs = launched.llm.generate({"prompt_token_ids": prompt_ids}, sampling, request_id)
            async with contextlib.aclosing(outputs):
                events = token_events(outputs, output, params, launched.eos_token_ids,
                                      lambda: self._abort_in_vllm(request_id), self._scorer(params),
                                      self._prompt_scorer(prompt_ids, params))
                async for event in events:
                    self._producing.add(request_id)
                    stream.deliver(event)
        except Exception as exc:
            self._request_failed(launched, stream, exc)
        finally:
            self._producing.discard(request_id)

    def _request_failed(self, launched: VllmLaunch, stream: GenerationStream, exc: Exception) -> None:
        if isinstance(exc, launched.dead_errors) or launched.llm.errored:
            self._died(exc)  # every open stream ends, this one too
            return
        error: LlmdError
        if isinstance(exc, launched.invalid_errors):
            error = InvalidRequest(f"vLLM refused the request: {exc}")
        else:
            log.error("request %s failed in vLLM: %s: %s", stream.request_id, type(exc).__name__, exc)
            error = EngineFailure(f"generation failed in the vLLM engine ({type(exc).__name__})")
        stream.fail(error)

    def _abort(self, request_id: str) -> None:
        """Cancel the request's reader and abort it in vLLM (unless vLLM is dead)."""
        pump = self._pumps.pop(request_id, None)
        if pump is not None:
            pump.cancel()
        if self._vllm is not None and not self._dead():
            self._spawn(self._abort_in_vllm(request_id))

    async def _abort_in_vllm(self, request_id: str) -> None:
        try:
            await self._running().llm.abort(request_id)
        except Exception as exc:  # a failing abort must not take the stream or the loop down
            log.warning("aborting %s in vLLM failed: %s: %s", request_id, type(exc).__name__, exc)

    async def _watch_health(self) -> None:
        while await self.check_health():
            await asyncio.sleep(self._health_seconds)

    async def check_health(self) -> bool:
        """One probe of vLLM (`AsyncLLM.check_health`), stamped on `heartbeat`; False (and the engine
        failed) when it raises."""
        self.heartbeat.step_started()
        try:
            await self._running().llm.check_health()
        except Exception as exc:
            self._died(exc)
            return False
        finally:
            self.heartbeat.step_finished()
        return True

    def _died(self, exc: BaseException) -> None:
        """vLLM's engine is dead: fail the engine (the daemon exits for systemd to restart it), refuse
        new requests, and end the open ones with a 503."""
        if self._dead():
            return
        log.error("the vLLM engine died: %s: %s", type(exc).__name__, exc)
        self._set_failed(exc)
        self.draining = True
        for stream in list(self._streams.values()):
            stream.fail(ShuttingDown(DEAD))

    def _set_failed(self, exc: BaseException) -> None:
        assert self.failed is not None, "start() first"
        if not self.failed.done():
            self.failed.set_result(exc)

    def _dead(self) -> bool:
        return self.failed is not None and self.failed.done()

    def _running(self) -> VllmLaunch:
        assert self._vllm is not None, "ready first"
        return self._vllm

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _step_seconds(self) -> float | None:
        return self.counters.pace.seconds

    def stats(self) -> EngineStats:
        """llmd's own counts (open requests vLLM is producing, running, and not yet, waiting; totals),
        and what vLLM's scheduler reports (steps, preemptions, KV cache use)."""
        producing = sum(request_id in self._producing for request_id in self._pumps)
        scheduler = self._vllm.scheduler if self._vllm is not None else None
        return self.counters.stats(producing, len(self._pumps) - producing, scheduler)

    def alive(self) -> bool:
        """False once the engine has failed (vLLM dead, or it never started)."""
        return not self._dead()

    def gpu_memory(self) -> tuple[int, int] | None:
        """None: vLLM's workers hold the GPUs, in other processes."""
        return None

    @property
    def device_bytes(self) -> int:
        """0: llmd does not measure vLLM's workers (their memory is preflight's per-GPU plan)."""
        return 0

    @property
    def startup_seconds(self) -> tuple[float, float]:
        """Seconds vLLM took to start (load, profile, compile, capture; vLLM's own log has the parts), 0."""
        return self._launch_seconds, 0.0

