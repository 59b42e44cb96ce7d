"""How many intra-op threads torch runs a CPU forward pass on: the plan, and the switch."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil
import torch

from llmd.config import Profile


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """Intra-op threads for CPU inference: one stream's decode apart from everything else.

    With plain nn.Linear a lone stream's decode leaves one physical core to the event loop
    and the client: a thread team that fills every core stalls at its barrier whenever the
    HTTP side runs, and one thread decodes one row of a small model as fast as two (C=1
    over HTTP 0.96-0.98x of in-process with one thread, 0.89x with two). With `onednn_linear`
    two threads do a one-row GEMM twice as fast as one, which outweighs the stalls: C=1 over
    HTTP 98 tok/s on every core against 69 on one (small demo model, float32, 2 cores), so
    then every core decodes; so it does with int8 layers (medium demo model in-process, one
    stream: 120-136 tok/s on two threads, 88-90 on one). Prefill and batched decode are
    compute-bound and always take every core (C=8 over HTTP 257 tok/s with two threads for the
    batch, 209 with one).
    """

    lone_decode: int
    compute: int

    @classmethod
    def for_profile(cls, profile: Profile) -> ThreadPlan | None:
        """None off the CPU; the profile's `torch_threads` pins both numbers when set."""
        if profile.device != "cpu":
            return None
        if profile.torch_threads:
            return cls(profile.torch_threads, profile.torch_threads)
        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        every_core = profile.onednn_linear or profile.quantization == "int8"
        lone = cores if every_core else max(1, cores - 1)
        return cls(lone_decode=lone, compute=cores)

    def for_rows(self, rows: int) -> int:
        """Threads for a forward pass over `rows` new positions (a prompt, or a batch)."""
        return self.lone_decode if rows == 1 else self.compute


class IntraOpThreads:
    """torch's intra-op thread count, switched per forward pass as a `ThreadPlan` says."""

    def __init__(self, plan: ThreadPlan | None) -> None:
        self.plan = plan
        self._in_use = 0

    def use_for(self, rows: int) -> None:
        """Switch to the plan's thread count for a pass over `rows` positions (no-op off the CPU)."""
        wanted = self.plan.for_rows(rows) if self.plan is not None else 0
        if wanted and wanted != self._in_use:
            torch.set_num_threads(wanted)
            self._in_use = wanted
