"""Prometheus metrics of one daemon, in its own registry (tests build as many as they like).

The engine client reports each stream as it closes (`observe_stream`), the API layer each
error response and each in-stream error event (`observe_error`). Gauges that mirror the
engine (running, waiting, prefix cache, preemptions and KV cache use, GPU memory) are read at
scrape time from callbacks the daemon supplies, so the hot path never updates them.
No torch here: GPU memory comes from a callback, and only on CUDA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmd.engine.types import EngineStats

log = logging.getLogger("llmd.metrics")

# Time to first token: queueing plus one prefill; tens of ms on a GPU, seconds for a long
# prompt on a CPU or behind a queue.
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                       10.0, 20.0, 60.0)
# Between two tokens of one stream: one decode step, 5-50 ms on a GPU, up to ~1 s on a CPU.
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                     0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
# Whole requests: a short answer in a fraction of a second to long generations in minutes.
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Admission queue: zero when a slot is free, else the time until one frees.
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# `llmd_requests_total{finish_reason}`: stop and length as OpenAI names them, `disconnected` when
# the client left first, `error` when the engine failed the request. Created at zero up front.
FINISH_REASONS = ("stop", "length", "disconnected", "error")


class ClosedStream(Protocol):
    """What `observe_stream` reads of a finished `GenerationStream` (monotonic stamps)."""

    @property
    def started(self) -> float: ...

    @property
    def first_token_at(self) -> float | None: ...

    @property
    def queued_seconds(self) -> float | None: ...

    @property
    def token_gaps(self) -> Sequence[float]: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def outcome(self) -> str: ...


EngineStatsSource = Callable[[], EngineStats]
# (used_bytes, total_bytes) of the serving GPU, or None when there is none (CPU profile). It runs on
# the scrape's thread: read host-side numbers (torch.cuda.memory_reserved(), a total noted at load),
# never a call that waits on the device.
GpuMemorySource = Callable[[], tuple[int, int] | None]
T = TypeVar("T")


class Metrics:
    """Every llmd metric, registered in `registry` (a fresh one unless given)."""

    def __init__(self, engine_stats: EngineStatsSource | None = None,
                 gpu_memory: GpuMemorySource | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        self.first_token = Histogram(
            "llmd_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first generated token (queue wait plus prefill).",
            buckets=FIRST_TOKEN_BUCKETS, registry=r)
        self.token_gap = Histogram(
            "llmd_inter_token_latency_seconds",
            "Seconds between two consecutive tokens delivered to one stream.",
            buckets=TOKEN_GAP_BUCKETS, registry=r)
        self.request_duration = Histogram(
            "llmd_request_duration_seconds",
            "Seconds from a request's arrival to its last token or its end, whatever the finish reason.",
            buckets=REQUEST_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "llmd_queue_wait_seconds",
            "Seconds a request waited in the admission queue before the engine began its prefill.",
            buckets=QUEUE_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "llmd_prompt_tokens_total", "Prompt tokens of finished requests (including reused prefixes).",
            registry=r)
        self.completion_tokens = Counter(
            "llmd_completion_tokens_total",
            "Tokens generated for finished requests, whatever the finish reason.", registry=r)
        self.requests = Counter(
            "llmd_requests_total",
            "Generation requests that ended, by finish_reason: stop, length, disconnected, error.",
            ["finish_reason"], registry=r)
        self.errors = Counter(
            "llmd_errors_total",
            "Error responses and in-stream error events, by type (the OpenAI error code, e.g. overloaded).",
            ["type"], registry=r)
        self.model_load = Gauge(
            "llmd_model_load_seconds", "Seconds the model load took (weights onto the device).", registry=r)
        self.warmup = Gauge(
            "llmd_warmup_seconds", "Seconds the warm-up took (including compilation).", registry=r)
        for reason in FINISH_REASONS:
            self.requests.labels(reason)
        self.engine = EngineCollector(engine_stats, gpu_memory)
        r.register(self.engine)

    def attach(self, engine_stats: EngineStatsSource | None,
               gpu_memory: GpuMemorySource | None = None) -> None:
        """Set the scrape-time sources once the engine exists (the metrics may be built first)."""
        self.engine.engine_stats = engine_stats
        self.engine.gpu_memory = gpu_memory

    def observe_stream(self, stream: ClosedStream, now: float | None = None) -> None:
        """Everything one closed stream measured: first token, gaps, duration, tokens, outcome.

        Fits `EngineClient.observers` (called as each stream closes); `now` is its close time
        on the `time.monotonic` clock the stream's stamps use.
        """
        if stream.queued_seconds is not None:
            self.observe_queue_wait(stream.queued_seconds)
        if stream.first_token_at is not None:
            self.observe_first_token(stream.first_token_at - stream.started)
        for gap in stream.token_gaps:
            self.observe_token_gap(gap)
        ended = time.monotonic() if now is None else now
        self.observe_finish(stream.outcome, ended - stream.started, stream.prompt_tokens,
                            stream.completion_tokens)

    def observe_queue_wait(self, seconds: float) -> None:
        """A request left the admission queue after `seconds`."""
        self.queue_wait.observe(seconds)

    def observe_first_token(self, seconds: float) -> None:
        """A request's first token arrived `seconds` after the request."""
        self.first_token.observe(seconds)

    def observe_token_gap(self, seconds: float) -> None:
        """A stream's next token arrived `seconds` after its previous one."""
        self.token_gap.observe(seconds)

    def observe_finish(self, finish_reason: str, duration_seconds: float, prompt_tokens: int,
                       completion_tokens: int) -> None:
        """A generation request ended: its reason, its end-to-end time and its token counts."""
        self.requests.labels(finish_reason).inc()
        self.request_duration.observe(duration_seconds)
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)

    def observe_error(self, error_type: str) -> None:
        """One error response or in-stream error event, labelled by its OpenAI code or type."""
        self.errors.labels(error_type).inc()

    def set_startup(self, load_seconds: float, warmup_seconds: float) -> None:
        """How long the model took to load and to warm up."""
        self.model_load.set(load_seconds)
        self.warmup.set(warmup_seconds)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition body and its content type (text 0.0.4 unless `accept` asks for OpenMetrics)."""
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type


class EngineCollector:
    """Scrape-time metrics read from the engine's stats and the GPU; an absent source gives no sample."""

    def __init__(self, engine_stats: EngineStatsSource | None, gpu_memory: GpuMemorySource | None) -> None:
        self.engine_stats = engine_stats
        self.gpu_memory = gpu_memory

    def describe(self) -> Iterable[Metric]:
        """The families this collector owns (lets the registry refuse duplicate names)."""
        return list(self._families(None, None))

    def collect(self) -> Iterable[Metric]:
        """Current values; a failing source is logged and skipped, never fails the scrape."""
        return list(self._families(self._read(self.engine_stats), self._read(self.gpu_memory)))

    def _families(self, stats: EngineStats | None, memory: tuple[int, int] | None) -> Iterator[Metric]:
        yield _gauge("llmd_requests_running", "Requests the engine is prefilling or decoding now.",
                     stats.running if stats else None)
        yield _gauge("llmd_requests_waiting", "Requests admitted and waiting for a running slot.",
                     stats.waiting if stats else None)
        yield _counter("llmd_prefix_cache_hits_total", "Requests that reused a cached prompt prefix.",
                       stats.prefix_hits if stats else None)
        yield _counter("llmd_prefix_cache_tokens_reused_total",
                       "Prompt tokens taken from the prefix cache instead of being recomputed.",
                       stats.prefix_tokens_reused if stats else None)
        yield _counter("llmd_preemptions_total",
                       "Running requests the engine took back to free KV cache room (vLLM engine; the "
                       "native engine admits only what fits and never preempts).",
                       stats.preemptions if stats else None)
        yield _gauge("llmd_kv_cache_usage_ratio",
                     "Share of the KV cache's blocks in use, 0-1, as vLLM's scheduler reports it (vLLM "
                     "engine only: the native engine's caches are per request, sized by preflight).",
                     stats.kv_cache_usage if stats else None)
        yield _gauge("llmd_prefill_chunk_tokens",
                     "Prompt tokens a step may prefill beside decoding streams now: the profile's "
                     "prefill_chunk_tokens, fewer where a prompt token costs the streams more (native "
                     "engine only).",
                     stats.prefill_chunk_tokens if stats else None)
        yield _counter("llmd_engine_steps_total",
                       "Steps the engine ran: one forward pass each, a token for every decoding stream "
                       "and any prompt chunk beside them.", stats.steps if stats else None)
        yield _counter("llmd_engine_step_seconds_total",
                       "Seconds of engine steps, scheduled to delivered: the forward pass, then "
                       "detokenizing and handing each token to its stream (native engine only).",
                       stats.step_seconds if stats else None)
        yield _counter("llmd_engine_forward_seconds_total",
                       "The part of llmd_engine_step_seconds_total in forward passes and sampling; the "
                       "rest is what serving the tokens costs the worker (native engine only).",
                       stats.forward_seconds if stats else None)
        yield _gauge("llmd_gpu_memory_used_bytes",
                     "GPU memory llmd holds on the serving device (CUDA allocator reserved; CUDA only).",
                     memory[0] if memory else None)
        yield _gauge("llmd_gpu_memory_total_bytes", "Total memory of the serving GPU (CUDA only).",
                     memory[1] if memory else None)

    @staticmethod
    def _read(source: Callable[[], T | None] | None) -> T | None:
        if source is None:
            return None
        try:
            return source()
        except Exception:
            log.exception("metrics source %r failed; its metrics are left out of this scrape", source)
            return None


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    """A gauge family; with no value it has no sample (the name is only described)."""
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float | None) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)
