"""Load the model exactly as the profile says, and prove where it landed.

Weights go straight onto the profile's device (`device_map={"": device}`, never "auto":
auto would quietly put what does not fit on the CPU or disk). After loading, every
parameter and buffer is checked to be on that device; anything elsewhere is a refusal, not
a slow daemon. The facts the runner reads off the loaded model (its context limit, its
end-of-sequence ids) are here too.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from llmd.config import Profile
from llmd.engine.model.attention import register_attention
from llmd.engine.model.int8 import QuantizeReport
from llmd.engine.model.onednn import PackReport
from llmd.engine.model.probes import prepack_linears, quantize_proven
from llmd.errors import DeviceUnavailable, PreflightRefusal
from llmd.preflight.shape import context_limit

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What loading took and what it occupies, next to the preflight plan's estimate."""

    seconds: float
    device: str
    weight_bytes: int  # parameters and buffers, each storage counted once
    device_bytes: int  # cuda: memory_allocated after load; cpu: the same tensor bytes
    rss_growth_bytes: int  # process resident memory added by loading
    prepack: PackReport | None = None  # `onednn_linear`: what was packed; None when not asked or not possible
    quantized: QuantizeReport | None = None  # `quantization: int8`: what is int8 now


def load_model(model_dir: str | Path, profile: Profile) -> tuple[PreTrainedModel, LoadReport]:
    """The model on the profile's device, dtype, attention and quantization, in eval mode."""
    device = target_device(profile)
    register_attention()  # the static batch's steps run the model under these names
    hf_logging.disable_progress_bar()  # a progress bar per load is noise in a service log
    rss_before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    kwargs: dict[str, Any] = {
        "dtype": DTYPES[profile.dtype],
        "attn_implementation": profile.attn_implementation,
        "device_map": {"": str(device)},
    }
    if profile.quantization == "nf4":
        kwargs["quantization_config"] = nf4_config(profile)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    model.eval()
    verify_placement(model, device)
    quantized = quantize_proven(model) if profile.quantization == "int8" else None
    prepack = prepack_linears(model) if profile.onednn_linear else None
    weight_bytes = tensor_bytes(model)
    device_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else weight_bytes
    report = LoadReport(
        seconds=time.perf_counter() - started,
        device=str(device),
        weight_bytes=weight_bytes,
        device_bytes=device_bytes,
        rss_growth_bytes=psutil.Process().memory_info().rss - rss_before,
        prepack=prepack,
        quantized=quantized,
    )
    return model, report


def target_device(profile: Profile) -> torch.device:
    """The one device everything goes to; a CUDA profile without CUDA is a refusal."""
    if profile.device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"profile `{profile.name}` needs CUDA, but torch sees no CUDA device "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); "
                "is the NVIDIA driver loaded? llmd does not fall back to the CPU"
            )
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def nf4_config(profile: Profile) -> Any:
    """bitsandbytes 4-bit NormalFloat for the decoder's Linear layers, computing in the dtype."""
    import_bitsandbytes()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=profile.double_quant,
        bnb_4bit_compute_dtype=DTYPES[profile.dtype],
    )


def import_bitsandbytes() -> str:
    """Import bitsandbytes (once) and return its version; a clear error when it is missing."""
    try:
        with warnings.catch_warnings():
            # its import runs torch.jit.script on helpers, which torch 2.13 deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            import bitsandbytes
    except ImportError as exc:
        raise PreflightRefusal(
            f"the profile quantizes with bitsandbytes, which cannot be imported: {exc}; "
            "`pip install bitsandbytes`, or use a profile with `quantization: none`"
        ) from exc
    return str(bitsandbytes.__version__)


def misplaced_tensors(model: torch.nn.Module, device: torch.device) -> list[str]:
    """Names of parameters and buffers not on `device` (cpu, meta, another GPU), with where."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return [
        f"{name} on {tensor.device}"
        for name, tensor in named
        if tensor.device.type != device.type
        or (device.index is not None and tensor.device.index not in (None, device.index))
    ]


def verify_placement(model: torch.nn.Module, device: torch.device) -> None:
    """Refuse a model with anything off the target device: that would be a silent offload."""
    misplaced = misplaced_tensors(model, device)
    if misplaced:
        shown = ", ".join(misplaced[:5]) + (f" and {len(misplaced) - 5} more" if len(misplaced) > 5 else "")
        raise PreflightRefusal(
            f"{len(misplaced)} tensors are not on {device}: {shown}. llmd serves only a model "
            "that sits wholly on one device; lower the memory it needs (a 4-bit profile, a "
            "smaller max_context) instead of offloading"
        )


def tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer, counting shared storage (tied weights) once."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.layout == torch._mkldnn:  # type: ignore[attr-defined]  # packed: no storage to share
            total += tensor.numel() * tensor.element_size()
            continue
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def model_context_limit(model: PreTrainedModel, profile: Profile) -> int:
    """The profile's max context, capped by the loaded model's position limit."""
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    return context_limit(limit, profile)


def generation_eos_ids(model: PreTrainedModel) -> frozenset[int]:
    """The end-of-sequence ids the model's generation config declares (int or list)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])
