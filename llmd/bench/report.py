"""How the bench prints its report: a fixed-width table, or one JSON object."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from llmd.bench.edit_results import AutocompleteReport, AutocompleteRun
from llmd.bench.results import BenchReport, RunReport
from llmd.bench.schema_latency import SchemaReport, SchemaRun

# what `--api` drives
ENDPOINTS = {"chat": "/chat/completions", "responses": "/responses",
             "both": "/chat/completions and /responses"}

COLUMNS = (
    ("run", 0, "{}"),  # sized to the longest label
    ("ok", 4, "{}"),
    ("err", 5, "{}"),
    ("TTFT p50", 10, "{:.1f}"),
    ("TTFT p99", 10, "{:.1f}"),
    ("gap p50", 9, "{:.2f}"),
    ("gap p99", 9, "{:.2f}"),
    ("gap max", 9, "{:.2f}"),
    ("chunk/tok", 11, "{:.2f}"),
    ("out tok/s", 11, "{:.1f}"),
    ("stream tok/s", 14, "{:.1f}"),
)


def _row_values(run: RunReport) -> list[Any]:
    return [
        f"{run.label} #{run.repeat}",
        run.ok,
        run.errors,
        run.ttft_ms_p50,
        run.ttft_ms_p99,
        run.gap_ms_p50,
        run.gap_ms_p99,
        run.gap_ms_max,
        run.chunks_per_token,
        run.output_tokens_per_s,
        run.stream_decode_tokens_per_s_median,
    ]


# The autocomplete workload's columns: requests sent, kept (first token before the next edit),
# superseded (closed before it), errors; TTFTs of kept edits against the cold request's.
EDIT_COLUMNS = (
    ("run", 0, "{}"),
    ("sent", 6, "{}"),
    ("kept", 6, "{}"),
    ("supsd", 7, "{}"),
    ("err", 5, "{}"),
    ("cold TTFT", 11, "{:.1f}"),
    ("TTFT p50", 10, "{:.1f}"),
    ("TTFT p99", 10, "{:.1f}"),
    ("p50/cold", 10, "{:.3f}"),
    ("paused p50", 12, "{:.1f}"),
    ("hit rate", 10, "{:.3f}"),
    ("reuse/req", 11, "{:.1f}"),
    ("drain s", 9, "{:.3f}"),
)


def _edit_row_values(run: AutocompleteRun) -> list[Any]:
    return [
        f"{run.label} #{run.repeat}",
        run.requests,
        run.kept,
        run.superseded,
        run.errors,
        run.cold_ttft_ms,
        run.ttft_ms_p50,
        run.ttft_ms_p99,
        run.ttft_p50_over_cold,
        run.paused_ttft_ms_p50,
        run.prefix_hit_rate,
        run.prefix_tokens_reused_per_request,
        run.drain_s,
    ]


def _format_row(
    values: Sequence[Any], label_width: int, header: bool = False, columns: Sequence[Any] = COLUMNS
) -> str:
    cells = []
    for (name, width, spec), value in zip(columns, values, strict=True):
        text = "-" if value is None else (str(value) if header else spec.format(value))
        cells.append(text.ljust(label_width) if name == "run" else text.rjust(width))
    return "".join(cells).rstrip()


def format_table(report: BenchReport) -> str:
    """The human-readable fixed-width report."""
    prompt = "?" if report.prompt_tokens is None else str(report.prompt_tokens)
    kind = "distinct" if report.distinct_prompts else "shared"
    rows = [_row_values(run) for run in report.runs]
    label_width = max([len("run"), *(len(row[0]) for row in rows)]) + 1
    lines = [
        f"llmd bench  {report.target}  model {report.model}{_via(report.api)}",
        f"{report.concurrency} client(s) x {report.requests_per_client} request(s), "
        f"warmup {report.warmup}, prompt {prompt} tokens (asked {report.prompt_tokens_requested}, "
        f"{kind}), max_tokens {report.max_tokens}, temperature {report.temperature:g}"
        + (f", clients started {report.stagger_ms:g} ms apart" if report.stagger_ms else ""),
        "times in ms; out tok/s = all completion tokens / wall; stream tok/s = median per stream",
        *_constrained_lines(report),
        "",
        _format_row([name for name, _, _ in COLUMNS], label_width, header=True),
        *(_format_row(row, label_width) for row in rows),
    ]
    lines += _summary_lines(report)
    return "\n".join(lines)


def _via(api: str | None) -> str:
    """The endpoint the streams went to, after the target; nothing for an in-process run."""
    return "" if api is None else f"  via {ENDPOINTS[api]}"


def _constrained_lines(report: BenchReport) -> list[str]:
    if not report.constrained_clients:
        return []
    return [f"{report.constrained_clients} of {report.concurrency} client(s) send response_format "
            f"json_schema ({len(report.schemas)} schemas in turn); 'schema' and 'plain' rows split "
            "each run, their tok/s over the run's wall"]


def _json_line(run: RunReport) -> str:
    counts = run.json
    assert counts is not None
    return (f"json ({run.label} #{run.repeat}): {counts.parsed} parsed, {counts.unparseable} "
            f"unparseable, {counts.cut} cut by max_tokens")


def _summary_lines(report: BenchReport) -> list[str]:
    lines = [""]
    for label, rate in report.median_output_tokens_per_s.items():
        shown = "-" if rate is None else f"{rate:.1f}"
        lines.append(f"median out tok/s over {report.repeats} repeat(s), {label}: {shown}")
    lines += [_json_line(run) for run in report.runs if run.json and run.constrained == run.requests]
    for run in report.runs:
        lines += [f"error ({run.label} #{run.repeat}): {message}" for message in run.error_messages]
    lines += [f"note: {note}" for note in report.notes]
    return lines


def format_autocomplete_table(report: AutocompleteReport) -> str:
    """The autocomplete workload's fixed-width report."""
    rows = [_edit_row_values(run) for run in report.runs]
    label_width = max([len("run"), *(len(row[0]) for row in rows)]) + 1
    lines = [
        f"llmd bench autocomplete  {report.target}  model {report.model}",
        f"{report.edits} edit(s) every {report.edit_interval_ms:g} ms"
        f"{f', a pause after every {report.pause_every}' if report.pause_every else ''} on a "
        f"{report.file_tokens_requested}-token file, FIM {report.fim}, max_tokens "
        f"{report.max_tokens}, {len(report.stop)} stop strings, temperature {report.temperature:g}",
        "times in ms; TTFT of kept edits (first token before the next edit); supsd = closed "
        "before the first token; hit rate = /stats prefix hits per request sent",
        "",
        _format_row([name for name, _, _ in EDIT_COLUMNS], label_width, True, EDIT_COLUMNS),
        *(_format_row(row, label_width, columns=EDIT_COLUMNS) for row in rows),
        "",
        _medians_line(report),
    ]
    for run in report.runs:
        lines += [f"error ({run.label} #{run.repeat}): {message}" for message in run.error_messages]
        if run.cold_error is not None:
            lines.append(f"error ({run.label} #{run.repeat}): cold request: {run.cold_error}")
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def _medians_line(report: AutocompleteReport) -> str:
    shown = ", ".join(f"{name} {'-' if value is None else f'{value:g}'}"
                      for name, value in report.medians.items())
    return f"medians over {report.repeats} repeat(s): {shown}"


