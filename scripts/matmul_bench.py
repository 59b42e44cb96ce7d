"""How close one decode row's matmuls come to memory bandwidth, per kernel path (issue 17, item 3).

Measures the host's memory bandwidth (sum and copy of tensors far above the L3), then times
y = x @ W.T for the demo models' Linear shapes (llmd/demo/sizes.py; vocab from the built
model) at M rows, torch threads 1 and 2, on every kernel path this torch build has:

    HF_HUB_OFFLINE=1 python scripts/matmul_bench.py                 # small and medium, M=1 and 8
    HF_HUB_OFFLINE=1 python scripts/matmul_bench.py --sizes small --rounds 7 --no-compile
    HF_HUB_OFFLINE=1 python scripts/matmul_bench.py --rows 1 --rotate-mib 0   # weights hot in cache

Paths (a path this torch lacks is skipped and named):
  f32 linear / bf16 linear   torch.nn.functional.linear, x and W in that dtype
  * llmd-pack8               llmd's own PackedLinear (onednn.py): _reorder_linear_weight(batch_size=8)
                             then mkldnn._linear_pointwise, exactly as the runner calls it
  * pack1 / packN            the same op on a weight packed for batch_size=1 / with no batch hint
  * mkldnn_linear            torch._C._nn.mkldnn_linear on mkldnn (opaque) x and W
  * int8 w-only              torch._weight_int8pack_mm: int8 W, per-output-channel scales in x's dtype
  bf16 int4 g64              torch._weight_int4pack_mm_for_cpu, 4-bit W in groups of 64 (bf16 scales+zeros)
  * compile                  torch.compile (inductor, C++ codegen, freezing) of one F.linear, M=1 only,
                             on the gate/up shape
Each timed call takes the next of enough copies of its weight to read --rotate-mib (96) MiB,
three times the 32 MiB L3, so the weight comes from memory as in a decode step (the demo
models' Linear weights are 50-440 MB); `--rotate-mib 0` times one weight, hot in the cache.
The compile rows are always hot (the weight is frozen into the graph): compare them with a
`--rotate-mib 0` run. Candidates alternate within each round (threads 1 and 2 alternate too); each cell is the
median of --rounds rounds after a warm-up. Columns:
  us          microseconds per call
  GB/s        the weight's bytes (int8/int4: packed bytes + scales) over that time
  %bw         GB/s over the measured read bandwidth at the same thread count
  t2/t1       time at 2 threads over time at 1 (near 1.0: the second core does not help)
The "step" rows add one decode step's Linear layers (q, k, v, o, gate, up, down per layer, and
lm_head) from the per-shape medians. Check `uptime` first: the figures are wall-clock.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from llmd.demo.sizes import demo_size
from llmd.engine.model.onednn import PackedLinear

Kernel = Callable[[], torch.Tensor]
THREADS = (1, 2)
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
DEFAULT_VOCAB = 1619


@dataclass(frozen=True, slots=True)
class Shape:
    """One Linear weight: N outputs x K inputs, used `count` times per decode step."""

    name: str
    n: int
    k: int
    count: int


@dataclass(frozen=True, slots=True)
class Prepared:
    """A candidate made ready for one shape: the call to time and the bytes it reads."""

    kernel: Kernel
    weight_bytes: int


Builder = Callable[[torch.Tensor, int], Prepared]  # (f32 weight, rows) -> prepared call


def wait_quiet() -> None:
    """Sleep while /tmp/QUIET exists (the shared host asks for quiet)."""
    while Path("/tmp/QUIET").exists():
        print("waiting: /tmp/QUIET exists", flush=True)
        time.sleep(30)


def host_report() -> str:
    """Load average, CPU model, cache sizes and the matmul-relevant CPU flags."""
    flags = set(Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split())
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    keep = [line.strip() for line in lscpu if line.startswith(("Model name", "L1d", "L2", "L3", "CPU(s)"))]
    have = [f"{flag}={'yes' if flag in flags else 'no'}" for flag in FLAGS]
    load = os.getloadavg()
    return "\n".join([*keep, "flags: " + " ".join(have),
                      f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}",
                      f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"])


def median_us(kernel: Kernel, calls: int, rounds: int = 1) -> float:
    """Median over `rounds` of the mean microseconds of `calls` back-to-back calls."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            kernel()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def bandwidth(rounds: int) -> dict[tuple[str, int, int], float]:
    """GB/s of a sum (bytes read) and a copy (bytes read + written) per size (MiB) and threads."""
    result: dict[tuple[str, int, int], float] = {}
    for mib in (256, 1024):
        src = torch.ones(mib * 2**20 // 4)
        for threads in THREADS:
            torch.set_num_threads(threads)
            result |= {(kind, mib, threads): gbs for kind, gbs in stream(src, rounds).items()}
    return result


def stream(src: torch.Tensor, rounds: int) -> dict[str, float]:
    """GB/s of summing `src` and of copying it into a fresh tensor of its size."""
    dst = torch.empty_like(src)
    median_us(lambda: src.sum() + dst.copy_(src).sum(), 2)  # warm-up, and dst's pages touched
    return {"sum": src.nbytes / median_us(lambda: src.sum(), 3, rounds) / 1e3,
            "copy": 2 * src.nbytes / median_us(lambda: dst.copy_(src), 3, rounds) / 1e3}


def read_bandwidth(table: dict[tuple[str, int, int], float], threads: int) -> float:
    """The best read (sum) bandwidth measured at `threads`."""
    return max(value for (kind, _, t), value in table.items() if kind == "sum" and t == threads)


def shapes(size: str, vocab: int) -> list[Shape]:
    """The distinct Linear shapes of one demo model and how often a decode step uses each."""
    s = demo_size(size)
    kv = s.num_kv_heads * s.head_dim
    h, i, layers = s.hidden_size, s.intermediate_size, s.num_layers
    return [Shape("q/o", h, h, 2 * layers), Shape("k/v", kv, h, 2 * layers),
            Shape("gate/up", i, h, 2 * layers), Shape("down", h, i, layers), Shape("lm_head", vocab, h, 1)]


def demo_vocab(size: str) -> int:
    """The built demo model's vocabulary size (the tokenizer's), or the known default."""
    home = os.environ.get("LLMD_HOME")
    config = (Path(home) if home else Path.home() / ".cache" / "llmd") / f"demo-model-{size}" / "config.json"
    return int(json.loads(config.read_text())["vocab_size"]) if config.exists() else DEFAULT_VOCAB


def plain(dtype: torch.dtype) -> Builder:
    """F.linear with x and W in `dtype`."""
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        w = weight.to(dtype, copy=True)  # a copy each time, even in f32, or rotation would cycle one
        x = torch.randn(rows, w.shape[1], dtype=dtype)
        return Prepared(lambda: F.linear(x, w), w.nbytes)
    return build


def llmd_packed(dtype: torch.dtype) -> Builder:
    """llmd's PackedLinear, built from an nn.Linear as pack_linears does."""
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
        linear.weight = torch.nn.Parameter(weight.to(dtype, copy=True), requires_grad=False)
        packed = PackedLinear(linear)
        x = torch.randn(rows, weight.shape[1], dtype=dtype)
        return Prepared(lambda: packed(x), weight.numel() * dtype.itemsize)
    return build


def reordered(dtype: torch.dtype, batch: int | None) -> Builder:
    """mkldnn._linear_pointwise on a weight packed for `batch` rows (None: no hint)."""
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        w = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), batch_size=batch)
        x = torch.randn(rows, weight.shape[1], dtype=dtype)
        return Prepared(lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                        weight.numel() * dtype.itemsize)
    return build


