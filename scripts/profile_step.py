"""Where each microsecond of a decode step goes: llmd's runner under torch's profiler.

Loads a demo model through llmd's own runner (as `llmd bench --in-process` does), prefills
C copies of one chat prompt, warms up, then times `--steps` decode steps at batch size C and
runs as many under `torch.profiler` (CPU, no shapes), alternating in `--rounds` blocks, and
sorts the ops' self CPU time into categories (llmd/bench/step_split.py says which op goes where).

    HF_HUB_OFFLINE=1 python scripts/profile_step.py                  # small, cpu, C=1 and 8
    HF_HUB_OFFLINE=1 python scripts/profile_step.py --matrix         # small/medium x cpu/cpu-bf16 x C=1/8
    HF_HUB_OFFLINE=1 python scripts/profile_step.py --model-size medium --profile cpu-bf16 --batch 8 --top 20

Demo models are built on first use in ~/.cache/llmd (or $LLMD_HOME); `--model DIR` takes any.
Check the host is quiet first (`uptime`): the numbers are wall-clock.

Columns, all per decode step but the first:
  others %    the host's CPU that other processes used meanwhile: over a few %, rerun when quiet
  step us     wall time of one step without the profiler (runner.decode of C rows); tok/s = C / that
  prof +%     how much slower the step ran under the profiler (its overhead)
  calls       torch calls from Python (ops not inside another op): what a compiled step removes
  mm GB/s     the Linear weights' bytes (each read once a step) over the matmul time
  matmul      Linear layers and lm_head: aten mm/addmm/linear/bmm/matmul, oneDNN's _linear_pointwise
  attention   scaled_dot_product_attention and everything inside it (its softmax too)
  norm/rope/act  RMS norm (pow, mean, rsqrt, mul, casts), rotary (cat, neg, mul, add), SiLU,
              residual adds: the elementwise ops
  sampling    everything inside the runner's `llmd.sampling` range (usable rows, argmax, casts)
  kv/copies   KV cache writes (copy_), .contiguous(), the embedding and logits gathers
  other ops   views, allocations, anything not claimed above (`--top` lists the ops)
  python+dispatch  step us minus every op's self time: Python, module calls, the dispatcher
Each category cell is "us share" (share of step us), the category's median over the profiled
steps; step us is the median unprofiled step, so a few steps slowed by another process move little.
python+dispatch is a lower bound: an op's self time starts after Python has parsed its
arguments (that part is counted as Python), but the profiler's own bookkeeping for the ops
nested inside an op lands in that op's self time; the true figure lies between python+dispatch
and python+dispatch + prof +% of the step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from llmd.bench.decoder import InProcessDecoder
from llmd.bench.inprocess import fitted_prompt
from llmd.bench.step_split import (
    CATEGORIES,
    PYTHON,
    STEP_RANGE,
    OpRow,
    StepRun,
    StepSplit,
    category,
    split_step,
)
from llmd.demo.build import ensure_demo_model
from llmd.engine.model.int8 import Int8Linear
from llmd.engine.model.onednn import PackedLinear, PackedPart
from llmd.engine.types import Request

SIZES, PROFILES, BATCHES = ("small", "medium"), ("cpu", "cpu-bf16"), (1, 8)
Config = tuple[str, str, int]  # model, profile, batch size


@dataclass(frozen=True, slots=True)
class Case:
    """One model loaded under one profile, stepped at each batch size."""

    size: str
    profile: str
    batches: tuple[int, ...]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", default="small", choices=SIZES)
    parser.add_argument("--model", type=Path, help="a model directory instead of the demo model")
    parser.add_argument("--profile", default="cpu", help="profile name or YAML path (default cpu)")
    parser.add_argument("--batch", type=int, action="append",
                        help="rows per step, repeatable (default 1 and 8)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed, and as many profiled")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of timed and profiled steps")
    parser.add_argument("--warmup", type=int, default=8, help="decode steps run first, untimed")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--matrix", action="store_true",
                        help="small and medium x cpu and cpu-bf16 x C=1 and 8")
    parser.add_argument("--top", type=int, default=0, help="also list the N ops with the most self time")
    return parser.parse_args(argv)


def cases(args: argparse.Namespace) -> list[Case]:
    """What to run: the whole matrix, or the one model and profile asked."""
    if args.matrix:
        return [Case(size, name, BATCHES) for size in SIZES for name in PROFILES]
    return [Case(args.model_size, args.profile, tuple(args.batch or BATCHES))]


def run_case(case: Case, args: argparse.Namespace) -> Iterator[StepSplit]:
    """Load the model once under the case's profile; measure each batch size on it."""
    model = args.model or ensure_demo_model(case.size)
    decoder = InProcessDecoder(model, profile=case.profile)
    prompt, _ = fitted_prompt(decoder, args.prompt_tokens)
    for batch in case.batches:
        print(f"{model.name} {case.profile} C={batch}: load average {load_average()}", file=sys.stderr)
        yield measure(decoder, [prompt] * batch, args, (model.name, case.profile, batch))
    del decoder
    gc.collect()


