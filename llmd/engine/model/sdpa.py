"""SDPA, torch's fused attention: its backends, which of them run here, the profile's order.

`sdpa_preference` makes SDPA try the profile's backends in its order (the worker serves inside
it); `attention_report` says which attention the model runs and which backend comes first, for
the start-up log and `llmd check`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedModel

from llmd.config import Profile
from llmd.engine.model.loader import DTYPES, target_device
from llmd.preflight.shape import attention_heads

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """Whether one SDPA backend runs here for this model's attention shape, and if not why."""

    name: str
    usable: bool
    reason: str


def sdpa_backend_status(
    device: torch.device, dtype: torch.dtype, heads: int, head_dim: int
) -> list[BackendStatus]:
    """Try each SDPA backend on a small causal attention of the model's shape and dtype."""
    statuses = []
    for name, backend in BACKENDS.items():
        query = torch.zeros((1, heads, 8, head_dim), dtype=dtype, device=device)
        try:
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel([backend]):
                warnings.simplefilter("always")
                torch.nn.functional.scaled_dot_product_attention(query, query, query, is_causal=True)
        except RuntimeError:
            why = "; ".join(str(w.message).split("\n")[0] for w in caught) or (
                "needs CUDA" if device.type == "cpu" else "not available for this shape or dtype")
            statuses.append(BackendStatus(name, False, why))
        else:
            statuses.append(BackendStatus(name, True, "ok"))
    return statuses


@contextlib.contextmanager
def sdpa_preference(profile: Profile) -> Iterator[None]:
    """Within this block SDPA tries the profile's backends in its order (torch's own if empty)."""
    if profile.attn_implementation != "sdpa" or not profile.sdpa_backends:
        yield
        return
    with sdpa_kernel([BACKENDS[name] for name in profile.sdpa_backends], set_priority=True):
        yield



@dataclass(frozen=True, slots=True)
class AttentionReport:
    """The model's attention as served: SDPA or not, a fast backend first or not, in words."""

    sdpa: bool
    fast: bool
    detail: str


def attention_report(model: PreTrainedModel, profile: Profile, device: torch.device) -> AttentionReport:
    """Which attention the model runs on `device` and which SDPA backend comes first."""
    implementation = getattr(model.config, "_attn_implementation", None) or "unknown"
    if implementation != "sdpa":
        return AttentionReport(False, False, f"attention implementation is `{implementation}`")
    heads, _, head_dim = attention_heads(model.config.get_text_config(decoder=True))
    statuses = sdpa_backend_status(device, DTYPES[profile.dtype], heads, head_dim)
    usable = [s.name for s in statuses if s.usable]
    preferred: list[str] = list(profile.sdpa_backends) or list(BACKENDS)
    first = next((name for name in preferred if name in usable), None)
    refused = "; ".join(f"{s.name}: {s.reason}" for s in statuses if not s.usable)
    detail = f"SDPA, {first or 'no backend'} first (usable: {', '.join(usable) or 'none'})"
    if refused:
        detail += f"; not usable: {refused}"
    fast = first is not None and (first != "math" or device.type == "cpu")
    return AttentionReport(True, fast, detail)


def attention_summary(model: PreTrainedModel, profile: Profile) -> str:
    """One line for the start-up log: the attention implementation and which SDPA backend runs."""
    return attention_report(model, profile, target_device(profile)).detail
