"""The vLLM engine's counters: from what llmd itself sees of its requests (how each closed stream
ended, the tokens it got, the prefix-cache hits vLLM reported on it, the pace of its tokens for
Retry-After), and from vLLM's own scheduler, as its stat loggers are handed them (`SchedulerFeed`:
the steps its engine cores ran, their KV cache use and the requests they preempted)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmd.engine.retry_after import StepPace
from llmd.engine.stream import GenerationStream
from llmd.engine.types import EngineStats


@dataclass(slots=True)
class RequestCounters:
    """Totals over closed requests; `observe` fits `EngineFront.observers`."""

    finished: int = 0  # ended by a finish reason
    aborted: int = 0  # the client left first
    generated_tokens: int = 0
    prefix_hits: int = 0  # requests vLLM served part of the prompt from its prefix cache
    prefix_tokens_reused: int = 0
    pace: StepPace = field(default_factory=StepPace)  # seconds between a stream's tokens: one vLLM step

    def observe(self, stream: GenerationStream) -> None:
        """Count a stream as it closes."""
        self.finished += stream.finish_reason is not None
        self.aborted += stream.outcome == "disconnected"
        self.generated_tokens += stream.completion_tokens
        if stream.cached_tokens:
            self.prefix_hits += 1
            self.prefix_tokens_reused += stream.cached_tokens
        if stream.token_gaps:
            self.pace.observe(sum(stream.token_gaps) / len(stream.token_gaps))

    def stats(self, running: int, waiting: int, scheduler: SchedulerFeed | None = None) -> EngineStats:
        """A snapshot; `running` and `waiting` are the open requests vLLM is and is not yet producing;
        steps, preemptions and KV cache use are what vLLM's scheduler reports (`scheduler`)."""
        feed = SchedulerFeed() if scheduler is None else scheduler
        return EngineStats(steps=feed.steps, running=running, waiting=waiting, finished=self.finished,
                           aborted=self.aborted, generated_tokens=self.generated_tokens,
                           prefix_hits=self.prefix_hits, prefix_tokens_reused=self.prefix_tokens_reused,
                           preemptions=feed.preemptions, kv_cache_usage=feed.kv_cache_usage)


@dataclass(slots=True)
class SchedulerFeed:
    """What vLLM's engine cores report: one scheduler report a step each (data parallel runs
    several), taken as they come. Fed on the event loop by the stat logger vLLM is started with
    (`launch.py`). vLLM's own `step_counter` is not a total: it counts a data-parallel wave's steps
    and is 0 otherwise, so steps are counted here."""

    steps: int = 0
    preemptions: int = 0
    usage: dict[int, float] = field(default_factory=dict)  # each engine core's last KV cache use, 0-1

    def record(self, engine: int = 0, kv_cache_usage: float = 0.0) -> None:
        """One step's scheduler report of engine core `engine`, with its KV cache use then."""
        self.steps += 1
        self.usage[engine] = kv_cache_usage

    def preempted(self, requests: int) -> None:
        """Requests an engine core preempted since its last report (vLLM's iteration stats)."""
        self.preemptions += requests

    @property
    def kv_cache_usage(self) -> float | None:
        """The engine cores' mean KV cache use (as vLLM's own logger shows it); None before any report."""
        return sum(self.usage.values()) / len(self.usage) if self.usage else None