def measure(
    decoder: InProcessDecoder, prompts: list[list[int]], args: argparse.Namespace, config: Config
) -> StepSplit:
    """Prefill, warm up, then `args.rounds` rounds of timed steps followed by profiled ones:
    alternating, so that the machine's drift hits both alike."""
    block = max(1, args.steps // args.rounds)
    requests = prefilled(decoder, prompts, 1 + args.warmup + 2 * block * args.rounds)
    step_times(decoder, requests, args.warmup)
    host = HostCpu()
    walls: list[float] = []
    profiled: list[float] = []
    rows: list[OpRow] = []
    for _ in range(args.rounds):
        walls += step_times(decoder, requests, block)
        rows += profiled_steps(decoder, requests, block, profiled)
    decoder.release(requests)
    if args.top:
        print_top(rows, len(profiled), args.top, config)
    run = StepRun(rows, len(profiled), statistics.median(walls), statistics.median(profiled), host.others())
    return split_step(run, config, linear_bytes(decoder.runner.model))


def prefilled(decoder: InProcessDecoder, prompts: list[list[int]], tokens: int) -> list[Request]:
    """Greedy requests for `prompts` of up to `tokens` tokens, each prefilled to its first."""
    requests = decoder.requests(prompts, tokens)
    for request in requests:
        decoder.runner.first_token(request)
    return requests


def profiled_steps(
    decoder: InProcessDecoder, requests: list[Request], steps: int, times: list[float]
) -> list[OpRow]:
    """`steps` decode steps under the profiler, their times appended to `times`; their ops'
    rows, numbered on from the steps already in `times`."""
    first = len(times)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as profiler:
        times += step_times(decoder, requests, steps, STEP_RANGE)
    return op_rows(profiler.events(), first)


def step_times(
    decoder: InProcessDecoder, requests: list[Request], steps: int, label: str | None = None
) -> list[float]:
    """Run `steps` decode steps of every request together (each in a profiler range `label`);
    the microseconds of each."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        with record_function(label) if label else contextlib.nullcontext():
            decoder.runner.decode(requests)
        times.append((time.perf_counter() - started) * 1e6)
    return times


def op_rows(events: Any, first: int = 0) -> list[OpRow]:
    """The profiler's CPU events as rows: name, self time, the names it ran inside, its step
    (numbered from `first` by their step range, in the order the profiler lists them)."""
    steps: dict[int, int] = {}
    rows = []
    for event in events:
        names, root = ancestors(event)
        step = first + steps.setdefault(id(root), len(steps)) if root is not None else -1
        rows.append(OpRow(event.name, float(event.self_cpu_time_total), names, step))
    return rows


def ancestors(event: Any) -> tuple[tuple[str, ...], Any]:
    """The names of the ops and ranges around `event`, outermost first, and the step range it
    ran in (itself, for a step range; None outside the steps)."""
    names, outermost = [], event
    while outermost.cpu_parent is not None:
        outermost = outermost.cpu_parent
        names.append(outermost.name)
    return tuple(reversed(names)), outermost if outermost.name == STEP_RANGE else None


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of every Linear layer's weight (packed for oneDNN, int8, or plain): what a step must read."""
    total = 0
    for module in model.modules():
        if isinstance(module, Int8Linear):
            total += module.qweight.numel() + module.scales.numel() * module.scales.element_size()
        elif isinstance(module, torch.nn.Linear | PackedLinear | PackedPart):
            weight = module.weight if isinstance(module, torch.nn.Linear) else packed_weight(module)
            total += module.in_features * module.out_features * weight.element_size()
    return total


def packed_weight(module: PackedLinear | PackedPart) -> torch.Tensor:
    return module.packed_weight if isinstance(module, PackedLinear) else module.group.packed_weight


def print_top(rows: list[OpRow], steps: int, top: int, config: Config) -> None:
    """The ops with the most self time per step, with the category each went to."""
    totals: defaultdict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        totals[row.name, category(row)] += row.self_us / steps
    print(f"\n{config[0]} {config[1]} C={config[2]}: top ops, self us per step (mean)")
    for (name, where), us in sorted(totals.items(), key=lambda item: -item[1])[:top]:
        print(f"  {us:9.1f}  {where:14}  {name}")


def table(splits: list[StepSplit]) -> str:
    """One row per model x profile x C; each category as microseconds and share of the step."""
    heads = ["model", "profile", "C", "others %", "step us", "tok/s", "prof +%", "calls", "mm GB/s",
             *CATEGORIES, PYTHON]
    lines = [" | ".join(heads), " | ".join("---" for _ in heads)]
    lines += [" | ".join(_cells(split)) for split in splits]
    return "\n".join(f"| {line} |" for line in lines)


def _cells(split: StepSplit) -> list[str]:
    overhead = 100 * (split.profiled_us / split.wall_us - 1)
    shares = [f"{split.category_us[name]:.0f} {100 * split.share(name):.0f}%"
              for name in (*CATEGORIES, PYTHON)]
    return [split.model, split.profile, str(split.batch), f"{100 * split.others_cpu:.0f}",
            f"{split.wall_us:.0f}", f"{split.tokens_per_s:.0f}", f"{overhead:.0f}", f"{split.calls:.0f}",
            f"{split.matmul_gb_s:.1f}", *shares]


class HostCpu:
    """CPU time that processes other than this one use on the host from now on."""

    def __init__(self) -> None:
        self._start = self._now()

    def others(self) -> float:
        """Their share of all the host's cores since this was made."""
        (started, busy, own), (now, busy_now, own_now) = self._start, self._now()
        return max(0.0, (busy_now - busy) - (own_now - own)) / ((now - started) * (psutil.cpu_count() or 1))

    @staticmethod
    def _now() -> tuple[float, float, float]:
        host, own = psutil.cpu_times(), psutil.Process().cpu_times()
        return time.monotonic(), sum(host) - host.idle - getattr(host, "iowait", 0.0), own.user + own.system


def load_average() -> str:
    """The host's 1, 5 and 15 minute load averages: a busy host slows every step."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Measure every case asked and print the table, with the load average around it."""
    args = parse_args(argv)
    torch.manual_seed(0)
    before = load_average()
    splits = [split for case in cases(args) for split in run_case(case, args)]
    print(table(splits))
    print(f"\nload average (1/5/15 min) at the start: {before}; at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
