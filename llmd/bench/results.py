"""What the bench measured: one stream's result, one run's report, the whole bench report.

`summarize` reduces a run's streams to its figures; `bench_report` gathers the runs, the
settings they ran under and the notes a reader needs to interpret them.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmd.bench.schemas import SCHEMAS, parses_as_object
from llmd.bench.stats import (
    chunks_per_token,
    decode_tokens_per_s,
    gaps,
    ms,
    percentile,
    rounded,
    tokens_per_s,
)

MAX_ERROR_MESSAGES = 5


@dataclass(slots=True)
class StreamResult:
    """What one streamed request did, in perf_counter() seconds."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finished: float | None = None
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    text: list[str] | None = None  # the content's pieces, kept only for constrained requests
    api: str = "chat"  # the API it went through: "chat" or "responses"

    @property
    def constrained(self) -> bool:
        """Sent under a JSON schema (its text is kept to be parsed)."""
        return self.text is not None

    @property
    def missing_done(self) -> bool:
        """Finished (a finish_reason arrived) but the server never sent `data: [DONE]`."""
        return not self.done and self.finish_reason is not None and self.error is None

    @property
    def ttft(self) -> float | None:
        """Request sent to first content-bearing chunk."""
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's usage figure, else the content chunk count."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)


@dataclass(slots=True)
class RunReport:
    """One measurement of C x R requests (or R in-process decodes)."""

    label: str
    repeat: int
    requests: int
    ok: int
    errors: int
    error_messages: list[str]
    missing_done: int
    prompt_tokens: float | None
    completion_tokens: int
    usage_source: str
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    gap_ms_p50: float | None
    gap_ms_p99: float | None
    gap_ms_max: float | None
    chunks_per_token: float | None
    output_tokens_per_s: float | None
    stream_decode_tokens_per_s_median: float | None
    wall_s: float
    share: str = "all"  # the run's requests it covers: "all", or only its "schema", "plain", "chat" or
    # "responses" ones
    constrained: int = 0  # requests sent under a JSON schema
    json: JsonCounts | None = None  # their replies, where there were any


@dataclass(frozen=True, slots=True)
class JsonCounts:
    """How the completed constrained replies of a run parsed: a JSON object, not one although the
    server said it was done (`finish_reason` other than "length": a broken constraint), or cut by
    max_tokens (incomplete by design, not counted against the server)."""

    parsed: int
    unparseable: int
    cut: int


@dataclass(slots=True)
class BenchReport:
    """Everything `llmd bench` prints: settings, notes and one RunReport per run."""

    target: str
    model: str
    concurrency: int
    requests_per_client: int
    repeats: int
    warmup: int
    prompt_tokens_requested: int
    prompt_tokens: int | None
    prompt_words: int
    max_tokens: int
    temperature: float
    distinct_prompts: bool
    ignore_eos: bool
    notes: list[str]
    runs: list[RunReport]
    median_output_tokens_per_s: dict[str, float | None]
    constrained_clients: int = 0
    schemas: list[str] = field(default_factory=list)
    api: str | None = "chat"  # what the streams drove: "chat", "responses", "both"; None in-process
    stagger_ms: float = 0.0  # client k started k x this after the first


def summarize(
    label: str, repeat: int, results: Sequence[StreamResult], share: tuple[str, float] | None = None
) -> RunReport:
    """Reduce one run's stream results to its report; failed streams only count as errors.

    Where `results` are part of a run, `share` names the part and gives the run's wall, which
    the rates divide by.
    """
    ok = [result for result in results if result.error is None]
    failed = sorted((r for r in results if r.error is not None), key=lambda r: r.sent)
    with_usage = [result for result in ok if result.completion_tokens is not None]
    pooled_gaps = [gap for result in ok for gap in gaps(result.chunk_times)]
    ttfts = [result.ttft for result in ok if result.ttft is not None]
    decode_rates = [
        rate for r in ok if (rate := decode_tokens_per_s(r.chunk_times, r.tokens)) is not None
    ]
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    completion_tokens = sum(result.tokens for result in ok)
    part, seconds = share or ("all", _wall(results))
    return RunReport(
        label=label,
        repeat=repeat,
        requests=len(results),
        ok=len(ok),
        errors=len(failed),
        error_messages=[str(result.error) for result in failed[:MAX_ERROR_MESSAGES]],
        missing_done=sum(1 for result in ok if result.missing_done),
        prompt_tokens=statistics.median(prompt_tokens) if prompt_tokens else None,
        completion_tokens=completion_tokens,
        usage_source=_usage_source(len(ok), len(with_usage)),
        ttft_ms_p50=ms(percentile(ttfts, 50)),
        ttft_ms_p99=ms(percentile(ttfts, 99)),
        gap_ms_p50=ms(percentile(pooled_gaps, 50)),
        gap_ms_p99=ms(percentile(pooled_gaps, 99)),
        gap_ms_max=ms(max(pooled_gaps, default=None)),
        chunks_per_token=rounded(_usage_chunks_per_token(with_usage), 4),
        output_tokens_per_s=rounded(tokens_per_s(completion_tokens, seconds)),
        stream_decode_tokens_per_s_median=rounded(
            statistics.median(decode_rates) if decode_rates else None
        ),
        wall_s=round(seconds, 6),
        share=part,
        constrained=sum(1 for result in results if result.constrained),
        json=json_counts(ok),
    )


