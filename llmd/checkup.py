"""`llmd check`'s second half: load the model as `serve` would, then measure and inspect it.

The memory plan is arithmetic; this is the measurement next to it (weights and KV cache
bytes per token as they really are) and the tuning checklist from the field notes, run on
the loaded model and one real prefill through the serving path. The model side (torch) is
imported inside the functions that load and inspect, so importing this module stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmd.config import Profile
from llmd.units import mib

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from llmd.engine.model.loader import LoadReport


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the tuning checklist: what was checked, the finding, and the fix if it failed."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Checkup:
    """What loading and one request measured, and the checklist's verdicts."""

    load: LoadReport
    kv_bytes_per_token: int
    checks: list[Check]

    @property
    def passed(self) -> bool:
        """Every checklist line passed."""
        return all(check.ok for check in self.checks)


def run_checkup(model_dir: str | Path, profile: Profile) -> Checkup:
    """Load, prefill one chat prompt, measure its KV cache, and run the checklist."""
    from llmd.engine.model.runner import ModelRunner
    from llmd.engine.model.sdpa import sdpa_preference
    from llmd.engine.tokenizer import ChatTokenizer
    from llmd.engine.types import Request, SamplingParams

    runner = ModelRunner(model_dir, profile)
    prompt = ChatTokenizer(model_dir).encode_chat([{"role": "user", "content": "How fast can you go?"}])
    request = Request("llmd-check", prompt, SamplingParams(max_tokens=2, temperature=0.0))
    with sdpa_preference(profile):
        runner.first_token(request)
    layers = runner.kv_tensors(request.request_id)
    per_token = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
    kv_sample = layers[0][0] if layers else None
    checks = tuning_checklist(runner.model, profile, kv_sample)
    runner.release(request.request_id)
    return Checkup(runner.load_report, per_token // len(prompt), checks)


def tuning_checklist(
    model: PreTrainedModel, profile: Profile, kv_sample: torch.Tensor | None
) -> list[Check]:
    """The field notes' checklist, run on the model as loaded and served.

    `kv_sample` is a key tensor from a real prefill through the serving path (None if it
    kept no cache): it shows whether the KV cache is on and whether inference mode was.
    """
    from llmd.engine.model.loader import target_device
    from llmd.engine.model.onednn import PackedLinear

    device = target_device(profile)
    checks = [*_placement_checks(model, device), *_serving_checks(model, kv_sample),
              _attention_check(model, profile, device)]
    if profile.quantization == "nf4":
        checks.append(_bitsandbytes_check(model))
    if profile.quantization == "int8":
        from llmd.engine.model.int8 import Int8Linear

        quantized = sum(isinstance(module, Int8Linear) for module in model.modules())
        checks.append(Check("int8 Linear layers", quantized > 0,
                            f"{quantized} Linear layers in weight-only int8" if quantized else "none in int8",
                            "load with quantization: int8 (no Linear layer was quantized)"))
    if profile.onednn_linear:
        packed = sum(isinstance(module, PackedLinear) for module in model.modules())
        checks.append(Check("oneDNN prepacked Linear", packed > 0,
                            f"{packed} Linear layers on prepacked weights" if packed else "not packed",
                            "see the onednn_linear warning in the log (a torch without oneDNN, or a "
                            "model whose packed forward differed)"))
    return checks


def _placement_checks(model: PreTrainedModel, device: torch.device) -> list[Check]:
    """Weights in a GPU-worthy dtype, and every tensor on the device."""
    import torch

    from llmd.engine.model.loader import misplaced_tensors

    floats = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    weight_dtype = ", ".join(sorted(str(d).removeprefix("torch.") for d in floats)) or "none"
    misplaced = misplaced_tensors(model, device)
    return [
        Check("weights not float32 on a GPU", device.type == "cpu" or torch.float32 not in floats,
              f"{weight_dtype} on {device}", "use a bfloat16 or 4-bit profile (`dtype: bfloat16`)"),
        Check("nothing offloaded", not misplaced,
              f"every parameter and buffer on {device}" if not misplaced else f"{len(misplaced)} elsewhere, "
              f"e.g. {misplaced[0]}", "lower memory use (4-bit profile, smaller max_context); never offload"),
    ]


def _serving_checks(model: PreTrainedModel, kv_sample: torch.Tensor | None) -> list[Check]:
    """Eval mode, inference mode and the KV cache, as the serving path ran."""
    inference = kv_sample is not None and kv_sample.is_inference()
    return [
        Check("eval mode", not model.training, "dropout off" if not model.training else "training mode",
              "call model.eval() after loading"),
        Check("inference mode", inference,
              "no autograd state kept" if inference else "forward passes record autograd state",
              "run the model under torch.inference_mode()"),
        Check("KV cache on", bool(getattr(model.config, "use_cache", True)) and kv_sample is not None,
              "past keys/values kept between steps" if kv_sample is not None else "no cache kept",
              "pass use_cache=True; without it every token recomputes the whole sequence"),
    ]


def _attention_check(model: PreTrainedModel, profile: Profile, device: torch.device) -> Check:
    from llmd.engine.model.sdpa import attention_report

    report = attention_report(model, profile, device)
    if not report.sdpa:
        return Check("SDPA attention", False, report.detail, "set `attn_implementation: sdpa` in the profile")
    return Check("SDPA attention", report.fast, report.detail,
                 "the math backend is the slow reference on a GPU: check dtype (flash needs 16-bit) "
                 "and head_dim, or install a torch built for this GPU")


def _bitsandbytes_check(model: PreTrainedModel) -> Check:
    from llmd.engine.model.loader import import_bitsandbytes
    from llmd.errors import PreflightRefusal

    try:
        version = import_bitsandbytes()
    except PreflightRefusal as exc:
        return Check("bitsandbytes 4-bit", False, exc.message, "pip install bitsandbytes")
    import bitsandbytes as bnb

    quantized = sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    return Check("bitsandbytes 4-bit", quantized > 0,
                 f"bitsandbytes {version}, {quantized} Linear layers in 4-bit",
                 "load with quantization: nf4 (no Linear layer was quantized)")


def render_checkup(checkup: Checkup, planned_weights: int, planned_kv_per_token: int) -> str:
    """The measurement beside the plan, then one line per check with its fix when it failed."""
    def off(measured: int, planned: int) -> str:
        return f"{(measured - planned) / planned * 100:+.1f} %" if planned else "-"

    load, kv = checkup.load, checkup.kv_bytes_per_token
    lines = [
        f"measured after loading on {load.device} ({load.seconds:.1f} s):",
        f"  weights        planned {mib(planned_weights, 2):>14}  measured {mib(load.weight_bytes, 2):>14}  "
        f"{off(load.weight_bytes, planned_weights)}",
        f"  kv per token   planned {planned_kv_per_token / 1024:>10.2f} KiB  measured "
        f"{kv / 1024:>10.2f} KiB  {off(kv, planned_kv_per_token)}",
        f"  on the device  {mib(load.device_bytes, 2)}; process memory grew by "
        f"{mib(load.rss_growth_bytes, 2)}",
        "",
        "tuning checklist:",
    ]
    for check in checkup.checks:
        lines.append(f"  [{'pass' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
        if not check.ok:
            lines.append(f"         fix: {check.fix}")
    return "\n".join(lines)
