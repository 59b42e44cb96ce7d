"""CPU Linear layers on weights prepacked once for oneDNN (`onednn_linear: true`).

A plain `nn.Linear` on the CPU hands its weight to the GEMM in the layout it was saved in,
and the GEMM repacks it on every call. For the few rows of a decode step that repacking is
most of the work. oneDNN can take the weight packed once, in its own blocked layout, which
is what torch.compile's CPU "freezing" does, without compiling anything. Measured on the
2-core EPYC with a 1536x512 weight: bfloat16 8 rows 49 vs 78 us, 1 row 30 vs 57 us;
float32 8 rows 80 vs 164 us; 64 rows still 10-25 % faster. Results are the same as
`nn.Linear` to the last bit in bfloat16 and to rounding (1e-6) in float32.

The packed tensor replaces the weight, so memory does not double. Only layers of exactly
`nn.Linear` are packed (bitsandbytes' 4-bit layers subclass it and stay as they are), and
never a weight that another module shares (a tied output head keeps serving the embedding).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import cast

import torch

log = logging.getLogger("llmd.engine")

# oneDNN keeps a compiled primitive (~1 MiB each on the demo model) per GEMM shape in two
# caches of 1024 entries by default, and every new prompt length is a new shape: RSS grew
# ~12 KiB per request with no plateau in sight over 25,000 varied requests. Capping both
# bounds it; the shapes a step uses (rows 1..max_running per weight) stay hot. Both are read
# at the first primitive, so setting them when this module loads, before the model, is in
# time; a value the user set wins.
PRIMITIVE_CACHE_ENTRIES = "64"
for _cache in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_cache, PRIMITIVE_CACHE_ENTRIES)

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# Why a Linear layer whose weight another module holds (a tied output head) is left alone.
TIED = "weight shared with another module (tied)"
# The row count oneDNN picks the packed layout for; any row count runs on it.
LAYOUT_ROWS = 8


class PackedLinear(torch.nn.Module):
    """`y = x W^T + b` with W held packed for oneDNN; a drop-in for one `nn.Linear`."""

    packed_weight: torch.Tensor

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_size=LAYOUT_ROWS)
        self.register_buffer("packed_weight", packed)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed_weight, self.bias, "none", [], ""
        )

    def unpacked(self) -> torch.nn.Linear:
        """The plain layer again, with the same weight."""
        weight = self.packed_weight.to_dense()
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                 device=weight.device, dtype=weight.dtype)
        linear.weight = torch.nn.Parameter(weight, requires_grad=False)
        if self.bias is not None:
            linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}"


@dataclass(frozen=True, slots=True)
class PackReport:
    """How many Linear layers were packed, and why any were left alone."""

    packed: int
    skipped: dict[str, str]  # module name -> reason

    def summary(self) -> str:
        if not self.skipped:
            return f"{self.packed} Linear layers on oneDNN prepacked weights"
        reasons = sorted(set(self.skipped.values()))
        return (f"{self.packed} Linear layers on oneDNN prepacked weights; "
                f"{len(self.skipped)} left as they are ({'; '.join(reasons)})")


def unavailable_reason() -> str | None:
    """Why this torch cannot pack Linear weights for oneDNN, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this torch is built without oneDNN (mkldnn)"
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return f"torch {torch.__version__} lacks the mkldnn linear ops"
    return None


def pack_linears(model: torch.nn.Module) -> PackReport:
    """Swap every packable `nn.Linear` of a CPU model for a `PackedLinear`, in place.

    One layer at a time, so the peak memory is the model plus one weight.
    """
    targets, skipped = swappable_linears(model)
    for name in targets:  # by name: no list holds the old layers, each goes once replaced
        replace_module(model, name, PackedLinear(linear_at(model, name)))
    return PackReport(packed=len(targets), skipped=skipped)


def unpack_linears(model: torch.nn.Module) -> int:
    """Undo `pack_linears`: plain `nn.Linear` layers again; returns how many."""
    packed = [(name, module) for name, module in model.named_modules() if isinstance(module, PackedLinear)]
    for name, module in packed:
        replace_module(model, name, module.unpacked())
    return len(packed)


def swappable_linears(model: torch.nn.Module) -> tuple[list[str], dict[str, str]]:
    """The names of the layers of exactly `nn.Linear` whose weight can be rewritten (packed,
    quantized), and why each other one cannot."""
    shared = shared_weights(model)
    skipped: dict[str, str] = {}
    targets: list[str] = []
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear:
            continue
        reason = kept_reason(module, shared)
        if reason is None:
            targets.append(name)
        else:
            skipped[name] = reason
    return targets, skipped


def linear_at(model: torch.nn.Module, name: str) -> torch.nn.Linear:
    """The `nn.Linear` named by `swappable_linears`."""
    return cast(torch.nn.Linear, model.get_submodule(name))


def kept_reason(module: torch.nn.Linear, shared: set[int]) -> str | None:
    """Why a Linear layer keeps its weight as it is (packed or quantized layers need a CPU weight
    in float32 or bfloat16 that no other module holds), or None."""
    weight = module.weight
    if weight.device.type != "cpu":
        return f"weight on {weight.device.type}"
    if weight.dtype not in PACKABLE_DTYPES:
        return f"{str(weight.dtype).removeprefix('torch.')} weights"
    if id(weight) in shared:
        return TIED
    return None


def shared_weights(model: torch.nn.Module) -> set[int]:
    """ids of parameters that more than one module holds (tied embeddings and heads)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners[id(parameter)] = owners.get(id(parameter), 0) + 1
    return {key for key, count in owners.items() if count > 1}


def replace_module(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)
