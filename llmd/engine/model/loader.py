"""Load the model exactly as the profile says, prove where it landed, and check the setup.

Weights go straight onto the profile's device (`device_map={"": device}`, never "auto":
auto would quietly put what does not fit on the CPU or disk). After loading, every
parameter and buffer is checked to be on that device; anything elsewhere is a refusal, not
a slow daemon. The tuning checklist that `llmd check` prints lives here too, because it
needs the loaded model.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from llmd.config import Profile
from llmd.engine.model.onednn import PackedLinear, PackReport, pack_linears, unavailable_reason, unpack_linears
from llmd.errors import DeviceUnavailable, PreflightRefusal

log = logging.getLogger("llmd.engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What loading took and what it occupies, next to the preflight plan's estimate."""

    seconds: float
    device: str
    weight_bytes: int  # parameters and buffers, each storage counted once
    device_bytes: int  # cuda: memory_allocated after load; cpu: the same tensor bytes
    rss_growth_bytes: int  # process resident memory added by loading
    prepack: PackReport | None = None  # `onednn_linear`: what was packed; None when not asked or not possible


def load_model(model_dir: str | Path, profile: Profile) -> tuple[PreTrainedModel, LoadReport]:
    """The model on the profile's device, dtype, attention and quantization, in eval mode."""
    device = target_device(profile)
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
    )
    return model, report


def prepack_linears(model: PreTrainedModel) -> PackReport | None:
    """Pack the model's Linear weights for oneDNN, proven on a probe to give the same logits.

    Anything wrong (no oneDNN in this torch, a model that reads a Linear's `weight` itself, a
    different result) leaves the layers as they were, with a warning: it costs speed, not service.
    """
    unavailable = unavailable_reason()
    if unavailable is not None:
        log.warning("onednn_linear: %s; Linear layers stay unpacked", unavailable)
        return None
    probe = torch.arange(min(8, int(model.config.vocab_size)), device=model.device).unsqueeze(0)
    with torch.inference_mode():
        expected = model(input_ids=probe).logits.float()
        report = pack_linears(model)
        try:
            got = model(input_ids=probe).logits.float()
            problem = logits_differ(expected, got)
        except Exception as exc:  # e.g. a model that reads `self.proj.weight` directly
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        unpack_linears(model)
        log.warning("onednn_linear: the packed model failed its probe (%s); Linear layers stay unpacked",
                    problem)
        return None
    return report


def logits_differ(expected: torch.Tensor, got: torch.Tensor) -> str | None:
    """None when the probe's logits agree to rounding, else how far apart they are."""
    worst = float((expected - got).abs().max())
    scale = float(expected.abs().max()) or 1.0
    return None if worst <= 1e-3 * scale + 1e-5 else f"logits differ by up to {worst:.3g} of {scale:.3g}"


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
class Check:
    """One line of the tuning checklist: what was checked, the finding, and the fix if it failed."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def tuning_checklist(
    model: PreTrainedModel, profile: Profile, kv_sample: torch.Tensor | None
) -> list[Check]:
    """The field notes' checklist, run on the model as loaded and served.

    `kv_sample` is a key tensor from a real prefill through the serving path (None if it
    kept no cache): it shows whether the KV cache is on and whether inference mode was.
    """
    device = target_device(profile)
    config = model.config
    floats = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    weight_dtype = ", ".join(sorted(str(d).removeprefix("torch.") for d in floats)) or "none"
    misplaced = misplaced_tensors(model, device)
    checks = [
        Check("weights not float32 on a GPU", device.type == "cpu" or torch.float32 not in floats,
              f"{weight_dtype} on {device}", "use a bfloat16 or 4-bit profile (`dtype: bfloat16`)"),
        Check("nothing offloaded", not misplaced,
              f"every parameter and buffer on {device}" if not misplaced else f"{len(misplaced)} elsewhere, "
              f"e.g. {misplaced[0]}", "lower memory use (4-bit profile, smaller max_context); never offload"),
        Check("eval mode", not model.training, "dropout off" if not model.training else "training mode",
              "call model.eval() after loading"),
        Check("inference mode", kv_sample is not None and kv_sample.is_inference(),
              "no autograd state kept" if kv_sample is not None and kv_sample.is_inference()
              else "forward passes record autograd state", "run the model under torch.inference_mode()"),
        Check("KV cache on", bool(getattr(config, "use_cache", True)) and kv_sample is not None,
              "past keys/values kept between steps" if kv_sample is not None else "no cache kept",
              "pass use_cache=True; without it every token recomputes the whole sequence"),
    ]
    checks.append(_attention_check(model, profile, device))
    if profile.quantization == "nf4":
        checks.append(_bitsandbytes_check(model))
    if profile.onednn_linear:
        packed = sum(isinstance(module, PackedLinear) for module in model.modules())
        checks.append(Check("oneDNN prepacked Linear", packed > 0,
                            f"{packed} Linear layers on prepacked weights" if packed else "not packed",
                            "see the onednn_linear warning in the log (a torch without oneDNN, or a "
                            "model whose packed forward differed)"))
    return checks


def attention_summary(model: PreTrainedModel, profile: Profile) -> str:
    """One line for the start-up log: the attention implementation and which SDPA backend runs."""
    return _attention_check(model, profile, target_device(profile)).detail


def _attention_check(model: PreTrainedModel, profile: Profile, device: torch.device) -> Check:
    implementation = getattr(model.config, "_attn_implementation", None) or "unknown"
    if implementation != "sdpa":
        return Check("SDPA attention", False, f"attention implementation is `{implementation}`",
                     "set `attn_implementation: sdpa` in the profile")
    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    statuses = sdpa_backend_status(device, DTYPES[profile.dtype], heads, head_dim)
    usable = [s.name for s in statuses if s.usable]
    preferred: list[str] = list(profile.sdpa_backends) or list(BACKENDS)
    first = next((name for name in preferred if name in usable), None)
    refused = "; ".join(f"{s.name}: {s.reason}" for s in statuses if not s.usable)
    detail = f"SDPA, {first or 'no backend'} first (usable: {', '.join(usable) or 'none'})"
    if refused:
        detail += f"; not usable: {refused}"
    fast = first is not None and (first != "math" or device.type == "cpu")
    return Check("SDPA attention", fast, detail,
                 "the math backend is the slow reference on a GPU: check dtype (flash needs 16-bit) "
                 "and head_dim, or install a torch built for this GPU")


def _bitsandbytes_check(model: PreTrainedModel) -> Check:
    try:
        version = import_bitsandbytes()
    except PreflightRefusal as exc:
        return Check("bitsandbytes 4-bit", False, exc.message, "pip install bitsandbytes")
    import bitsandbytes as bnb

    quantized = sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    return Check("bitsandbytes 4-bit", quantized > 0,
                 f"bitsandbytes {version}, {quantized} Linear layers in 4-bit",
                 "load with quantization: nf4 (no Linear layer was quantized)")