SCHEMA_COLUMNS = (
    ("run", 0, "{}"),
    ("err", 5, "{}"),
    ("plain TTFT", 12, "{:.1f}"),
    ("first p50", 11, "{:.2f}"),
    ("first max", 11, "{:.2f}"),
    ("cached p50", 12, "{:.2f}"),
    ("cached max", 12, "{:.2f}"),
)


def _schema_row_values(run: SchemaRun) -> list[Any]:
    return [f"{run.label} #{run.repeat}", run.errors, run.plain_ttft_ms_p50, run.first_cost_ms_p50,
            run.first_cost_ms_max, run.cached_cost_ms_p50, run.cached_cost_ms_max]


def format_schema_table(report: SchemaReport) -> str:
    """The schemas workload's fixed-width report."""
    rows = [_schema_row_values(run) for run in report.runs]
    label_width = max([len("run"), *(len(row[0]) for row in rows)]) + 1
    prompt = "?" if report.prompt_tokens is None else str(report.prompt_tokens)
    lines = [
        f"llmd bench schemas  {report.target}  model {report.model}{_via(report.api)}",
        f"{len(report.schemas)} schemas x 3 one-token streams (plain, first use, cached), prompt "
        f"{prompt} tokens (asked {report.prompt_tokens_requested}), warmup {report.warmup}",
        "times in ms; first/cached = that request's TTFT minus the plain one's (p50 and max over "
        "the schemas)",
        "",
        _format_row([name for name, _, _ in SCHEMA_COLUMNS], label_width, True, SCHEMA_COLUMNS),
        *(_format_row(row, label_width, columns=SCHEMA_COLUMNS) for row in rows),
        "",
        _schema_medians_line(report),
        *_schema_detail_lines(report),
    ]
    return "\n".join(lines)


def _schema_medians_line(report: SchemaReport) -> str:
    shown = ", ".join(f"{name} {'-' if value is None else f'{value:g}'}"
                      for name, value in report.medians.items())
    return f"medians over {report.repeats} repeat(s): {shown}"


def _schema_detail_lines(report: SchemaReport) -> list[str]:
    setup = report.setup
    lines = []
    if setup is not None:
        cost = setup.error or f"{setup.first_cost_ms:g} ms over plain"
        lines.append(f"setup (the first schema request this bench sent, {setup.name}): {cost}")
    for run in report.runs:
        lines += [f"error ({run.label} #{run.repeat}): {message}" for message in run.error_messages]
    lines += [f"note: {note}" for note in report.notes]
    return lines


def format_json(report: BenchReport | AutocompleteReport | SchemaReport) -> str:
    """The report as one JSON object."""
    return json.dumps(asdict(report), indent=2)
