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

Sibling layers that read the same input (an attention's q/k/v, an MLP's gate/up) are packed
as one weight (`PackedGroup`): one GEMM call instead of three or two, since at one row each
call costs a fixed ~10-30 us beside its bytes. Measured on the small demo model (bfloat16, one
row, 2 cores): every Linear of a step 1.98 ms separately, 1.62 ms grouped; the medium model
10.0 vs 9.2 ms; the outputs equal to the bit. The direct layer walk calls the group once and
splits its output; each sibling stays a module of its own (`PackedPart`) for transformers'
forward, which calls them one after another on the same tensor: the first call computes the
group and the others take their share of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
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
# Sibling layers (names under one parent, in the order the model calls them) packed as one
# weight when all of them are packed and read inputs of one width.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def packed(weight: torch.Tensor) -> torch.Tensor:
    """`weight` ([out, in]) in oneDNN's blocked layout."""
    return cast(torch.Tensor, torch.ops.mkldnn._reorder_linear_weight(weight, batch_size=LAYOUT_ROWS))


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x W^T + b` on a packed W (x may be strided)."""
    return cast(torch.Tensor, torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], ""))


class PackedLinear(torch.nn.Module):
    """`y = x W^T + b` with W held packed for oneDNN; a drop-in for one `nn.Linear`."""

    packed_weight: torch.Tensor

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.register_buffer("packed_weight", packed(linear.weight.detach()))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed_weight, self.bias)

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


class PackedGroup(torch.nn.Module):
    """Sibling Linear layers that read one input, packed as one weight: their outputs side by side."""

    packed_weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linears: Sequence[torch.nn.Linear]) -> None:
        super().__init__()
        self.in_features = linears[0].in_features
        self.widths = tuple(linear.out_features for linear in linears)
        self.starts = tuple(sum(self.widths[:index]) for index in range(len(linears)))
        self.biased = tuple(linear.bias is not None for linear in linears)
        weight = torch.cat([linear.weight.detach() for linear in linears])
        self.register_buffer("packed_weight", packed(weight))
        bias = None if not any(self.biased) else torch.cat([
            weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias.detach()
            for linear in linears])
        self.register_buffer("bias", bias)
        # The last input and the group's output for it, until every sibling has taken its share.
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._waiting: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed_weight, self.bias)

    def share(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Sibling `index`'s output for `x`. Siblings called in turn on the same tensor run the
        group once; a sibling asking again, or for another tensor, runs it anew."""
        if x is not self._input or index not in self._waiting:
            self._input, self._output, self._waiting = x, self(x), set(range(len(self.widths)))
        output = cast(torch.Tensor, self._output)
        self._waiting.discard(index)
        if not self._waiting:
            self._input = self._output = None
        start = self.starts[index]
        # A view (transformers splits only its last dimension): copying each share made a fresh
        # process's 1024-token prefill of the small demo model up to 40 % slower.
        return output[..., start : start + self.widths[index]]

    def unpacked(self, index: int) -> torch.nn.Linear:
        """Sibling `index` as the plain layer it was."""
        rows = slice(self.starts[index], self.starts[index] + self.widths[index])
        weight = self.packed_weight.to_dense()[rows].clone()
        linear = torch.nn.Linear(self.in_features, self.widths[index], bias=self.biased[index],
                                 device=weight.device, dtype=weight.dtype)
        linear.weight = torch.nn.Parameter(weight, requires_grad=False)
        if self.biased[index]:
            assert self.bias is not None
            linear.bias = torch.nn.Parameter(self.bias[rows].clone(), requires_grad=False)
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, widths={self.widths}, bias={any(self.biased)}"


class PackedPart(torch.nn.Module):
    """One sibling of a `PackedGroup`, standing where its `nn.Linear` stood."""

    def __init__(self, group: PackedGroup, index: int) -> None:
        super().__init__()
        self.group = group  # a submodule of every sibling; the model's modules() lists it once
        self.index = index
        self.in_features = group.in_features
        self.out_features = group.widths[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.share(self.index, x)

    def unpacked(self) -> torch.nn.Linear:
        """The plain layer again, with the same weight."""
        return self.group.unpacked(self.index)

    def extra_repr(self) -> str:
        return f"part {self.index}, out_features={self.out_features}"


# Modules standing for a packed Linear layer.
PACKED = (PackedLinear, PackedPart)


@dataclass(frozen=True, slots=True)
class PackReport:
    """How many Linear layers were packed (and how many groups of siblings hold some of them),
    and why any were left alone."""

    packed: int
    skipped: dict[str, str]  # module name -> reason
    groups: int = 0

    def summary(self) -> str:
        grouped = f" ({self.groups} groups of siblings packed as one)" if self.groups else ""
        if not self.skipped:
            return f"{self.packed} Linear layers on oneDNN prepacked weights{grouped}"
        reasons = sorted(set(self.skipped.values()))
        return (f"{self.packed} Linear layers on oneDNN prepacked weights{grouped}; "
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
    """Swap every packable `nn.Linear` of a CPU model for a `PackedLinear`, or siblings for the
    `PackedPart`s of one `PackedGroup`, in place.

    One layer (or group) at a time, so the peak memory is the model plus a group's weights twice.
    """
    targets, skipped = swappable_linears(model)
    groups = sibling_groups(model, targets)
    for names in groups:  # by name: no list holds the old layers, each goes once replaced
        group = PackedGroup([linear_at(model, name) for name in names])
        for index, name in enumerate(names):
            replace_module(model, name, PackedPart(group, index))
    grouped = {name for names in groups for name in names}
    for name in targets:
        if name not in grouped:
            replace_module(model, name, PackedLinear(linear_at(model, name)))
    return PackReport(packed=len(targets), skipped=skipped, groups=len(groups))


def sibling_groups(model: torch.nn.Module, names: list[str]) -> list[tuple[str, ...]]:
    """The `SIBLINGS` among `names` that can be packed as one: all present under one parent,
    reading one input width, in one dtype."""
    available = set(names)
    groups = []
    for name in names:
        parent, _, child = name.rpartition(".")
        for siblings in SIBLINGS:
            full = tuple(f"{parent}.{sibling}" if parent else sibling for sibling in siblings)
            if child != siblings[0] or not available.issuperset(full):
                continue
            linears = [linear_at(model, sibling) for sibling in full]
            if len({(linear.in_features, linear.weight.dtype) for linear in linears}) == 1:
                groups.append(full)
    return groups


def unpack_linears(model: torch.nn.Module) -> int:
    """Undo `pack_linears`: plain `nn.Linear` layers again; returns how many."""
    packed = [(name, module) for name, module in model.named_modules() if isinstance(module, PACKED)]
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
