"""Summarize scripts/responses_ab.sh's runs: per round responses/chat ratios, and their medians.

The acceptance figure: C=1 and C=8 out tok/s and TTFT p50 through /v1/responses within 5 % of the
same load through /v1/chat/completions (the median of the per-round ratios).
Usage: python scripts/responses_ab.py OUTDIR   (exit 1 when the acceptance is not met)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

APIS = ("chat", "responses")
LOADS = {"c1": "C=1, 128 tokens a request", "c8": "C=8 (8 clients), 64 tokens a request"}
FIGURES = ("output_tokens_per_s", "ttft_ms_p50", "gap_ms_p50", "stream_decode_tokens_per_s_median")
GATED = ("output_tokens_per_s", "ttft_ms_p50")  # the acceptance's two figures
TOLERANCE = 0.05


def load(out: Path, load_: str, api: str) -> dict[int, dict[str, Any]]:
    """The run (`http` #1) of each round's report for `load_` through `api`; unreadable ones skipped."""
    found = {}
    for path in out.glob(f"{load_}-{api}-*.json"):
        try:
            report = json.loads(path.read_text())
            found[int(path.stem.rsplit("-", 1)[1])] = report["runs"][0] | {"api": report.get("api")}
        except (ValueError, KeyError, IndexError) as exc:
            print(f"unreadable {path}: {exc}")
    return found


def show(name: str, values: list[float], digits: int = 3) -> str:
    """`name`: the median of `values` and each of them."""
    shown = [round(value, digits) for value in values]
    return f"{name}: median {round(statistics.median(values), digits)}  per round {shown}"


def ratios(chat: dict[int, dict[str, Any]], responses: dict[int, dict[str, Any]],
           rounds: list[int], key: str) -> list[float]:
    """responses/chat of `key` in each of `rounds` where both sides have it."""
    return [responses[r][key] / chat[r][key] for r in rounds
            if responses[r].get(key) and chat[r].get(key)]


def compare(out: Path, load_: str) -> bool:
    """Print one load's figures; True when its gated ratios are all within the tolerance."""
    chat, responses = load(out, load_, "chat"), load(out, load_, "responses")
    rounds = sorted(set(chat) & set(responses))
    if not rounds:
        print(f"== {LOADS[load_]}: no round with both APIs")
        return False
    print(f"== {LOADS[load_]}, rounds {rounds}")
    for api, runs in (("chat", chat), ("responses", responses)):
        values = [runs[r] for r in rounds]
        print(f"  {api} (report api {values[0]['api']}): "
              + show("out tok/s", [v["output_tokens_per_s"] or 0.0 for v in values], 1)
              + "  |  " + show("TTFT p50", [v["ttft_ms_p50"] or 0.0 for v in values], 1)
              + f"  |  errors {sum(v['errors'] for v in values)}"
              + f", completion tokens {sorted({v['completion_tokens'] for v in values})}")
    within = True
    for key in FIGURES:
        found = ratios(chat, responses, rounds, key)
        if not found:
            print(f"  responses/chat {key}: -")
            within = within and key not in GATED
            continue
        near = abs(statistics.median(found) - 1) <= TOLERANCE
        gate = f"  {'within' if near else 'NOT within'} 5 %" if key in GATED else ""
        print("  " + show(f"responses/chat {key}", found) + gate)
        within = within and (near or key not in GATED)
    return within


def main() -> None:
    out = Path(sys.argv[1])
    met = all([compare(out, load_) for load_ in LOADS])
    print(f"acceptance (C=1 and C=8 tok/s and TTFT p50 within 5 %): {'met' if met else 'NOT met'}")
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
