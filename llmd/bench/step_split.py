"""Where a decode step's time goes: profiler ops sorted into categories, and the rest.

Pure (no torch): `scripts/profile_step.py` turns the profiler's events into `OpRow`s (an op's
name, its self CPU time, the names of the ops and ranges it ran inside) and hands them here.
An op belongs to the first category that claims it, looked up by what it runs inside before
its own name: anything inside the sampling range is sampling, anything inside SDPA attention,
anything inside a matmul (its transposes, its GEMM) a matmul. "Python and dispatch" is what the
ops' self times leave of the step's wall time. Each category is its median over the steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

# The model side's range around a step's sampling (llmd/engine/model/sequences.py).
SAMPLING_RANGE = "llmd.sampling"
STEP_RANGE = "llmd.step"  # the profiling script's range around each decode step
CATEGORIES = ("matmul", "attention", "norm/rope/act", "sampling", "kv/copies", "other ops")
PYTHON = "python+dispatch"

MATMUL_OPS = frozenset({"mm", "addmm", "linear", "bmm", "matmul", "baddbmm", "addmv", "mv", "dot",
                        "_weight_int8pack_mm"})
MATMUL_NAMESPACES = ("mkldnn::", "onednn::", "aten::mkldnn_", "aten::_mkldnn")
ATTENTION_OPS = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_softmax", "softmax",  # outside sampling only softmax in attention runs in a decode step
})
# RMS norm (pow, mean, rsqrt, mul, dtype casts), rotary (cat, neg, mul, add, cos, sin), the
# activation, residual adds: elementwise work. In-place variants (`add_`) count as their op.
ELEMENTWISE_OPS = frozenset({
    "pow", "mean", "rsqrt", "sqrt", "mul", "add", "sub", "div", "neg", "cat", "silu", "gelu",
    "sigmoid", "tanh", "exp", "cos", "sin", "to", "_to_copy", "sum",
})
# Writes into the KV cache, inputs made contiguous, embedding and logits gathers.
COPY_OPS = frozenset({
    "copy", "clone", "contiguous", "index", "index_put", "index_copy", "index_select", "embedding",
    "slice_scatter", "select_scatter", "gather", "scatter", "fill", "zero", "narrow_copy",
    "masked_fill", "where",
})


@dataclass(frozen=True, slots=True)
class OpRow:
    """One profiled op or range: its name, self CPU microseconds, the names it ran inside, and
    which profiled step it belongs to."""

    name: str
    self_us: float
    ancestors: tuple[str, ...] = ()
    step: int = 0


@dataclass(frozen=True, slots=True)
class StepSplit:
    """One measured configuration: wall time per step and the microseconds of each category."""

    model: str
    profile: str
    batch: int
    wall_us: float  # per step, measured without the profiler
    profiled_us: float  # per step, under the profiler
    calls: float  # torch calls from Python per step (ops not inside another op)
    category_us: dict[str, float]  # per step, CATEGORIES and PYTHON
    weight_bytes: int = 0  # of the Linear layers, each read once per step
    others_cpu: float = 0.0  # share of the host's CPU that other processes used meanwhile

    @property
    def matmul_gb_s(self) -> float:
        """The Linear weights' bytes over the step's matmul time: the bandwidth its GEMMs reach."""
        matmul_us = self.category_us["matmul"]
        return self.weight_bytes / matmul_us / 1e3 if matmul_us > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second at the unprofiled step time: one per row per step."""
        return self.batch * 1e6 / self.wall_us

    def share(self, category: str) -> float:
        """The category's fraction of the unprofiled step."""
        return self.category_us[category] / self.wall_us


def category(row: OpRow) -> str:
    """The category of one op: by the ops and ranges it ran inside (outermost first), then by
    its own name. A step range's own self time is Python (PYTHON)."""
    if row.name == STEP_RANGE:
        return PYTHON
    for name in (*row.ancestors, row.name):
        found = _claimed_by(name)
        if found is not None:
            return found
    return "other ops"


def _claimed_by(name: str) -> str | None:
    """The category that `name` claims, for itself and for every op run inside it."""
    if name == SAMPLING_RANGE:
        return "sampling"
    op = _short(name)
    if op in ATTENTION_OPS:
        return "attention"
    if op in MATMUL_OPS or name.startswith(MATMUL_NAMESPACES):
        return "matmul"
    if op in ELEMENTWISE_OPS:
        return "norm/rope/act"  # a cast's copy_ belongs to the cast
    if op in COPY_OPS:
        return "kv/copies"
    return None


def _short(name: str) -> str:
    """`aten::add_` → `add`: the op without its namespace or in-place mark."""
    return name.rpartition("::")[2].rstrip("_") or name


def category_totals(rows: Iterable[OpRow]) -> dict[str, float]:
    """Self microseconds summed per op category (every one present, 0 when empty); the step
    ranges' own self time is left to PYTHON, which is what the ops leave of the wall time."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for row in rows:
        found = category(row)
        if found != PYTHON:
            totals[found] += row.self_us
    return totals


def step_totals(rows: Iterable[OpRow], steps: int) -> list[dict[str, float]]:
    """`category_totals` of each of the steps 0 .. steps - 1 (rows outside them are left out)."""
    by_step: list[list[OpRow]] = [[] for _ in range(steps)]
    for row in rows:
        if 0 <= row.step < steps:
            by_step[row.step].append(row)
    return [category_totals(step) for step in by_step]


def torch_calls(rows: Iterable[OpRow]) -> int:
    """Ops called from Python: not inside another op (llmd's own ranges do not count as ops)."""
    return sum(1 for row in rows if not _is_range(row.name) and not any(map(_is_op, row.ancestors)))


def _is_range(name: str) -> bool:
    return name.startswith("llmd.")


def _is_op(name: str) -> bool:
    return not _is_range(name)


@dataclass(frozen=True, slots=True)
class StepRun:
    """What was measured: the rows of `steps` profiled steps, and the median wall time of a step
    without the profiler and under it."""

    rows: list[OpRow]
    steps: int
    wall_us: float
    profiled_us: float
    others_cpu: float = 0.0  # share of the host's CPU that other processes used meanwhile


def split_step(run: StepRun, config: tuple[str, str, int], weight_bytes: int = 0) -> StepSplit:
    """Each category's median over the profiled steps; Python and dispatch is the unprofiled
    step's median wall time minus them all (`config`: model, profile, batch). Medians, so that
    a step slowed by another process on the machine does not move the table."""
    per_step = step_totals(run.rows, run.steps)
    medians = {name: statistics.median(step[name] for step in per_step) for name in CATEGORIES}
    medians[PYTHON] = run.wall_us - sum(medians.values())
    model, profile, batch = config
    calls = torch_calls(run.rows) / run.steps
    return StepSplit(model, profile, batch, run.wall_us, run.profiled_us, calls, medians, weight_bytes,
                     run.others_cpu)
