"""What the autocomplete workload measured: each edit's request, a run's figures, the report.

An edit's request is *kept* when its first token arrived before the next edit closed it;
*superseded* when it was closed first (the user typed on before seeing anything); *empty*
when it finished on its own without text. The engine's `/stats` counters, read before and
after the edits, give the prefix cache's hits per request sent.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmd.bench.results import MAX_ERROR_MESSAGES, StreamResult
from llmd.bench.stats import ms, percentile, rounded


@dataclass(slots=True)
class EditResult:
    """One edit's request: its stream, and when the next edit closed it (None: it ended)."""

    stream: StreamResult
    closed_at: float | None = None
    awaited: bool = False  # the user paused on it, waiting for its suggestion (`--pause-every`)

    @property
    def kept(self) -> bool:
        """Its first token arrived (before any close: nothing arrives after one)."""
        return self.stream.error is None and bool(self.stream.chunk_times)

    @property
    def superseded(self) -> bool:
        """Closed by the next edit before its first token."""
        return self.closed_at is not None and not self.stream.chunk_times and self.stream.error is None

    @property
    def empty(self) -> bool:
        """Finished on its own without any text."""
        return self.closed_at is None and not self.stream.chunk_times and self.stream.error is None


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """The `/stats` fields the workload reads."""

    running: int
    waiting: int
    prefix_hits: int
    prefix_tokens_reused: int

    @classmethod
    def parse(cls, payload: Mapping[str, Any]) -> EngineCounters:
        """From `/stats` JSON; a missing or non-integer field raises ValueError."""
        values = [payload.get(name) for name in COUNTER_FIELDS]
        if not all(isinstance(value, int) for value in values):
            raise ValueError(f"/stats lacks integer {', '.join(COUNTER_FIELDS)}")
        running, waiting, hits, reused = (int(value) for value in values if isinstance(value, int))
        return cls(running, waiting, hits, reused)


COUNTER_FIELDS = ("running", "waiting", "prefix_hits", "prefix_tokens_reused")


@dataclass(frozen=True, slots=True)
class Drain:
    """How long after the run the server's running and waiting counts took to reach 0."""

    seconds: float | None  # None: they never did within the bound
    running: int
    waiting: int


@dataclass(slots=True)
class AutocompleteRun:
    """One repeat: a cold request on a fresh file, then one request per edit."""

    label: str
    repeat: int
    requests: int  # edits sent = kept + superseded + empty + errors
    kept: int
    superseded: int
    closed_after_first_token: int
    empty: int
    errors: int
    error_messages: list[str]
    prompt_tokens: float | None
    cold_ttft_ms: float | None
    cold_error: str | None
    cold_prefix_tokens_reused: int | None  # a cold request should reuse (almost) nothing
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    ttft_p50_over_cold: float | None
    paused_ttft_ms_p50: float | None  # of the edits the user paused on: the wait they see
    paused_p50_over_cold: float | None
    superseded_fraction: float | None
    prefix_hit_rate: float | None
    prefix_tokens_reused_per_request: float | None
    drain_s: float | None
    drained: bool | None  # None: the server has no /stats
    wall_s: float

    @property
    def failed(self) -> bool:
        """A request failed, or the server still ran requests long after the run."""
        return bool(self.errors) or self.cold_error is not None or self.drained is False


