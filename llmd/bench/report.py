"""How the bench prints its report: a fixed-width table, or one JSON object."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from llmd.bench.results import BenchReport, RunReport

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


def _format_row(values: Sequence[Any], label_width: int, header: bool = False) -> str:
    cells = []
    for (name, width, spec), value in zip(COLUMNS, values, strict=True):
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
        f"llmd bench  {report.target}  model {report.model}",
        f"{report.concurrency} client(s) x {report.requests_per_client} request(s), "
        f"warmup {report.warmup}, prompt {prompt} tokens (asked {report.prompt_tokens_requested}, "
        f"{kind}), max_tokens {report.max_tokens}, temperature {report.temperature:g}",
        "times in ms; out tok/s = all completion tokens / wall; stream tok/s = median per stream",
        "",
        _format_row([name for name, _, _ in COLUMNS], label_width, header=True),
        *(_format_row(row, label_width) for row in rows),
    ]
    lines += _summary_lines(report)
    return "\n".join(lines)


def _summary_lines(report: BenchReport) -> list[str]:
    lines = [""]
    for label, rate in report.median_output_tokens_per_s.items():
        shown = "-" if rate is None else f"{rate:.1f}"
        lines.append(f"median out tok/s over {report.repeats} repeat(s), {label}: {shown}")
    for run in report.runs:
        lines += [f"error ({run.label} #{run.repeat}): {message}" for message in run.error_messages]
    lines += [f"note: {note}" for note in report.notes]
    return lines


def format_json(report: BenchReport) -> str:
    """The report as one JSON object."""
    return json.dumps(asdict(report), indent=2)
