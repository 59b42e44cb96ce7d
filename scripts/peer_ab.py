"""Summarize side-by-side runs: per round ratios of side A's figures to side B's, and their medians.

scripts/peer_ab.sh (llmd against llama-server: sides `llmd` and `peer`) and scripts/serving_ab.sh
(llmd over HTTP against its own runner in-process, `http` and `inproc`, or against its engine
in-process, `http` and `engine`) write one `llmd bench --json` report per load, side and round,
named LOAD-SIDE-ROUND.json. Issue 17's acceptance reads
the ratios: C=1 out tok/s >= 0.8x llama-server and C=8 >= 1.0x; HTTP / in-process >= 0.95 at C=1
and >= 0.9 at C=8. A ratio above 1 means A's figure is the larger (for TTFT and gaps, the worse).
Where a side's runs kept /metrics scrapes (NAME.metrics-before/-after: serving_ab.sh's daemon), it
also prints what each step cost the worker beyond its forward pass, beside the CPU the measuring
client spent per token (its report's note): on a host with few cores that CPU is taken from the
server's, a cost the in-process side never pays.
Usage: python scripts/peer_ab.py OUTDIR [A B]     (default: llmd peer)
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

SIDES = ("llmd", "peer")
LOADS = {"c1": "C=1, 128 tokens a request", "c8": "C=8 (8 clients), 64 tokens a request"}
FIGURES = ("output_tokens_per_s", "stream_decode_tokens_per_s_median", "ttft_ms_p50", "gap_ms_p50",
           "gap_ms_max")


def runs(out: Path, load: str, side: str) -> dict[int, dict[str, Any]]:
    """Each round's run of `load` against `side`, by round; unreadable reports are named and skipped."""
    found = {}
    for path in out.glob(f"{load}-{side}-*.json"):
        try:
            found[int(path.stem.rsplit("-", 1)[1])] = json.loads(path.read_text())["runs"][0]
        except (ValueError, KeyError, IndexError) as exc:
            print(f"unreadable {path}: {exc}")
    return found


def summarize(out: Path, load: str, sides: tuple[str, str]) -> None:
    """Print one load's figures per side and the first side's ratio to the second's of each."""
    first, second = sides
    by_side = {side: runs(out, load, side) for side in sides}
    rounds = sorted(set(by_side[first]) & set(by_side[second]))
    print(f"== {LOADS[load]}, rounds {rounds}")
    if not rounds:
        return
    for side, found in by_side.items():
        values = [found[r] for r in rounds]
        shown = ", ".join(f"{key} {statistics.median(v[key] or 0.0 for v in values):.1f}" for key in FIGURES)
        tokens = sorted({v["completion_tokens"] for v in values})
        print(f"  {side:<6} medians: {shown}; errors {sum(v['errors'] for v in values)}, tokens {tokens}")
    for key in FIGURES:
        ratios = [by_side[first][r][key] / by_side[second][r][key] for r in rounds
                  if by_side[first][r].get(key) and by_side[second][r].get(key)]
        if ratios:
            print(f"  {first}/{second} {key}: median {statistics.median(ratios):.3f}  "
                  f"per round {[round(ratio, 3) for ratio in ratios]}")


def engine_seconds(path: Path) -> dict[str, float]:
    """The `llmd_engine_*` samples of a /metrics scrape (scripts/serving_ab.sh keeps them)."""
    samples = (line.split() for line in path.read_text().splitlines() if line.startswith("llmd_engine_"))
    return {name: float(value) for name, value in samples}


def client_us_per_token(report: Path) -> float | None:
    """The measuring client's CPU per completion token (`llmd bench`'s note), in microseconds."""
    try:
        notes = json.loads(report.read_text())["notes"]
    except (OSError, ValueError, KeyError):
        return None
    said = re.compile(r"client CPU while measuring: .*?([0-9.]+) ms per completion token")
    found = (said.search(note) for note in notes)
    return next((float(match.group(1)) * 1000 for match in found if match), None)


def serving_share(out: Path, load: str, side: str) -> None:
    """Per round, what a step cost the daemon's worker beyond its forward pass (detokenizing,
    framing and writing the tokens), from the /metrics scrapes kept around each run."""
    shares = []
    for before in sorted(out.glob(f"{load}-{side}-*.metrics-before")):
        after = before.with_name(before.name.replace("-before", "-after"))
        if not after.exists():
            continue
        a, b = engine_seconds(before), engine_seconds(after)
        try:
            steps = b["llmd_engine_steps_total"] - a["llmd_engine_steps_total"]
            whole = b["llmd_engine_step_seconds_total"] - a["llmd_engine_step_seconds_total"]
            forward = b["llmd_engine_forward_seconds_total"] - a["llmd_engine_forward_seconds_total"]
        except KeyError as exc:
            print(f"  {before.name}: no {exc} sample")
            continue
        if steps > 0 and whole > 0:
            shares.append((whole - forward) / whole)
            name = before.name.split(".")[0]
            client = client_us_per_token(out / f"{name}.json")
            said = "" if client is None else f"; the client's CPU {client:.0f} us a token"
            print(f"  {name}: {steps:.0f} steps, forward {forward / steps * 1e6:.0f} us "
                  f"and the rest {(whole - forward) / steps * 1e6:.0f} us a step ({shares[-1]:.1%}){said}")
    if shares:
        print(f"  {side}: steps beyond their forward pass, median {statistics.median(shares):.1%}")


def main() -> None:
    out = Path(sys.argv[1])
    sides = (sys.argv[2], sys.argv[3]) if len(sys.argv) == 4 else SIDES
    for load in LOADS:
        summarize(out, load, sides)
        for side in sides:
            serving_share(out, load, side)


if __name__ == "__main__":
    main()
