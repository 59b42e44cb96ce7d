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


def pairs(out: Path, prefix: str = "pair") -> dict[tuple[int, int], tuple[Run, Run, Run, Run]]:
    """Each (round, pair): the all-plain run, and the mixed run whole, its schema and plain rows.
    structured_ab_long.sh's pairs (`long`, one round) are round 1."""
    found = {}
    for name in glob.glob(str(out / f"{prefix}plain-*.json")):
        numbers = list(map(int, re.findall(r"-(\d+)", Path(name).name)))
        r, p = numbers if len(numbers) == 2 else (1, numbers[0])
        suffix = Path(name).name.removeprefix(f"{prefix}plain")
        mixed = out / f"{prefix}mixed{suffix}"
        if mixed.exists():
            base, report = json.loads(Path(name).read_text()), json.loads(mixed.read_text())
            found[r, p] = (row(base, "http"), row(report, "http"), row(report, "http schema"),
                           row(report, "http plain"))
    return found


PAIR_FIGURES = {
    "mixed/all-plain out tok/s": lambda b, w, s, p: w["output_tokens_per_s"] / b["output_tokens_per_s"],
    "mixed/all-plain stream tok/s (median stream)": lambda b, w, s, p:
        w["stream_decode_tokens_per_s_median"] / b["stream_decode_tokens_per_s_median"],
    "plain rows gap p50 / all-plain gap p50": lambda b, w, s, p: p["gap_ms_p50"] / b["gap_ms_p50"],
    "schema rows gap p50 / all-plain gap p50": lambda b, w, s, p: s["gap_ms_p50"] / b["gap_ms_p50"],
    "all-plain out tok/s": lambda b, w, s, p: b["output_tokens_per_s"],
    "mixed out tok/s": lambda b, w, s, p: w["output_tokens_per_s"],
    "mixed: schema rows out tok/s": lambda b, w, s, p: s["output_tokens_per_s"],
    "mixed: plain rows out tok/s": lambda b, w, s, p: p["output_tokens_per_s"],
    "all-plain gap p50 ms": lambda b, w, s, p: b["gap_ms_p50"],
    "mixed: plain rows gap p50 ms": lambda b, w, s, p: p["gap_ms_p50"],
    "mixed: schema rows gap p50 ms": lambda b, w, s, p: s["gap_ms_p50"],
    "all-plain TTFT p50 ms": lambda b, w, s, p: b["ttft_ms_p50"],
    "mixed: plain rows TTFT p50 ms": lambda b, w, s, p: p["ttft_ms_p50"],
    "mixed: schema rows TTFT p50 ms": lambda b, w, s, p: s["ttft_ms_p50"],
    "all-plain gap max ms": lambda b, w, s, p: b["gap_ms_max"],
    "mixed gap max ms": lambda b, w, s, p: w["gap_ms_max"],
}


def constrained_cost(out: Path, prefix: str = "pair") -> None:
    found = pairs(out, prefix)
    if not found:
        return
    rounds = sorted({r for r, _ in found})
    what = "one 256-token request per client" if prefix == "long" else "3 x 64-token requests per client"
    print(f"== C=8, 4 of 8 clients under a JSON schema vs all plain, back to back (new tree, {what}): "
          f"{len(found)} pairs in rounds {rounds}; per round the median of its pairs")
    for name, figure in PAIR_FIGURES.items():
        per_pair = {key: figure(*runs) for key, runs in found.items()}
        per_round = [statistics.median(v for (r, _), v in per_pair.items() if r == rr) for rr in rounds]
        print(f"  {show(name, per_round)}  | median of all pairs {statistics.median(per_pair.values()):.3f}")
    errors = sum(b["errors"] + w["errors"] for b, w, _, _ in found.values())
    json_counts = [s["json"][0] for _, _, s, _ in found.values()]
    tokens = {(b["completion_tokens"], w["completion_tokens"]) for b, w, _, _ in found.values()}
    print(f"  errors {errors}; json per mixed run {sorted(map(str, json_counts))[:1]} ...; "
          f"completion tokens (plain, mixed) {tokens}")


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
        print(f"== {name} unconstrained, new tree vs the tree before issue 15 (fresh daemons), "
              f"rounds {rounds}")
        for side, reports in (("old", old), ("new", new)):
            runs = [row(reports[r], "http") for r in rounds]
            streams = [run["stream_decode_tokens_per_s_median"] for run in runs]
            print(f"  {side}: " + show("out tok/s", [run["output_tokens_per_s"] for run in runs], 1)
                  + "  |  " + show("stream tok/s", streams, 1)
                  + "  |  " + show("gap p50", [run["gap_ms_p50"] for run in runs], 2)
                  + f"  |  errors {sum(run['errors'] for run in runs)}")
        for key in ("output_tokens_per_s", "stream_decode_tokens_per_s_median", "gap_ms_p50"):
            ratios = [row(new[r], "http")[key] / row(old[r], "http")[key] for r in rounds]
            print("  " + show(f"new/old {key}", ratios))


def after_schemas(out: Path) -> None:
    fresh, after = load(out, "c8plain-new-{r}.json"), load(out, "c8after-new-{r}.json")
    rounds = sorted(set(fresh) & set(after))
    if not rounds:
        return
    print(f"== C=8 plain on the new daemon after serving schemas vs before, rounds {rounds}")
    for key in ("output_tokens_per_s", "stream_decode_tokens_per_s_median", "gap_ms_p50"):
        ratios = [row(after[r], "http")[key] / row(fresh[r], "http")[key] for r in rounds]
        print("  " + show(f"after/before {key}", ratios))


def main() -> None:
    out = Path(sys.argv[1])
    constrained_cost(out)
    constrained_cost(out, "long")
    schema_latency(out)
    old_vs_new(out)
    after_schemas(out)


if __name__ == "__main__":
    main()
