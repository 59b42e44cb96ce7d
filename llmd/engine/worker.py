"""The one thread that touches the model: admit, prefill, decode, detokenize, deliver.

Everything model-side happens here, in a loop of steps. Other threads only hand in
requests and aborts through `submit`/`abort`; results leave through `deliver`, called
once per step with every request's event of that step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmd.config import Profile
from llmd.engine.burst import BurstGate, gather_wait
from llmd.engine.detokenizer import OutputText
from llmd.engine.finish import next_text
from llmd.engine.heartbeat import Heartbeat
from llmd.engine.retry_after import StepPace
from llmd.engine.scheduler import Scheduler
from llmd.engine.token_bytes import prompt_logprobs
from llmd.engine.types import (
    EngineStats,
    Request,
    RowFailure,
    Sampled,
    SamplingParams,
    StepResult,
    TokenEvent,
    TokenLogprobs,
)
from llmd.units import mib

if TYPE_CHECKING:
    from llmd.engine.model.runner import ModelRunner
    from llmd.engine.tokenizer import ChatTokenizer

log = logging.getLogger("llmd.engine")

PromptLogprobs = tuple[TokenLogprobs, ...]
Delivery = Callable[[list[tuple[str, TokenEvent]]], None]
WARMUP_TOKENS = 4


def unheard(*args: object) -> None:
    """Where the worker reports until a listener attaches (`EngineClient` replaces the hooks)."""


@dataclass(slots=True)
class WorkerHooks:
    """How the worker reports back: per-step events, readiness, and a fatal load error."""

    deliver: Delivery = unheard
    on_ready: Callable[[], None] = unheard
    on_fatal: Callable[[BaseException], None] = unheard
    on_phase: Callable[[str], None] | None = None  # start-up phases, e.g. for systemd STATUS


class EngineWorker:
    """Runs the step loop on its own thread; thread-safe `submit`, `abort`, `stop`."""

    def __init__(self, model_dir: str | Path, profile: Profile, hooks: WorkerHooks | None = None) -> None:
        self.model_dir = model_dir
        self.profile = profile
        self.hooks = hooks if hooks is not None else WorkerHooks()
        self.scheduler = Scheduler(profile.max_running, profile.prefill_chunk_tokens, profile.max_step_tokens,
                                   profile.lone_prefill_tokens)
        self._inbox: deque[Request | str] = deque()
        self._wakeup = threading.Condition()
        self._arriving = 0  # requests being read or tokenized that will be submitted next
        self.burst = BurstGate(profile.burst_window_ms / 1000)  # when an idle wake gathers a burst
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llmd-worker", daemon=True)
        self._outputs: dict[str, OutputText] = {}
        self.steps = self.generated_tokens = self.finished = self.aborted = 0
        self.load_seconds = self.warmup_seconds = self.compile_seconds = 0.0
        # Seconds in steps, and in their forward passes (sampling included): what a step costs
        # beyond its forward pass (scheduling, detokenizing, framing and writing tokens) is the
        # difference, the serving share the metrics show.
        self.step_seconds = self.forward_seconds = 0.0
        # The systemd watchdog's view of this thread: a step that never ends stops the pings.
        self.heartbeat = Heartbeat()
        self.pace = StepPace()  # recent decode step time, read by the client for Retry-After
        self.runner: ModelRunner | None = None
        self.tokenizer: ChatTokenizer | None = None
        self.eos_token_ids: frozenset[int] = frozenset()

    def start(self) -> None:
        """Start the thread: load, warm up, then serve steps until `stop`."""
        self._thread.start()

    def submit(self, request: Request) -> None:
        """Hand a request to the worker (any thread)."""
        self._post(request)

    def arriving(self, change: int) -> None:
        """Count a request on its way here (+1), or one that arrived or will not (-1)."""
        with self._wakeup:
            self._arriving += change
            self._wakeup.notify()

    def abort(self, request_id: str) -> None:
        """Ask the worker to drop a request before its next step (any thread)."""
        self._post(request_id)

    def gpu_memory(self) -> tuple[int, int] | None:
        """(reserved, total) bytes of the CUDA allocator; host-side counters, no device sync."""
        return self.runner.gpu_memory() if self.runner is not None else None

    def alive(self) -> bool:
        """The thread runs (or is being stopped on purpose)."""
        return self._thread.is_alive() or self._stopping

    def stop(self, timeout: float | None = None) -> None:
        """End the step loop and wait for the thread."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> EngineStats:
        """A snapshot of the counters (read without locking; each is one int)."""
        return EngineStats(
            steps=self.steps,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            finished=self.finished,
            aborted=self.aborted,
            generated_tokens=self.generated_tokens,
            prefix_hits=self.runner.prefix_cache.hits if self.runner else 0,
            prefix_tokens_reused=self.runner.prefix_cache.reused_tokens if self.runner else 0,
            prefill_chunk_tokens=self.scheduler.pace.budget(),
            step_seconds=self.step_seconds,
            forward_seconds=self.forward_seconds,
        )

    def _post(self, item: Request | str) -> None:
        with self._wakeup:
            self._inbox.append(item)
            self._wakeup.notify()

    def _run(self) -> None:
        # The model side loads here, on the worker's own thread: importing this module
        # (the client, the API tier's fakes) stays torch-free.
        from llmd.engine.model.sdpa import sdpa_preference

        with sdpa_preference(self.profile):  # warm-up and serving alike
            self._load_then_serve()

    def _load_then_serve(self) -> None:
        try:
            self._load()
        except BaseException as exc:
            log.exception("model load failed")
            self.hooks.on_fatal(exc)
            return
        self._set_phase("serving")
        self.hooks.on_ready()
        while self._wait_for_work():
            self._step()

    def _load(self) -> None:
        from llmd.engine.model.runner import ModelRunner
        from llmd.engine.tokenizer import ChatTokenizer

        self._set_phase(f"loading the model ({self.profile.name})")
        self.runner = ModelRunner(self.model_dir, self.profile)
        self.tokenizer = ChatTokenizer(self.model_dir)
        self.eos_token_ids = self.runner.eos_token_ids | self.tokenizer.eos_token_ids
        self.runner.eos_token_ids = self.eos_token_ids  # `min_tokens` masks every EOS id, the tokenizer's too
        self.load_seconds = self.runner.load_report.seconds
        self._log_load(self.runner)
        if self.profile.warmup:
            compiling = self.profile.compile != "none" and self.profile.kv_cache == "static"
            phase = f"compiling the decode step ({self.profile.compile})" if compiling else "warming up"
            self._set_phase(phase)
            started = time.perf_counter()
            self._warm_up()
            # the compiled steps compiled while loading, with the probes: warm-up too
            fast = self.runner.fast_paths
            self.warmup_seconds = time.perf_counter() - started + fast.lone_seconds + fast.batch_seconds
            log.info("warm-up done in %.2f s", self.warmup_seconds)

    def _log_load(self, runner: ModelRunner) -> None:
        """What was loaded, where, and which fast paths proved themselves."""
        from llmd.engine.model.sdpa import attention_summary

        threads, detail = runner.threads, ""
        if threads is not None:
            detail = f"; {threads.lone_decode} threads for one stream, {threads.compute} otherwise"
        report = runner.load_report
        log.info("model loaded in %.2f s on %s: %s of weights, %s on the device%s",
                 report.seconds, report.device, mib(report.weight_bytes), mib(report.device_bytes), detail)
        if report.quantized is not None:
            log.info("linear layers: %s", report.quantized.summary())
        if report.prepack is not None:
            log.info("linear layers: %s", report.prepack.summary())
        if runner.fused:
            log.info("steps: a newcomer's prompt chunk shares the forward pass of the decoding streams")
        fast = runner.fast_paths
        if fast.direct_problem is None:
            log.info("decode steps: the model's layers called directly, not through transformers' forward")
        else:
            log.info("decode steps: transformers' forward (%s)", fast.direct_problem)
        if fast.lone_problem is None:
            tuned = ("" if fast.lone_templated is None else
                     f", {fast.lone_templated} matmuls on inductor's GEMM template, "
                     "the rest on torch's kernels")
            log.info("a lone stream's decode steps: one compiled graph (lone_step: %s, compiled and "
                     "proven in %.1f s%s)", self.profile.lone_step, fast.lone_seconds, tuned)
        elif self.profile.lone_step != "eager":
            log.info("a lone stream's decode steps: eager (%s)", fast.lone_problem)
        if fast.batch_problem is None:
            log.info("the decode steps of 2 to %d streams: one compiled graph (batch_step: compiled, "
                     "compiled and proven in %.1f s)", self.profile.max_running, fast.batch_seconds)
        elif self.profile.batch_step != "eager":
            log.info("the decode steps of 2 to %d streams: eager (%s)", self.profile.max_running,
                     fast.batch_problem)
        log.info("attention: %s", attention_summary(runner.model, self.profile))

    def _warm_up(self) -> None:
        assert self.runner is not None and self.tokenizer is not None
        if self.profile.kv_cache == "static":
            self.compile_seconds = self.runner.warm_up_decode()
            how = "eager" if self.profile.compile == "none" else f"compile: {self.profile.compile}"
            log.info("static decode step (%s) warmed up in %.2f s", how, self.compile_seconds)
        prompt = self.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
        request = Request("warmup", prompt, SamplingParams(max_tokens=WARMUP_TOKENS))
        self.runner.first_token(request)
        for _ in range(WARMUP_TOKENS):
            self.runner.decode([request])
        self.runner.release(request.request_id)

    def _set_phase(self, phase: str) -> None:
        if self.hooks.on_phase is not None:
            self.hooks.on_phase(phase)

    def _wait_for_work(self) -> bool:
        with self._wakeup:
            idle = not self.scheduler.has_work
            while not self._inbox and not self.scheduler.has_work and not self._stopping:
                self._wakeup.wait()
            if idle:
                self._gather_burst()
                self.burst.woke()
            if self._stopping:
                return False
            items = list(self._inbox)
            self._inbox.clear()
        self.burst.admitted(sum(isinstance(item, Request) for item in items))
        for item in items:
            self._admit_or_abort(item)
        return True

    def _gather_burst(self) -> None:
        """Idle until now: wait, bounded, for the rest of a burst before the first step
        (`burst.gather_wait`). Nobody is decoding yet, so no stream stalls."""
        deadline = time.monotonic() + self.burst.bound_s
        quiet = self.burst.quiet_s()
        seen = -1
        while not self._stopping:
            wait = gather_wait(deadline - time.monotonic(), self._arriving, quiet, len(self._inbox) != seen)
            if wait is None:
                return
            if self._arriving == 0:  # a quiet wait: what arrives during it is new next time
                seen = len(self._inbox)
            self._wakeup.wait(wait)

    def _admit_or_abort(self, item: Request | str) -> None:
        if isinstance(item, Request):
            assert self.tokenizer is not None and self.runner is not None
            for request in (item, *item.followers):
                self._outputs[request.request_id] = OutputText(self.tokenizer, request.prompt_ids,
                                                               request.params.stop)
            self.runner.reuse_prefix(item)
            self.scheduler.add(item)
            return
        aborted = self.scheduler.abort(item)
        if aborted is not None:
            self._abandon(aborted)
            self.aborted += 1
            self._orphan_followers(aborted)

    def _orphan_followers(self, leader: Request) -> None:
        """A leader aborted before its prefill was done takes its unforked choices with it: each
        ends with an error event (a client that abandons a group closes every stream anyway)."""
        if leader.prefill_done or not leader.followers:
            return
        message = "generation failed: the request's first choice was cancelled before its prefill"
        self.hooks.deliver([(f.request_id, self._end_with_error(f, message)) for f in leader.followers])
        leader.followers.clear()

    def _abandon(self, request: Request) -> None:
        """Release an aborted request, leaving what it prefilled in the prefix cache for those
        waiting: an editor closes a completion request to send the next keystroke's, over the
        same file."""
        assert self.runner is not None
        if self.runner.keep_prefilled(request):
            for waiting in self.scheduler.waiting:
                self.runner.reseed(waiting)
        self._release(request.request_id)

    def _step(self) -> None:
        assert self.runner is not None
        scheduled = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan.idle:
            return
        events: list[tuple[str, TokenEvent]] = []
        # Running streams get their token first; newcomers join the batch after their prefill.
        self.heartbeat.step_started()
        started = time.perf_counter()
        failed, forward = False, 0.0
        try:
            chunks = [(chunk.request, chunk.stop) for chunk in plan.prefill]
            result = self.runner.step(plan.decode, chunks)
            forward = time.perf_counter() - started
        except Exception as exc:  # one failed forward pass must not end the daemon
            log.exception("engine step failed")
            prefilling = [r for chunk in plan.prefill for r in (chunk.request, *chunk.request.followers)]
            self._fail(plan.decode + prefilling, exc, events)
            failed = True
        else:
            self._collect(plan.decode, [chunk.request for chunk in plan.prefill], result, events)
        seconds = time.perf_counter() - started
        self.heartbeat.step_finished()
        if plan.decode:  # each running stream waited this long for its token
            self.pace.observe(seconds)
        if not failed:  # what the step cost the streams, and each prompt token beside them (chunk budget)
            self.scheduler.pace.observe(seconds, len(plan.decode),
                                        sum(chunk.stop - chunk.start for chunk in plan.prefill))
        self.steps += 1
        self.hooks.deliver(events)
        # The whole first, then its part: a snapshot between the two still has forward <= whole.
        self.step_seconds += time.perf_counter() - scheduled
        self.forward_seconds += forward

    def _collect(self, decode: list[Request], prefilled: list[Request], result: StepResult,
                 events: list[tuple[str, TokenEvent]]) -> None:
        """The step's events: the decoding rows', then each completed prompt's first token and
        right after it its forked choices' (in choice order), each joining the running set."""
        forked = {follower.request_id: token for follower, token in result.forked}
        for request, token in zip(decode, result.tokens, strict=True):
            events.append((request.request_id, self._outcome(request, token, result)))
        for request, first in zip(prefilled, result.firsts, strict=True):
            if first is None:
                continue
            events.append((request.request_id, self._outcome(request, first, result)))
            followers, request.followers = request.followers, []
            for follower in followers:
                token = forked.get(follower.request_id, RowFailure("its first choice could not be sampled"))
                self.scheduler.join(follower, request)
                events.append((follower.request_id, self._outcome(follower, token, result)))

    def _outcome(self, request: Request, token: Sampled, result: StepResult) -> TokenEvent:
        """The event of one row of a step: its token, or the error that ends this request alone."""
        if isinstance(token, RowFailure):
            log.error("request %s failed: %s", request.request_id, token.message)
            return self._end_with_error(request, f"generation failed: {token.message}")
        return self._advance(request, token, result)

    def _advance(self, request: Request, token: int, result: StepResult) -> TokenEvent:
        request.output_ids.append(token)
        self.generated_tokens += 1
        step = next_text(self._outputs[request.request_id], token, len(request.output_ids),
                         request.params, self.eos_token_ids)
        text, reason = step.text, step.finish_reason
        logprobs = None if step.by_id else self._logprobs(request, result)
        if reason is not None:
            self.scheduler.finish(request, reason)
            self._outputs.pop(request.request_id, None)
            assert self.runner is not None
            self.runner.retire(request)
            self.finished += 1
        first = len(request.output_ids) == 1
        queued, cached = (request.queued_seconds, request.cached_tokens) if first else (None, None)
        return TokenEvent(text, len(request.output_ids), reason, queued_seconds=queued, cached_tokens=cached,
                          logprobs=logprobs, prompt_logprobs=self._prompt_logprobs(request, result))

    def _logprobs(self, request: Request, result: StepResult) -> TokenLogprobs | None:
        """The token's logprobs with their text, when asked (not for an id that ended the request,
        whose text is not part of the output: `_advance` asks only for the others)."""
        scores = result.scores.get(request.request_id)
        if scores is None:
            return None
        assert self.tokenizer is not None
        return self.tokenizer.token_bytes.token_logprobs(scores)

    def _prompt_logprobs(self, request: Request, result: StepResult) -> PromptLogprobs | None:
        """A scored prompt's logprobs with their text, on its first event."""
        scores = result.prompt_scores.get(request.request_id)
        if scores is None or len(request.output_ids) != 1:
            return None
        assert self.tokenizer is not None
        return prompt_logprobs(self.tokenizer.token_bytes, request.prompt_ids, scores)

    def _fail(self, requests: list[Request], exc: Exception, events: list) -> None:
        message = f"generation failed: {type(exc).__name__}: {exc}"
        for request in requests:
            events.append((request.request_id, self._end_with_error(request, message)))
        from llmd.engine.model.runner import out_of_memory

        if out_of_memory(exc):
            log.error("out of memory: lower max_running or max_context in the profile")

    def _end_with_error(self, request: Request, message: str) -> TokenEvent:
        """End a request with a failure: out of the scheduler, its slot released, its error event."""
        self.scheduler.fail(request)
        self._release(request.request_id, failed=True)
        return TokenEvent("", len(request.output_ids), error=message)

    def _release(self, request_id: str, *, failed: bool = False) -> None:
        self._outputs.pop(request_id, None)
        if self.runner is not None:
            self.runner.release(request_id, failed=failed)
