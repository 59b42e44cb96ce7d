"""Weight-only int8 Linear layers for the CPU (`quantization: int8`).

A decode step reads every weight once per token, so on a CPU its speed is the weights' bytes
over the memory bandwidth. Stored as int8 with one scale per output channel, a weight is half
its bfloat16 bytes, and torch's `_weight_int8pack_mm` multiplies bfloat16 activations by it
without a dequantized copy. Measured on the 2-core EPYC (the demo models' MLP shapes, weights
cold in memory, 2 threads), one row: 1.2-1.9x faster than the best bfloat16 path (oneDNN
prepacked); but the kernel reads the weight once per row, so 8 rows run 0.7-0.85x of it: int8
is the profile for one stream, not for a full batch.

Quantization is symmetric per output channel: scale = max |w| / 127 over the row (rounded to
the compute dtype first, so the int8 values are exact for the scale actually used), w ≈ q *
scale with q in [-127, 127]. What it costs in accuracy is proven at load (probes.py) and
reported for the demo model by scripts/int8_accuracy.py.

Only layers of exactly `nn.Linear` are quantized. A tied output head (its weight is the
embedding's) gets its own int8 copy and the embedding keeps the shared weight: the head is the
largest matmul of many small models (Llama 3.2 1B: a fifth of the weights, all read every step),
so the copy costs a byte per embedding weight and saves two per step. Each layer's float weight
is dropped as soon as its int8 copy exists, so the peak is the loaded model plus one layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmd.engine.model.onednn import TIED, linear_at, replace_module, swappable_linears

QMAX = 127
# The int8 kernel reads the weight once per row, so its time grows with the rows: above this
# many, the weight converted to the compute dtype (the scales applied to the output) is faster.
# Measured on a 2688x768 weight, 2 threads, microseconds (kernel / converted): 8 rows 160 / 273,
# 16 rows 328 / 328, 32 rows 554 / 410, 64 rows 1294 / 595, 256 rows 5208 / 1705.
DEQUANTIZE_ABOVE_ROWS = 16
# Input wider than the scales (a float32 reference pass over int8 layers) multiplies the weight
# converted to that dtype in slices of at most this many elements (64 MiB of float32), so that
# even a large vocabulary's head costs no more memory than one slice.
REFERENCE_ELEMENTS = 1 << 24


class Int8Linear(torch.nn.Module):
    """`y = x (q * scale)^T + b` with q int8 [out, in] and one scale per output; for one `nn.Linear`."""

    qweight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    @classmethod
    def quantized(cls, linear: torch.nn.Linear) -> Int8Linear:
        """The layer's weight quantized per output channel, in the weight's own dtype for scales."""
        qweight, scales = quantize_rows(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(qweight, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_matmul(x, self.qweight, self.scales, self.bias)

    def dequantized(self) -> torch.Tensor:
        """The weight as the compute dtype multiplies it: q * scale."""
        return self.qweight.to(self.scales.dtype) * self.scales.unsqueeze(1)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, int8"


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, scales in the weight's dtype) with weight ≈ q * scales[:, None], symmetric per row."""
    absmax = weight.abs().amax(dim=1).float()
    scales = (absmax / QMAX).clamp(min=torch.finfo(torch.float32).tiny).to(weight.dtype)
    q = torch.round(weight.float() / scales.float().unsqueeze(1)).clamp(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scales.contiguous()


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] times the int8 weight [out, in] at its scales, plus the bias: [..., out]."""
    out_features, in_features = qweight.shape
    rows = x.reshape(-1, in_features)
    if rows.dtype != scales.dtype:  # a float32 pass (the probes' reference): the weight a slice at a time
        parts = [torch.nn.functional.linear(rows, part.to(rows.dtype))
                 for part in qweight.split(max(1, REFERENCE_ELEMENTS // in_features))]
        y = torch.cat(parts, dim=-1) * scales.to(rows.dtype)
    elif rows.shape[0] > DEQUANTIZE_ABOVE_ROWS:
        y = torch.nn.functional.linear(rows, qweight.to(rows.dtype)) * scales
    else:
        y = torch._weight_int8pack_mm(rows.contiguous(), qweight, scales)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], out_features)


@dataclass(frozen=True, slots=True)
class QuantizeReport:
    """How many Linear layers are int8 now (tied heads copied among them), their bytes, and why
    any were left alone."""

    quantized: int
    int8_bytes: int
    skipped: dict[str, str]  # module name -> reason
    tied_copies: tuple[str, ...] = ()  # tied output heads quantized as their own copy

    def summary(self) -> str:
        text = f"{self.quantized} Linear layers in int8 ({self.int8_bytes / 2**20:.1f} MiB)"
        if self.tied_copies:
            text += f", {', '.join(self.tied_copies)} as its own int8 copy of the tied embedding"
        if self.skipped:
            reasons = "; ".join(sorted(set(self.skipped.values())))
            text += f"; {len(self.skipped)} left in the compute dtype ({reasons})"
        return text


def unavailable_reason() -> str | None:
    """Why this torch cannot run weight-only int8 Linear layers, or None when it can."""
    if not hasattr(torch, "_weight_int8pack_mm"):
        return f"torch {torch.__version__} has no _weight_int8pack_mm"
    return None


def quantize_linears(model: torch.nn.Module) -> QuantizeReport:
    """Swap every quantizable `nn.Linear` of a CPU model for an `Int8Linear`, in place, one at a time."""
    targets, skipped = swappable_linears(model)
    tied = tuple(name for name, reason in skipped.items() if reason == TIED)
    skipped = {name: reason for name, reason in skipped.items() if reason != TIED}
    targets += tied
    int8_bytes = 0
    for name in targets:  # by name: no list holds the float layers, each goes once replaced
        layer = Int8Linear.quantized(linear_at(model, name))
        int8_bytes += layer.qweight.numel() + layer.scales.numel() * layer.scales.element_size()
        replace_module(model, name, layer)
    return QuantizeReport(quantized=len(targets), int8_bytes=int8_bytes, skipped=skipped, tied_copies=tied)

