"""Summarize scripts/peer_ab.sh's runs: per round llmd/llama-server ratios, and their medians.

Issue 17's acceptance reads these: C=1 out tok/s >= 0.8x llama-server, C=8 >= 1.0x, with TTFT p50
and gap max no worse than before. A ratio above 1 means llmd's figure is the larger (for TTFT
and gaps, the larger is the worse).
Usage: python scripts/peer_ab.py OUTDIR
"""

from __future__ import annotations

import json
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


def summarize(out: Path, load: str) -> None:
    """Print one load's figures per side and the llmd/llama-server ratio of each."""
    by_side = {side: runs(out, load, side) for side in SIDES}
    rounds = sorted(set(by_side["llmd"]) & set(by_side["peer"]))
    print(f"== {LOADS[load]}, rounds {rounds}")
    if not rounds:
        return
    for side, found in by_side.items():
        values = [found[r] for r in rounds]
        shown = ", ".join(f"{key} {statistics.median(v[key] or 0.0 for v in values):.1f}" for key in FIGURES)
        tokens = sorted({v["completion_tokens"] for v in values})
        print(f"  {side:<5} medians: {shown}; errors {sum(v['errors'] for v in values)}, tokens {tokens}")
    for key in FIGURES:
        ratios = [by_side["llmd"][r][key] / by_side["peer"][r][key] for r in rounds
                  if by_side["llmd"][r].get(key) and by_side["peer"][r].get(key)]
        if ratios:
            print(f"  llmd/llama-server {key}: median {statistics.median(ratios):.3f}  "
                  f"per round {[round(ratio, 3) for ratio in ratios]}")


def main() -> None:
    out = Path(sys.argv[1])
    for load in LOADS:
        summarize(out, load)


if __name__ == "__main__":
    main()