def mkldnn_linear(dtype: torch.dtype) -> Builder:
    """torch._C._nn.mkldnn_linear on opaque mkldnn tensors (conversion not timed)."""
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        w = weight.to(dtype).to_mkldnn()
        x = torch.randn(rows, weight.shape[1], dtype=dtype).to_mkldnn()
        return Prepared(lambda: torch._C._nn.mkldnn_linear(x, w, None), weight.numel() * dtype.itemsize)
    return build


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (int8 weight, f32 scales) with W ~ q * scale[:, None]."""
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    return torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


def int8_weight_only(dtype: torch.dtype) -> Builder:
    """torch._weight_int8pack_mm: x in `dtype`, int8 W, scales in `dtype`."""
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        q, scales = quantize_int8(weight)
        s = scales.to(dtype)
        x = torch.randn(rows, weight.shape[1], dtype=dtype)
        return Prepared(lambda: torch._weight_int8pack_mm(x, q, s), q.nbytes + s.nbytes)
    return build


def int4_weight_only(group: int = 64) -> Builder:
    """torch._weight_int4pack_mm_for_cpu: bf16 x, asymmetric 4-bit W in groups of `group`.

    The kernel wants N a multiple of 16: other weights (the vocab's lm_head) get zero rows added.
    """
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        weight = F.pad(weight, (0, 0, 0, -weight.shape[0] % 16))
        n, k = weight.shape
        grouped = weight.reshape(n, k // group, group)
        low, high = grouped.amin(-1), grouped.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-6)
        q = torch.round((grouped - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k), 2)
        zeros = low + 8 * scale
        sz = torch.stack([scale.T, zeros.T], dim=-1).to(torch.bfloat16).contiguous()
        x = torch.randn(rows, k, dtype=torch.bfloat16)
        return Prepared(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz),
                        packed.nbytes + sz.nbytes)
    return build


def candidates() -> tuple[dict[str, Builder], list[str]]:
    """The kernel paths this torch has, by name, and notes on the ones it lacks."""
    ops, aten, missing = torch.ops.mkldnn, torch.ops.aten, []
    found: dict[str, Builder] = {}
    for label, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        found[f"{label} linear"] = plain(dtype)
        if hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"):
            found[f"{label} llmd-pack8"] = llmd_packed(dtype)
            found[f"{label} pack1"] = reordered(dtype, 1)
            found[f"{label} packN"] = reordered(dtype, None)
        else:
            missing.append("mkldnn._reorder_linear_weight/_linear_pointwise")
        if hasattr(torch._C._nn, "mkldnn_linear"):
            found[f"{label} mkldnn_linear"] = mkldnn_linear(dtype)
        if hasattr(torch, "_weight_int8pack_mm"):
            found[f"{label} int8 w-only"] = int8_weight_only(dtype)
    if hasattr(aten, "_weight_int4pack_mm_for_cpu"):
        found["bf16 int4 g64"] = int4_weight_only()
    missing.append("aten._dyn_quant_matmul_4bit: present but KleidiAI (Arm) only; not timed")
    return found, missing


def compiled(dtype: torch.dtype) -> Builder:
    """torch.compile (inductor, freezing: weights folded and prepacked) of one bias-free F.linear."""
    def build(weight: torch.Tensor, rows: int) -> Prepared:
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
        linear.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)
        x = torch.randn(rows, weight.shape[1], dtype=dtype)
        torch._inductor.config.freezing = True
        fn = torch.compile(linear.eval(), dynamic=False)
        start = time.perf_counter()
        with torch.no_grad():
            fn(x)
        print(f"  compiled {str(dtype).removeprefix('torch.')} {tuple(weight.shape)} in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        return Prepared(lambda: fn(x), weight.numel() * dtype.itemsize)
    return build


Key = tuple[str, str, int, int]  # shape name, candidate, rows, threads


def prepare(size_shapes: list[Shape], builders: dict[str, Builder], rows: int, compile_ok: bool,
            rotate: int) -> dict[tuple[str, str], Prepared]:
    """Every (shape, candidate) call for `rows` rows; compile only M=1 gate/up."""
    torch.manual_seed(0)
    ready: dict[tuple[str, str], Prepared] = {}
    for shape in size_shapes:
        weight = torch.randn(shape.n, shape.k) / shape.k**0.5
        chosen = dict(builders)
        if compile_ok and rows == 1 and shape.name == "gate/up":
            chosen |= {"f32 compile": compiled(torch.float32), "bf16 compile": compiled(torch.bfloat16)}
        for name, builder in chosen.items():
            ready[shape.name, name] = rotating(builder, weight, rows, 0 if "compile" in name else rotate)
    return ready


def rotating(builder: Builder, weight: torch.Tensor, rows: int, rotate: int) -> Prepared:
    """Enough copies of one prepared call that cycling them reads `rotate` bytes: out of the cache.

    A decode step reads every weight once, and the model's weights exceed the L3, so a weight
    timed alone, hot in the cache, would claim more than memory bandwidth.
    """
    first = builder(weight, rows)
    copies = [first] + [builder(weight, rows) for _ in range(-(-rotate // first.weight_bytes) - 1)]
    if len(copies) == 1:
        return first
    turn = itertools.cycle([copy.kernel for copy in copies])
    return Prepared(lambda: next(turn)(), first.weight_bytes)


def time_rounds(ready: dict[tuple[str, str], Prepared], rows: int, rounds: int) -> dict[Key, float]:
    """Medians over `rounds`, each round alternating threads and every candidate once."""
    samples: dict[Key, list[float]] = {}
    with torch.no_grad():
        for _ in range(rounds + 1):  # the first round is the warm-up
            for threads in THREADS:
                torch.set_num_threads(threads)
                for (shape, name), prep in ready.items():
                    calls = max(10, int(2000 / max(median_us(prep.kernel, 3), 1.0)))
                    samples.setdefault((shape, name, rows, threads), []).append(median_us(prep.kernel, calls))
    return {key: statistics.median(values[1:]) for key, values in samples.items()}


def cell(us: float, nbytes: int, bw: float) -> str:
    """`us GB/s %bw` for one timing."""
    gbs = nbytes / us / 1e3
    return f"{us:8.1f} {gbs:6.1f} {100 * gbs / bw:4.0f}%"


def print_table(size: str, size_shapes: list[Shape], ready: dict[int, dict[tuple[str, str], Prepared]],
                times: dict[Key, float], bw: dict[int, float]) -> None:
    """One table per model size: a row per shape, rows M and candidate, then the step totals."""
    print(f"\n## {size}: " + ", ".join(f"{s.name} {s.n}x{s.k} (x{s.count})" for s in size_shapes))
    print(f"{'shape':8} {'M':>2} {'candidate':19} {'t=1 us':>8} {'GB/s':>6} {'%bw':>5} "
          f"{'t=2 us':>8} {'GB/s':>6} {'%bw':>5} {'t2/t1':>5}")
    for shape in [*size_shapes, None]:
        for rows, preps in ready.items():
            for name in dict.fromkeys(n for _, n in preps):
                line = row(shape, size_shapes, name, rows, preps, times, bw)
                if line:
                    print(line)


def row(shape: Shape | None, size_shapes: list[Shape], name: str, rows: int,
        preps: dict[tuple[str, str], Prepared], times: dict[Key, float], bw: dict[int, float]) -> str | None:
    """One table line: a shape's timing, or (shape None) the step total over all shapes."""
    parts = [s for s in size_shapes if shape is None or s is shape]
    if any((s.name, name) not in preps for s in parts):
        return None
    weight = 1 if shape else 0
    us = {t: sum(times[s.name, name, rows, t] * (weight or s.count) for s in parts) for t in THREADS}
    nbytes = sum(preps[s.name, name].weight_bytes * (weight or s.count) for s in parts)
    label = shape.name if shape else "step"
    return (f"{label:8} {rows:2} {name:19} {cell(us[1], nbytes, bw[1])} {cell(us[2], nbytes, bw[2])} "
            f"{us[2] / us[1]:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "medium"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--rotate-mib", type=int, default=96,
                        help="weight bytes each timed call cycles through (0: one weight, hot in cache)")
    args = parser.parse_args()
    wait_quiet()
    print(host_report())
    table = bandwidth(args.rounds)
    for (kind, mib, threads), gbs in sorted(table.items()):
        print(f"bandwidth {kind:4} {mib:5} MiB threads={threads}: {gbs:6.1f} GB/s")
    bw = {t: read_bandwidth(table, t) for t in THREADS}
    builders, missing = candidates()
    print("not timed: " + "; ".join(dict.fromkeys(missing)))
    for size in args.sizes:
        run_size(size, builders, args, bw)
    print(f"\nload average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


def run_size(size: str, builders: dict[str, Builder], args: argparse.Namespace, bw: dict[int, float]) -> None:
    """Prepare, time and print one model size."""
    wait_quiet()
    size_shapes = shapes(size, demo_vocab(size))
    times: dict[Key, float] = {}
    ready: dict[int, dict[tuple[str, str], Prepared]] = {}
    for rows in args.rows:  # one row count's copies in memory at a time
        preps = prepare(size_shapes, builders, rows, not args.no_compile, args.rotate_mib * 2**20)
        times |= time_rounds(preps, rows, args.rounds)
        ready[rows] = {key: Prepared(lambda: torch.empty(0), p.weight_bytes) for key, p in preps.items()}
        del preps
        gc.collect()
    print_table(size, size_shapes, ready, times, bw)


if __name__ == "__main__":
    main()
