"""Decode steps as one compiled graph: no Python per layer.

One user with one editor is the commonest local case, and at one row the eager direct walk
(layer_walk.DirectDecoder) spends a good part of a step dispatching ops one by one: on the small
demo model (bfloat16, 2-core EPYC) 6.9 ms a step eager against 5.7 ms compiled. `LoneStep` runs
the same walk under torch.compile (inductor, its C++ wrapper, weights frozen into the graph as
they are: oneDNN-packed weights stay the one copy), for exactly one running row.

Its inputs are the token, its position and, per layer, the cache window the row attends to: views
of the static batch's tensors from the row's first column to the one this step writes, inclusive.
The graph writes the new key and value into that last column and attends over the window. The
window's length is its one dynamic dimension (every other size is a constant of the graph, which
inductor specialises its kernels for: medium demo model, int8, 12.1 -> 9.8 ms a step against
compiling every size as a symbol), so one graph serves every length from `MIN_WINDOW` up:
its first `run` compiles it, at load, where probes.probe_lone proves it against the eager walk;
from then on any recompile is an error that retires it (`run` returns None and the step runs
eager, as it does for a window shorter than `MIN_WINDOW`, where a size of 1 would specialise, and
for a window of the whole row, which is contiguous where the graph was traced on a strided view).

Calling a compiled function costs its guards: before each call dynamo checks the inputs, the
module's attributes and the shapes' relations, 0.2-0.4 ms of a 5 ms step on the small demo model.
Between calls only the window's length changes, and the relations that involve it are bounds
(`2 <= s`) and the contiguity test above. So once `check` has passed, with every guard evaluated,
at the shortest and the longest window the step takes, `run` skips all but the tensors' own checks
(dtype, fixed sizes and strides: `skip_guard_eval_unsafe`) and checks the length itself
(`takes`). Those checks also learn how to call inductor's graph without dynamo at all
(graph_call.py), and once that is proven `run` does. Ints are specialised while tracing
(`specialize_int`): head counts and the like are constants of the graph, not symbols to guard
and to pass in on every call.

With `autotune` (`lone_step: max-autotune`) inductor also chooses each matmul's kernel by timing
them at compile (`AUTOTUNE`).

`BatchStep` (`batch_step: compiled`) is the same graph for two or more rows: the rows up to the
last slot in use, each attending to the columns its mask marks in the same window. The row count
is a second dynamic dimension, so one graph serves every batch from 2 rows to the slots. It is
never autotuned: past a row or two inductor's template multiplies bfloat16 in float32 and loses
to oneDNN's packed kernel (small demo model, every matmul of a step: 4 rows 4.4 vs 3.5 ms, 8 rows
5.8 vs 4.5 ms), so its matmuls stay oneDNN's (or the int8 kernel) on the one copy of the weights.
On the 2-core EPYC an 8-row step in the runner (scripts/batch_step_ab.py) went 7.7 -> 5.8 ms
(small, bfloat16), 14.2 -> 12.4 ms (small, float32), 27.4 -> 23.1 ms (medium, bfloat16), 35.0 ->
28.8 ms (medium, int8).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from llmd.engine.model import graph_call
from llmd.engine.model.attention import decode_rows
from llmd.engine.model.layer_walk import DirectDecoder, import_inductor

log = logging.getLogger("llmd.engine")

# Window lengths below this run eager: dynamo specialises sizes 0 and 1.
MIN_WINDOW = 2
# Likewise the rows of `BatchStep`; one row is `LoneStep`'s.
MIN_ROWS = 2

# `lone_step: max-autotune`: each matmul of the graph is timed at load in two kernels, torch's own
# (what eager runs: oneDNN's on the same packed weight, or the int8 one) and inductor's C++ GEMM
# template (its micro-kernel over its own copy of the weight, blocked for one row), and the faster
# one is compiled in. At one row the template reads the weights at close to the memory's bandwidth
# where oneDNN reaches a third of it: on the 2-core EPYC, small demo model bfloat16, 5.4 -> 2.8 ms
# a step in-process.
# Where the template wins, its copy is a second copy of that weight (the preflight plans for
# every one). Timing the kernels costs start-up: small model bfloat16 35 s against 21 s for the
# plain compiled step, 56 s with no timings in inductor's on-disk cache; medium int8 112 s cold.
AUTOTUNE: dict[str, Any] = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                            "max_autotune_report_choices_stats": False}


class CompiledStep:
    """A decode step of the direct walk compiled over per-layer cache windows; retired on any failure.

    Its inputs: the rows' tokens and positions [rows, 1], per layer the keys and values of the
    window [rows, kv_heads, window, dim], and which of the window's columns each row attends to
    ([rows, window], or None: all of them)."""

    name = "decode step"  # what the logs call it
    min_rows = max_rows = 1  # the rows the graph takes

    def __init__(self, decoder: DirectDecoder, capacity: int, autotune: bool = False) -> None:
        """`capacity`: the cache's columns; a window that long is the whole row, and runs eager.
        `autotune`: inductor's max-autotune chooses each matmul's kernel (see AUTOTUNE)."""
        import_inductor()
        self._decoder = decoder
        self.autotune = autotune
        # dynamic: only the sizes `_mark_dynamic` marks (the window; a batch's rows)
        self._compiled = torch.compile(self._step, fullgraph=True)
        self.capacity = capacity
        self.compile_seconds: float | None = None  # None until the first run compiles
        self.retired: str | None = None  # why it no longer runs
        self.unguarded = False  # set once `check` passed over the shapes `run` takes
        # autotune: the matmuls compiled as inductor's GEMM template (0 also when the whole graph
        # came from inductor's cache: nothing was generated); None until compiled
        self.templated: int | None = None
        # the graph called without dynamo (graph_call.py), learnt by `check`; else why not
        self.direct: graph_call.GraphCall | None = None
        self.direct_problem: str | None = "not learnt"
        self._seen: graph_call.Seen | None = None  # `check`'s first call, to learn from

    def takes(self, rows: int, window: int) -> bool:
        """Whether `run` runs the graph for this many rows over a window of this many columns."""
        return self.min_rows <= rows <= self.max_rows and MIN_WINDOW <= window < self.capacity

    def run(self, keys: list[torch.Tensor], values: list[torch.Tensor], input_ids: torch.Tensor,
            position_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """The rows' logits [rows, 1, vocab], their keys and values written at each window's last
        column; None when the step must run eager (a shape it does not `take`, or retired:
        nothing was written).

        The first run compiles (the probe's, at load); any later compile is a failure."""
        if self.retired is not None or not self.takes(input_ids.shape[0], keys[0].shape[2]):
            return None
        try:
            if self.compile_seconds is None:
                return self._compile(input_ids, position_ids, keys, values, mask)
            if self.direct is not None and self.unguarded:
                logits = self.direct(_tensors(input_ids, position_ids, keys, values, mask))
                if logits is not None:
                    return logits
            with torch.compiler.set_stance("fail_on_recompile", skip_guard_eval_unsafe=self.unguarded):
                return self._compiled(input_ids, position_ids, keys, values, mask)
        except Exception as exc:  # a recompile, or anything else: eager from now on
            self.retired = _described(exc)
            log.warning("the compiled %s is retired, eager from now on (%s)", self.name, self.retired)
            return None

    def check(self, keys: list[torch.Tensor], values: list[torch.Tensor], input_ids: torch.Tensor,
              position_ids: torch.Tensor, mask: torch.Tensor | None = None) -> str | None:
        """Run the compiled graph with its guards evaluated: None when they pass, else why not (a
        recompile it refuses). Writes as `run` does; retires nothing. Its first passing call, and
        each later one at another window (and other rows, where they vary), learn and prove
        `direct`."""
        try:
            with torch.compiler.set_stance("fail_on_recompile"), graph_call.watched() as calls:
                logits = self._compiled(input_ids, position_ids, keys, values, mask)
        except Exception as exc:
            return _described(exc)
        self._learn(calls, _tensors(input_ids, position_ids, keys, values, mask), logits, 2 * len(keys))
        return None

    def _learn(self, calls: list[tuple[graph_call.Graph, list[Any]]], tensors: list[torch.Tensor],
               logits: torch.Tensor, caches: int) -> None:
        if len(calls) != 1:
            self.direct, self.direct_problem = None, f"the step ran {len(calls)} graphs"
            return
        seen, first = graph_call.Seen.of(tensors, *calls[0]), self._seen
        if first is None:
            self._seen = seen
            return
        if seen.window == first.window or (self.max_rows > self.min_rows and seen.rows == first.rows):
            return
        learnt = graph_call.learn(first, seen)
        call: graph_call.GraphCall | str = learnt if isinstance(learnt, str) else graph_call.proven(
            learnt, seen, logits.clone(), [cache[:, :, -1].clone() for cache in tensors[2 : 2 + caches]])
        if isinstance(call, str):
            self.direct, self.direct_problem = None, call
        else:
            self.direct, self.direct_problem = call, None

    def _compile(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        import torch._dynamo.config as dynamo
        import torch._inductor.config as inductor
        from torch._inductor import select_algorithm

        templated = _templated()
        started = time.perf_counter()
        # freezing: the weights become the graph's constants (read at compile time, so set
        # around the compiling call, not as torch.compile's options)
        options = AUTOTUNE if self.autotune else {}
        self._mark_dynamic(input_ids, position_ids, keys, values, mask)
        with (inductor.patch(freezing=True, cpp_wrapper=True, **options), dynamo.patch(specialize_int=True),
              _quiet(select_algorithm)):
            logits = self._compiled(input_ids, position_ids, keys, values, mask)
        self.compile_seconds = time.perf_counter() - started
        if self.autotune:
            self.templated = _templated() - templated
        return logits

    def _mark_dynamic(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
                      values: list[torch.Tensor], mask: torch.Tensor | None) -> None:
        """Mark the sizes the graph takes as symbols on the compiling call's inputs: the window, and
        for more than one row the rows. Every other size is a constant of the graph, so none can
        be taken for a symbol because it happens to equal one (dynamo gives equal sizes one
        symbol: compiled at 2 rows, a model with 2 key/value heads would pin the rows to 2)."""
        mark = torch._dynamo.mark_dynamic
        for cache in (*keys, *values):
            mark(cache, 2, min=MIN_WINDOW, max=self.capacity - 1)
        if mask is not None:
            mark(mask, 1, min=MIN_WINDOW, max=self.capacity - 1)
        if self.max_rows > 1:
            for tensor in (input_ids, position_ids, *keys, *values, *([] if mask is None else [mask])):
                mark(tensor, 0, min=self.min_rows, max=self.max_rows)

    def _step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """What is compiled: each subclass's own function, `_walk` inlined into it (dynamo keeps its
        graphs per function: two classes compiling one would make each graph the other's
        recompile)."""
        raise NotImplementedError

    def _walk(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        rows = input_ids.shape[0]
        attends = None if mask is None else mask[:, None, None, :]

        def attend(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scaling: float) -> torch.Tensor:
            keys[layer][:, :, -1:].copy_(key)
            values[layer][:, :, -1:].copy_(value)
            return decode_rows(query, keys[layer], values[layer], attends, scaling).reshape(rows, 1, -1)

        return self._decoder.forward(input_ids, position_ids, attend)


class LoneStep(CompiledStep):
    """The compiled step of exactly one running row (`lone_step: compiled` or `max-autotune`)."""

    name = "lone decode step"

    def _step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return self._walk(input_ids, position_ids, keys, values, mask)


class BatchStep(CompiledStep):
    """The compiled step of 2 to `slots` rows (`batch_step: compiled`), never autotuned."""

    name = "batch decode step"
    min_rows = MIN_ROWS

    def __init__(self, decoder: DirectDecoder, capacity: int, slots: int) -> None:
        super().__init__(decoder, capacity)
        self.max_rows = slots

    def _step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return self._walk(input_ids, position_ids, keys, values, mask)


def _tensors(input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
             values: list[torch.Tensor], mask: torch.Tensor | None) -> list[torch.Tensor]:
    """A step's own tensors in `graph_call.Seen`'s order."""
    return [input_ids, position_ids, *keys, *values, *([] if mask is None else [mask])]


def _templated() -> int:
    """How many GEMM template kernels inductor has generated in this process (its counters are
    swapped for new ones while compiling: read them afresh)."""
    return int(torch._dynamo.utils.counters["inductor"]["cpp_templated_kernel_counter"])


@contextlib.contextmanager
def _quiet(select_algorithm: Any) -> Iterator[None]:
    """Without autotuning's timing tables on stderr (the load log sums them up), nor the
    deprecation warning torch gives when its own autotuner calls `Tensor.storage()`."""
    printing = select_algorithm.PRINT_AUTOTUNE
    select_algorithm.PRINT_AUTOTUNE = False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            yield
    finally:
        select_algorithm.PRINT_AUTOTUNE = printing


def _described(exc: BaseException) -> str:
    """The exception's type and first line; a compiler failure's own cause (inductor's assertion,
    say) rather than dynamo's wrapper around it."""
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException):
        return f"{type(exc).__name__} ({_described(inner)})"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
