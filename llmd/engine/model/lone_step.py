"""A lone stream's decode step as one compiled graph: no Python per layer.

One user with one editor is the commonest local case, and at one row the eager direct walk
(layer_walk.DirectDecoder) spends a good part of a step dispatching ops one by one: on the small
demo model (bfloat16, 2-core EPYC) 6.9 ms a step eager against 5.7 ms compiled. `LoneStep` runs
the same walk under torch.compile (inductor, its C++ wrapper, weights frozen into the graph as
they are: oneDNN-packed weights stay the one copy), for exactly one running row.

Its inputs are the token, its position and, per layer, the cache window the row attends to: views
of the static batch's tensors from the row's first column to the one this step writes, inclusive.
The graph writes the new key and value into that last column and attends over the window. The
window's length is a dynamic dimension, so one graph serves every length from `MIN_WINDOW` up:
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
(`takes`). Ints are specialised while tracing (`specialize_int`): head counts and the like are
constants of the graph, not symbols to guard and to pass in on every call.

With `autotune` (`lone_step: max-autotune`) inductor also chooses each matmul's kernel by timing
them at compile (`AUTOTUNE`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from llmd.engine.model.attention import decode_rows
from llmd.engine.model.layer_walk import DirectDecoder, import_inductor

log = logging.getLogger("llmd.engine")

# Window lengths below this run eager: dynamo specialises sizes 0 and 1.
MIN_WINDOW = 2

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


class LoneStep:
    """The compiled one-row decode step over per-layer cache windows; retired on any failure."""

    def __init__(self, decoder: DirectDecoder, capacity: int, autotune: bool = False) -> None:
        """`capacity`: the cache's columns; a window that long is the whole row, and runs eager.
        `autotune`: inductor's max-autotune chooses each matmul's kernel (see AUTOTUNE)."""
        import_inductor()
        self._decoder = decoder
        self.autotune = autotune
        self._compiled = torch.compile(self._step, fullgraph=True, dynamic=True)
        self.capacity = capacity
        self.compile_seconds: float | None = None  # None until the first run compiles
        self.retired: str | None = None  # why it no longer runs
        self.unguarded = False  # set once `check` passed over the window lengths `run` takes
        # autotune: the matmuls compiled as inductor's GEMM template (0 also when the whole graph
        # came from inductor's cache: nothing was generated); None until compiled
        self.templated: int | None = None

    def takes(self, window: int) -> bool:
        """Whether `run` runs the graph over a window of this many columns."""
        return MIN_WINDOW <= window < self.capacity

    def run(self, keys: list[torch.Tensor], values: list[torch.Tensor], input_ids: torch.Tensor,
            position_ids: torch.Tensor) -> torch.Tensor | None:
        """The row's logits [1, 1, vocab], its key and value written at each window's last column;
        None when the step must run eager (a window it does not `take`, or retired: nothing was
        written).

        The first run compiles (the probe's, at load); any later compile is a failure."""
        if self.retired is not None or not self.takes(keys[0].shape[2]):
            return None
        try:
            if self.compile_seconds is None:
                return self._compile(input_ids, position_ids, keys, values)
            with torch.compiler.set_stance("fail_on_recompile", skip_guard_eval_unsafe=self.unguarded):
                return self._compiled(input_ids, position_ids, keys, values)
        except Exception as exc:  # a recompile, or anything else: eager from now on
            self.retired = _described(exc)
            log.warning("the compiled lone decode step is retired, eager from now on (%s)", self.retired)
            return None

    def check(self, keys: list[torch.Tensor], values: list[torch.Tensor], input_ids: torch.Tensor,
              position_ids: torch.Tensor) -> str | None:
        """Run the compiled graph with its guards evaluated: None when they pass, else why not (a
        recompile it refuses). Writes as `run` does; retires nothing."""
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                self._compiled(input_ids, position_ids, keys, values)
        except Exception as exc:
            return _described(exc)
        return None

    def _compile(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor]) -> torch.Tensor:
        import torch._dynamo.config as dynamo
        import torch._inductor.config as inductor
        from torch._inductor import select_algorithm

        templated = _templated()
        started = time.perf_counter()
        # freezing: the weights become the graph's constants (read at compile time, so set
        # around the compiling call, not as torch.compile's options)
        options = AUTOTUNE if self.autotune else {}
        with (inductor.patch(freezing=True, cpp_wrapper=True, **options), dynamo.patch(specialize_int=True),
              _quiet(select_algorithm)):
            logits = self._compiled(input_ids, position_ids, keys, values)
        self.compile_seconds = time.perf_counter() - started
        if self.autotune:
            self.templated = _templated() - templated
        return logits

    def _step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor]) -> torch.Tensor:
        def attend(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scaling: float) -> torch.Tensor:
            keys[layer][:, :, -1:].copy_(key)
            values[layer][:, :, -1:].copy_(value)
            return decode_rows(query, keys[layer], values[layer], None, scaling).reshape(1, 1, -1)

        return self._decoder.forward(input_ids, position_ids, attend)


def _templated() -> int:
    """How many GEMM template kernels inductor has generated in this process (its counters are
    swapped for new ones while compiling: read them afresh)."""
    return int(torch._dynamo.utils.counters["inductor"]["cpp_templated_kernel_counter"])


@contextlib.contextmanager
def _quiet(select_algorithm: Any) -> Iterator[None]:
    """Without autotuning's timing tables on stderr (the load log sums them up)."""
    printing = select_algorithm.PRINT_AUTOTUNE
    select_algorithm.PRINT_AUTOTUNE = False
    try:
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