def summarize_mix(label: str, repeat: int, results: Sequence[StreamResult]) -> list[RunReport]:
    """The run's report; where it mixed constrained and plain requests, or the two APIs
    (`--api both`), also one for each kind (`LABEL schema`, `LABEL plain`; `LABEL chat`,
    `LABEL responses`), their rates over the whole run's wall, so they add up."""
    whole = summarize(label, repeat, results)
    wall = _wall(results)
    splits: list[tuple[str, str, Callable[[StreamResult], bool]]] = [
        ("schema", "plain", lambda result: result.constrained),
        ("chat", "responses", lambda result: result.api == "chat"),
    ]
    reports = [whole]
    for name, other, belongs in splits:
        first = [result for result in results if belongs(result)]
        second = [result for result in results if not belongs(result)]
        if first and second:
            reports += [summarize(f"{label} {name}", repeat, first, (name, wall)),
                        summarize(f"{label} {other}", repeat, second, (other, wall))]
    return reports


def json_counts(results: Sequence[StreamResult]) -> JsonCounts | None:
    """How the constrained ones among completed `results` parsed; None when there are none."""
    replies = [result for result in results if result.text is not None]
    if not replies:
        return None
    ended = [result for result in replies if result.finish_reason != "length"]
    parsed = sum(1 for result in ended if parses_as_object("".join(result.text or ())))
    return JsonCounts(parsed=parsed, unparseable=len(ended) - parsed, cut=len(replies) - len(ended))


def _usage_chunks_per_token(with_usage: Sequence[StreamResult]) -> float | None:
    # Only streams with a server token count: for the others the ratio is 1 by construction.
    chunks = sum(len(result.chunk_times) for result in with_usage)
    return chunks_per_token(chunks, sum(result.tokens for result in with_usage))


def _usage_source(ok: int, with_usage: int) -> str:
    if ok == 0:
        return "none"
    if with_usage == ok:
        return "reported"
    return "counted" if with_usage == 0 else "mixed"


def _wall(results: Sequence[StreamResult]) -> float:
    """First request sent to last stream finished."""
    if not results:
        return 0.0
    last = max(r.sent if r.finished is None else r.finished for r in results)
    return last - min(result.sent for result in results)


def median_output_rates(runs: Sequence[RunReport]) -> dict[str, float | None]:
    """Median aggregate output tokens/s over the repeats of each label."""
    medians: dict[str, float | None] = {}
    for label in dict.fromkeys(run.label for run in runs):
        rates = [r.output_tokens_per_s for r in runs if r.label == label]
        present = [rate for rate in rates if rate is not None]
        medians[label] = rounded(statistics.median(present)) if present else None
    return medians


def run_notes(runs: Sequence[RunReport], max_tokens: int) -> list[str]:
    """Caveats a reader needs to interpret the figures."""
    notes = []
    if any(run.usage_source in ("counted", "mixed") for run in runs):
        notes.append(
            "server sent no usage for some streams: their completion tokens are counted "
            "content chunks, and chunks/token covers only streams with usage"
        )
    missing_done = sum(run.missing_done for run in runs)
    if missing_done:
        notes.append(
            f"{missing_done} stream(s) ended after their finish_reason without `data: [DONE]` "
            "(an OpenAI protocol deviation; counted as completed)"
        )
    short = [
        run for run in runs
        if run.usage_source == "reported" and run.completion_tokens < run.ok * max_tokens
    ]
    if short:
        notes.append(
            f"{len(short)} run(s) produced fewer than max_tokens per stream "
            "(server stopped at EOS? try --ignore-eos)"
        )
    return notes


def bench_report(
    args: argparse.Namespace,
    target: str,
    model: str,
    prompt_tokens: int | None,
    prompt_words: int,
    notes: list[str],
    runs: list[RunReport],
) -> BenchReport:
    """The report of `runs` under the settings in `args`, with the notes they call for."""
    return BenchReport(
        target=target,
        model=model,
        concurrency=args.concurrency,
        requests_per_client=args.requests,
        repeats=args.repeats,
        warmup=args.warmup,
        prompt_tokens_requested=args.prompt_tokens,
        prompt_tokens=prompt_tokens,
        prompt_words=prompt_words,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        distinct_prompts=args.distinct_prompts,
        ignore_eos=args.ignore_eos,
        notes=notes + run_notes(runs, args.max_tokens),
        runs=runs,
        median_output_tokens_per_s=median_output_rates(runs),
        constrained_clients=args.constrained,
        schemas=[schema.name for schema in SCHEMAS] if args.constrained else [],
        api=None if args.in_process else args.api,
        stagger_ms=args.stagger_ms,
    )
