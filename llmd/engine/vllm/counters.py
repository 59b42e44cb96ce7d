"""The vLLM engine's counters, from what llmd itself sees of its requests (vLLM's own scheduler
stats stay vLLM's): how each closed stream ended, the tokens it got, the prefix-cache hits vLLM
reported on it, and the pace of its tokens (for Retry-After)."""

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

    def stats(self, running: int, waiting: int) -> EngineStats:
        """A snapshot; `running` and `waiting` are the open requests vLLM is and is not yet producing.
        llmd counts no steps of vLLM's (0)."""
        return EngineStats(steps=0, running=running, waiting=waiting, finished=self.finished,
                           aborted=self.aborted, generated_tokens=self.generated_tokens,
                           prefix_hits=self.prefix_hits, prefix_tokens_reused=self.prefix_tokens_reused)
