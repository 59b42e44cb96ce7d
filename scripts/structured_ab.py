"""Summarize scripts/structured_ab.sh's runs: per-round values, their medians and per-round ratios.

Usage: python scripts/structured_ab.py OUTDIR
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

Run = dict[str, Any]


def load(out: Path, pattern: str) -> dict[int, dict[str, Any]]:
    """The JSON reports matching `pattern` (its {r} the round), by round; unreadable ones skipped."""
    found = {}
    for name in glob.glob(str(out / pattern.format(r="*"))):
        round_ = int(re.search(r"-(\d+)\.json$", name)[1])  # type: ignore[index]
        try:
            found[round_] = json.loads(Path(name).read_text())
        except ValueError as exc:
            print(f"unreadable {name}: {exc}")
    return found


def row(report: dict[str, Any], label: str) -> Run:
    """The runs labelled `label`: each figure's median over the repeats (errors summed, json of
    the first)."""
    runs = [run for run in report["runs"] if run["label"] == label]
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            present = [run[key] for run in runs if run[key] is not None]
            merged[key] = statistics.median(present) if present else None
    merged["errors"] = sum(run["errors"] for run in runs)
    merged["completion_tokens"] = sum(run["completion_tokens"] for run in runs)
    merged["json"] = [run["json"] for run in runs]
    return merged


def show(name: str, values: list[float], digits: int = 3) -> str:
    shown = [round(value, digits) for value in values]
    return f"{name}: median {round(statistics.median(values), digits)}  per round {shown}"


def constrained_cost(out: Path) -> None:
    plain, mixed = load(out, "c8plain-new-{r}.json"), load(out, "c8mixed-new-{r}.json")
    rounds = sorted(set(plain) & set(mixed))
    if not rounds:
        return
    print(f"== C=8, 4 of 8 clients under a JSON schema vs all plain (new tree), rounds {rounds}")
    figures: dict[str, list[float]] = {}
    for r in rounds:
        base, whole = row(plain[r], "http"), row(mixed[r], "http")
        schema, rest = row(mixed[r], "http schema"), row(mixed[r], "http plain")
        values = {
            "all-plain tok/s": base["output_tokens_per_s"],
            "mixed tok/s": whole["output_tokens_per_s"],
            "mixed/all-plain tok/s": whole["output_tokens_per_s"] / base["output_tokens_per_s"],
            "all-plain gap p50 ms": base["gap_ms_p50"],
            "mixed: plain rows gap p50 ms": rest["gap_ms_p50"],
            "mixed: schema rows gap p50 ms": schema["gap_ms_p50"],
            "plain rows gap p50 / all-plain": rest["gap_ms_p50"] / base["gap_ms_p50"],
            "schema rows gap p50 / all-plain": schema["gap_ms_p50"] / base["gap_ms_p50"],
            "mixed: plain rows tok/s": rest["output_tokens_per_s"],
            "mixed: schema rows tok/s": schema["output_tokens_per_s"],
            "all-plain TTFT p50 ms": base["ttft_ms_p50"],
            "mixed: plain rows TTFT p50 ms": rest["ttft_ms_p50"],
            "mixed: schema rows TTFT p50 ms": schema["ttft_ms_p50"],
            "all-plain gap max ms": base["gap_ms_max"],
            "mixed gap max ms": whole["gap_ms_max"],
        }
        for key, value in values.items():
            figures.setdefault(key, []).append(value)
        errors = base["errors"] + whole["errors"]
        print(f"  round {r}: errors {errors}, json {schema['json']}, "
              f"completion tokens {base['completion_tokens']} plain / {whole['completion_tokens']} mixed")
    for key, values in figures.items():
        print("  " + show(key, values))


def schema_latency(out: Path) -> None:
    reports = load(out, "schemas-{r}.json")
    if not reports:
        return
    rounds = sorted(reports)
    print(f"== schema cost to TTFT (ms over a plain one-token request), rounds {rounds}")
    keys = ("plain_ttft_ms_p50", "first_cost_ms_p50", "first_cost_ms_max",
            "cached_cost_ms_p50", "cached_cost_ms_max")
    for key in keys:
        values = [reports[r]["runs"][0][key] for r in rounds]
        print("  " + show(key, values))
    setups = [reports[r]["setup"]["first_ms"] - reports[r]["setup"]["plain_ms"] for r in rounds]
    print("  " + show("setup (fresh daemon's first schema) over plain", setups))
    per_schema: dict[str, list[float]] = {}
    for r in rounds:
        for timing in reports[r]["runs"][0]["timings"]:
            if timing["error"] is None:
                per_schema.setdefault(timing["name"], []).append(timing["first_ms"] - timing["plain_ms"])
    print("  first-use cost per schema, median over rounds: " + ", ".join(
        f"{name} {statistics.median(values):.2f}" for name, values in per_schema.items()))
    errors = sum(reports[r]["runs"][0]["errors"] for r in rounds)
    print(f"  errors {errors}")


def old_vs_new(out: Path) -> None:
    for name, pattern in (("C=1", "c1-{side}-{{r}}.json"), ("C=8", "c8plain-{side}-{{r}}.json")):
        old, new = (load(out, pattern.format(side=side)) for side in ("old", "new"))
        rounds = sorted(set(old) & set(new))
        if not rounds:
            continue
        print(f"== {name} unconstrained, new tree vs the tree before issue 15, rounds {rounds}")
        for side, reports in (("old", old), ("new", new)):
            runs = [row(reports[r], "http") for r in rounds]
            print(f"  {side}: " + show("tok/s", [run["output_tokens_per_s"] for run in runs], 1)
                  + "  |  " + show("gap p50", [run["gap_ms_p50"] for run in runs], 2)
                  + f"  |  errors {sum(run['errors'] for run in runs)}")
        ratios = [row(new[r], "http")["output_tokens_per_s"] / row(old[r], "http")["output_tokens_per_s"]
                  for r in rounds]
        print("  " + show("new/old tok/s", ratios))


def main() -> None:
    out = Path(sys.argv[1])
    constrained_cost(out)
    schema_latency(out)
    old_vs_new(out)


if __name__ == "__main__":
    main()