def summarize_edits(
    repeat: int,
    cold: StreamResult,
    edits: Sequence[EditResult],
    counters: tuple[EngineCounters | None, EngineCounters | None],
    drain: Drain | None,
    before_cold: EngineCounters | None = None,
) -> AutocompleteRun:
    """One repeat's figures from its cold request, its edits and the counters around them
    (`counters`: before and after the edits)."""
    kept = [edit.stream for edit in edits if edit.kept]
    failed = [edit.stream for edit in edits if edit.stream.error is not None]
    ttfts = [ttft for stream in kept if (ttft := stream.ttft) is not None]
    superseded = sum(edit.superseded for edit in edits)
    p50, cold_ttft = percentile(ttfts, 50), cold.ttft
    paused = percentile([t for edit in edits if edit.awaited and (t := edit.stream.ttft) is not None], 50)
    hit_rate, reused = prefix_figures(*counters, len(edits))
    return AutocompleteRun(
        label="autocomplete", repeat=repeat, requests=len(edits), kept=len(kept),
        superseded=superseded,
        closed_after_first_token=sum(edit.closed_at is not None and edit.kept for edit in edits),
        empty=sum(edit.empty for edit in edits), errors=len(failed),
        error_messages=_error_messages(failed, drain),
        prompt_tokens=_median_prompt_tokens([cold, *kept]),
        cold_ttft_ms=ms(cold_ttft), cold_error=cold.error,
        cold_prefix_tokens_reused=_reused_between(before_cold, counters[0]),
        ttft_ms_p50=ms(p50), ttft_ms_p99=ms(percentile(ttfts, 99)),
        ttft_p50_over_cold=rounded(ratio(p50, cold_ttft), 4),
        paused_ttft_ms_p50=ms(paused), paused_p50_over_cold=rounded(ratio(paused, cold_ttft), 4),
        superseded_fraction=rounded(ratio(superseded, len(edits)), 4),
        prefix_hit_rate=hit_rate, prefix_tokens_reused_per_request=reused,
        drain_s=None if drain is None else rounded(drain.seconds),
        drained=None if drain is None else drain.seconds is not None,
        wall_s=round(_edit_wall(edits), 6),
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def prefix_figures(
    before: EngineCounters | None, after: EngineCounters | None, requests: int
) -> tuple[float | None, float | None]:
    """(prefix-cache hits per request sent, prompt tokens reused per request sent)."""
    if before is None or after is None or requests == 0:
        return None, None
    hits = after.prefix_hits - before.prefix_hits
    reused = after.prefix_tokens_reused - before.prefix_tokens_reused
    return rounded(hits / requests, 4), rounded(reused / requests, 1)


def _reused_between(before: EngineCounters | None, after: EngineCounters | None) -> int | None:
    if before is None or after is None:
        return None
    return after.prefix_tokens_reused - before.prefix_tokens_reused


def _median_prompt_tokens(streams: Sequence[StreamResult]) -> float | None:
    counts = [stream.prompt_tokens for stream in streams if stream.prompt_tokens is not None]
    return statistics.median(counts) if counts else None


def _error_messages(failed: Sequence[StreamResult], drain: Drain | None) -> list[str]:
    messages = [str(stream.error) for stream in failed[:MAX_ERROR_MESSAGES]]
    if drain is not None and drain.seconds is None:
        messages.append(f"the server still had {drain.running} running and {drain.waiting} "
                        "waiting request(s) after the run")
    return messages


def _edit_wall(edits: Sequence[EditResult]) -> float:
    """First edit's request sent to the last one closed or finished."""
    if not edits:
        return 0.0
    ends = [edit.closed_at or edit.stream.finished or edit.stream.sent for edit in edits]
    return max(ends) - edits[0].stream.sent


@dataclass(slots=True)
class AutocompleteReport:
    """Everything the autocomplete workload prints: settings, notes, one run per repeat."""

    workload: str
    target: str
    model: str
    fim: str
    file_tokens_requested: int
    edits: int
    edit_interval_ms: float
    pause_every: int  # 0: the user never pauses
    max_tokens: int
    temperature: float
    stop: list[str]
    warmup: int
    repeats: int
    notes: list[str]
    runs: list[AutocompleteRun]
    medians: dict[str, float | None]


MEDIAN_FIELDS = ("ttft_ms_p50", "ttft_ms_p99", "cold_ttft_ms", "ttft_p50_over_cold",
                 "paused_ttft_ms_p50", "paused_p50_over_cold", "prefix_hit_rate", "superseded_fraction")


def run_medians(runs: Sequence[AutocompleteRun]) -> dict[str, float | None]:
    """The median over the repeats of each headline figure."""
    medians: dict[str, float | None] = {}
    for name in MEDIAN_FIELDS:
        present = [value for run in runs if (value := getattr(run, name)) is not None]
        medians[name] = rounded(statistics.median(present), 4) if present else None
    return medians
