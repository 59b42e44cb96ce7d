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
eager, as it does for a window shorter than `MIN_WINDOW`, where a size of 1 would specialise).
"""

from __future__ import annotations

import logging
import time

import torch

from llmd.engine.model.attention import decode_rows
from llmd.engine.model.layer_walk import DirectDecoder, import_inductor

log = logging.getLogger("llmd.engine")

# Window lengths below this run eager: dynamo specialises sizes 0 and 1.
MIN_WINDOW = 2


class LoneStep:
    """The compiled one-row decode step over per-layer cache windows; retired on any failure."""

    def __init__(self, decoder: DirectDecoder) -> None:
        import_inductor()
        self._decoder = decoder
        self._compiled = torch.compile(self._step, fullgraph=True, dynamic=True)
        self.compile_seconds: float | None = None  # None until the first run compiles
        self.retired: str | None = None  # why it no longer runs

    def run(self, keys: list[torch.Tensor], values: list[torch.Tensor], input_ids: torch.Tensor,
            position_ids: torch.Tensor) -> torch.Tensor | None:
        """The row's logits [1, 1, vocab], its key and value written at each window's last column;
        None when the step must run eager (a short window, or retired: nothing was written).

        The first run compiles (the probe's, at load); any later compile is a failure."""
        if self.retired is not None or keys[0].shape[2] < MIN_WINDOW:
            return None
        try:
            if self.compile_seconds is None:
                import torch._inductor.config as inductor

                started = time.perf_counter()
                # freezing: the weights become the graph's constants (read at compile time, so
                # set around the compiling call, not as torch.compile's options)
                with inductor.patch(freezing=True, cpp_wrapper=True):
                    logits = self._compiled(input_ids, position_ids, keys, values)
                self.compile_seconds = time.perf_counter() - started
                return logits
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._compiled(input_ids, position_ids, keys, values)
        except Exception as exc:  # a recompile, or anything else: eager from now on
            self.retired = _described(exc)
            log.warning("the compiled lone decode step is retired, eager from now on (%s)", self.retired)
            return None

    def _step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keys: list[torch.Tensor],
              values: list[torch.Tensor]) -> torch.Tensor:
        def attend(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scaling: float) -> torch.Tensor:
            keys[layer][:, :, -1:].copy_(key)
            values[layer][:, :, -1:].copy_(value)
            return decode_rows(query, keys[layer], values[layer], None, scaling).reshape(1, 1, -1)

        return self._decoder.forward(input_ids, position_ids, attend)


def _described(exc: BaseException) -> str:
    """The exception's type and first line; a compiler failure's own cause (inductor's assertion,
    say) rather than dynamo's wrapper around it."""
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException):
        return f"{type(exc).__name__} ({_described(inner)})"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
