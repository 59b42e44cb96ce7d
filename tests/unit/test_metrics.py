"""Prometheus metrics: the per-request API, scrape-time gauges, the text as Prometheus parses it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmd.api.sse import OPENAI_EVENTS, PushedEvents, error_events
from llmd.engine.types import EngineStats, TokenEvent
from llmd.errors import ShuttingDown
from llmd.service.metrics import FINISH_REASONS, Metrics


def stats(running: int = 0, waiting: int = 0, prefix_hits: int = 0, reused: int = 0) -> EngineStats:
    return EngineStats(steps=0, running=running, waiting=waiting, finished=0, aborted=0, generated_tokens=0,
                       prefix_hits=prefix_hits, prefix_tokens_reused=reused)


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the rendered text, parsed back: (name, sorted labels) -> value."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def families(metrics: Metrics) -> dict[str, str]:
    """Family name -> type, as Prometheus reads them."""
    return {f.name: f.type for f in text_string_to_metric_families(metrics.render()[0].decode())}


@dataclass
class Stream:
    """A closed stream as `EngineClient` hands it to its observers."""

    started: float
    first_token_at: float | None
    token_gaps: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    outcome: str = "stop"
    queued_seconds: float | None = None


def test_a_closed_stream_records_first_token_gaps_and_the_whole_request() -> None:
    metrics = Metrics()
    stream = Stream(started=50.0, first_token_at=50.040, token_gaps=[0.012, 0.012, 0.012],
                    prompt_tokens=17, completion_tokens=4, queued_seconds=0.003)
    metrics.observe_stream(stream, now=50.078)
    values = scrape(metrics)
    assert values[("llmd_queue_wait_seconds_count", ())] == 1
    assert values[("llmd_queue_wait_seconds_sum", ())] == pytest.approx(0.003)
    assert values[("llmd_time_to_first_token_seconds_count", ())] == 1
    assert values[("llmd_time_to_first_token_seconds_sum", ())] == pytest.approx(0.040)
    assert values[("llmd_time_to_first_token_seconds_bucket", (("le", "0.025"),))] == 0
    assert values[("llmd_time_to_first_token_seconds_bucket", (("le", "0.05"),))] == 1
    assert values[("llmd_inter_token_latency_seconds_count", ())] == 3
    assert values[("llmd_inter_token_latency_seconds_sum", ())] == pytest.approx(0.036)
    assert values[("llmd_inter_token_latency_seconds_bucket", (("le", "0.015"),))] == 3
    assert values[("llmd_inter_token_latency_seconds_bucket", (("le", "0.01"),))] == 0
    assert values[("llmd_request_duration_seconds_sum", ())] == pytest.approx(0.078)
    assert values[("llmd_prompt_tokens_total", ())] == 17
    assert values[("llmd_completion_tokens_total", ())] == 4
    assert values[("llmd_requests_total", (("finish_reason", "stop"),))] == 1
    assert values[("llmd_requests_total", (("finish_reason", "error"),))] == 0


def test_a_stream_that_never_got_a_token_counts_only_as_a_request() -> None:
    metrics = Metrics()
    metrics.observe_stream(Stream(started=time.monotonic() - 0.5, first_token_at=None, prompt_tokens=9,
                                  outcome="disconnected"))
    values = scrape(metrics)
    assert values[("llmd_time_to_first_token_seconds_count", ())] == 0
    assert values[("llmd_inter_token_latency_seconds_count", ())] == 0
    assert values[("llmd_request_duration_seconds_sum", ())] == pytest.approx(0.5, abs=0.25)
    assert values[("llmd_requests_total", (("finish_reason", "disconnected"),))] == 1


def test_the_engine_clients_stream_fits_the_observer() -> None:
    """`GenerationStream` (engine/stream.py) has every field `observe_stream` reads."""
    from llmd.engine.stream import GenerationStream

    stream = GenerationStream(None, "r1", 12, 16)  # type: ignore[arg-type]  # no client needed to read it
    metrics = Metrics()
    metrics.observe_stream(stream)
    assert scrape(metrics)[("llmd_requests_total", (("finish_reason", "disconnected"),))] == 1


def test_every_finish_reason_is_exported_from_the_start() -> None:
    values = scrape(Metrics())
    for reason in FINISH_REASONS:
        assert values[("llmd_requests_total", (("finish_reason", reason),))] == 0


def test_direct_observations_and_errors_by_type() -> None:
    metrics = Metrics()
    metrics.observe_queue_wait(0.3)
    metrics.observe_queue_wait(0.0)
    metrics.observe_finish("length", 2.5, prompt_tokens=100, completion_tokens=16)
    metrics.observe_finish("disconnected", 0.5, prompt_tokens=10, completion_tokens=1)
    metrics.observe_error("overloaded")
    metrics.observe_error("overloaded")
    metrics.observe_error("context_length_exceeded")
    values = scrape(metrics)
    assert values[("llmd_queue_wait_seconds_count", ())] == 2
    assert values[("llmd_queue_wait_seconds_bucket", (("le", "0.25"),))] == 1
    assert values[("llmd_queue_wait_seconds_bucket", (("le", "0.5"),))] == 2
    assert values[("llmd_requests_total", (("finish_reason", "length"),))] == 1
    assert values[("llmd_requests_total", (("finish_reason", "disconnected"),))] == 1
    assert values[("llmd_prompt_tokens_total", ())] == 110
    assert values[("llmd_completion_tokens_total", ())] == 17
    assert values[("llmd_errors_total", (("type", "overloaded"),))] == 2
    assert values[("llmd_errors_total", (("type", "context_length_exceeded"),))] == 1


def test_startup_gauges() -> None:
    metrics = Metrics()
    metrics.set_startup(load_seconds=12.5, warmup_seconds=40.25)
    values = scrape(metrics)
    assert values[("llmd_model_load_seconds", ())] == 12.5
    assert values[("llmd_warmup_seconds", ())] == 40.25


def test_engine_gauges_are_read_at_scrape_time() -> None:
    current = [stats(running=2, waiting=1, prefix_hits=3, reused=96)]
    metrics = Metrics(engine_stats=lambda: current[0], gpu_memory=lambda: (6 * 2**30, 24 * 2**30))
    values = scrape(metrics)
    assert values[("llmd_requests_running", ())] == 2
    assert values[("llmd_requests_waiting", ())] == 1
    assert values[("llmd_prefix_cache_hits_total", ())] == 3
    assert values[("llmd_prefix_cache_tokens_reused_total", ())] == 96
    assert values[("llmd_gpu_memory_used_bytes", ())] == 6 * 2**30
    assert values[("llmd_gpu_memory_total_bytes", ())] == 24 * 2**30
    current[0] = stats(running=0, waiting=0, prefix_hits=4, reused=128)
    values = scrape(metrics)
    assert values[("llmd_requests_running", ())] == 0
    assert values[("llmd_prefix_cache_tokens_reused_total", ())] == 128


def test_the_kv_cache_gauge_has_a_sample_only_from_an_engine_with_a_block_pool() -> None:
    native = scrape(Metrics(engine_stats=stats))  # per-request caches: no usage to report
    assert ("llmd_kv_cache_usage_ratio", ()) not in native
    assert native[("llmd_preemptions_total", ())] == 0
    pooled = scrape(Metrics(engine_stats=lambda: replace(stats(), kv_cache_usage=0.25, preemptions=3)))
    assert pooled[("llmd_kv_cache_usage_ratio", ())] == 0.25
    assert pooled[("llmd_preemptions_total", ())] == 3


def test_the_chunk_budget_gauge_has_a_sample_only_from_an_engine_that_paces_its_chunks() -> None:
    assert ("llmd_prefill_chunk_tokens", ()) not in scrape(Metrics(engine_stats=stats))  # vLLM
    paced = scrape(Metrics(engine_stats=lambda: replace(stats(), prefill_chunk_tokens=14)))
    assert paced[("llmd_prefill_chunk_tokens", ())] == 14


def test_the_step_time_counters_have_samples_only_from_an_engine_that_times_its_steps() -> None:
    untimed = scrape(Metrics(engine_stats=stats))  # vLLM: steps counted, not timed
    assert ("llmd_engine_step_seconds_total", ()) not in untimed
    assert ("llmd_engine_forward_seconds_total", ()) not in untimed
    timed_stats = replace(stats(), steps=40, step_seconds=2.5, forward_seconds=2.25)
    timed = scrape(Metrics(engine_stats=lambda: timed_stats))
    assert timed[("llmd_engine_steps_total", ())] == 40
    assert timed[("llmd_engine_step_seconds_total", ())] == 2.5
    assert timed[("llmd_engine_forward_seconds_total", ())] == 2.25


HISTOGRAMS = ("llmd_time_to_first_token_seconds", "llmd_inter_token_latency_seconds",
              "llmd_request_duration_seconds", "llmd_queue_wait_seconds")
COUNTERS = ("llmd_prompt_tokens", "llmd_completion_tokens", "llmd_requests", "llmd_errors",
            "llmd_prefix_cache_hits", "llmd_prefix_cache_tokens_reused", "llmd_preemptions",
            "llmd_engine_steps", "llmd_engine_step_seconds", "llmd_engine_forward_seconds")
GAUGES = ("llmd_requests_running", "llmd_requests_waiting", "llmd_model_load_seconds", "llmd_warmup_seconds",
          "llmd_gpu_memory_used_bytes", "llmd_gpu_memory_total_bytes", "llmd_kv_cache_usage_ratio",
          "llmd_prefill_chunk_tokens")


def test_metric_types() -> None:
    # the KV gauge has a sample only from vLLM, the chunk budget only from the native engine
    pooled = replace(stats(), kv_cache_usage=0.5, prefill_chunk_tokens=32, step_seconds=1.0,
                     forward_seconds=0.5)
    kinds = families(Metrics(engine_stats=lambda: pooled, gpu_memory=lambda: (1, 2)))
    expected = {**dict.fromkeys(HISTOGRAMS, "histogram"), **dict.fromkeys(COUNTERS, "counter"),
                **dict.fromkeys(GAUGES, "gauge")}
    assert {name: kinds.get(name) for name in expected} == expected


def test_every_metric_has_help_text() -> None:
    body = Metrics(engine_stats=stats, gpu_memory=lambda: (1, 2)).render()[0].decode()
    for family in text_string_to_metric_families(body):
        assert family.name.startswith("llmd_")
        assert len(family.documentation) > 20, family.name


def test_without_a_gpu_the_memory_gauges_have_no_sample() -> None:
    for metrics in (Metrics(engine_stats=stats), Metrics(engine_stats=stats, gpu_memory=lambda: None)):
        names = {name for name, _ in scrape(metrics)}
        assert "llmd_gpu_memory_used_bytes" not in names and "llmd_gpu_memory_total_bytes" not in names
        assert "llmd_requests_running" in names


def test_sources_can_be_attached_after_construction() -> None:
    metrics = Metrics()
    assert ("llmd_requests_running", ()) not in scrape(metrics)
    metrics.attach(lambda: stats(running=5), lambda: (1, 2))
    assert scrape(metrics)[("llmd_requests_running", ())] == 5


def test_a_failing_source_is_left_out_and_the_scrape_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> EngineStats:
        raise RuntimeError("worker gone")

    metrics = Metrics(engine_stats=broken, gpu_memory=lambda: (1, 2))
    metrics.observe_error("engine_error")
    with caplog.at_level(logging.ERROR, logger="llmd.metrics"):
        values = scrape(metrics)
    assert ("llmd_requests_running", ()) not in values
    assert values[("llmd_gpu_memory_used_bytes", ())] == 1
    assert values[("llmd_errors_total", (("type", "engine_error"),))] == 1
    assert "worker gone" in caplog.text


def test_each_daemon_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.observe_error("overloaded")
    assert ("llmd_errors_total", (("type", "overloaded"),)) not in scrape(second)


def test_openmetrics_on_request() -> None:
    metrics = Metrics(engine_stats=stats)
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


class Text(msgspec.Struct):
    text: str


class TextChunks:
    """A chunker that sends each event's text (the pushed response's `Chunker`)."""

    stopped = False

    def opening(self) -> list[Text]:
        return []

    def feed(self, index: int, event: TokenEvent) -> list[Text]:
        return [Text(event.text)]

    async def closing(self) -> list[Text]:
        return []

    failed = staticmethod(error_events)


def test_a_stream_cut_by_the_drain_counts_as_an_in_stream_error() -> None:
    """The drain's cut reaches the SSE framing as `shutting_down`, counted like an error response."""
    from llmd.engine.stream import GenerationStream

    stream = GenerationStream(lambda stream: None, "r1", 12, 16)
    stream.deliver(TokenEvent("Once", 1))
    stream.fail(ShuttingDown("the drain timeout ran out"))
    metrics = Metrics()
    pushed = PushedEvents([stream], TextChunks(), OPENAI_EVENTS, None, metrics.observe_error)

    async def sent() -> list[bytes]:
        return [piece async for piece in pushed.body()]

    body = b"".join(asyncio.run(sent()))
    assert body.startswith(b'data: {"text":"Once"}\n\n') and body.endswith(b"data: [DONE]\n\n")
    assert b'"code":"shutting_down"' in body
    assert scrape(metrics)[("llmd_errors_total", (("type", "shutting_down"),))] == 1
    assert stream.outcome == "error"
