"""The field notes' tuning checklist, run on a model as loaded and served (`llmd check`'s verdicts).

It inspects torch modules and tensors, so it lives on the model side; `llmd.checkup` loads the
model, runs it, and renders what it finds next to the memory plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from llmd.config import Profile
from llmd.engine.model.int8 import Int8Linear
from llmd.engine.model.loader import import_bitsandbytes, misplaced_tensors, target_device
from llmd.engine.model.onednn import PACKED
from llmd.engine.model.probes import FastPaths
from llmd.engine.model.sdpa import attention_report
from llmd.errors import PreflightRefusal


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
    checks = [*_placement_checks(model, device), *_serving_checks(model, kv_sample),
              _attention_check(model, profile, device)]
    if profile.quantization == "nf4":
        checks.append(_bitsandbytes_check(model))
    if profile.quantization == "int8":
        quantized = sum(isinstance(module, Int8Linear) for module in model.modules())
        checks.append(Check("int8 Linear layers", quantized > 0,
                            f"{quantized} Linear layers in weight-only int8" if quantized else "none in int8",
                            "load with quantization: int8 (no Linear layer was quantized)"))
    if profile.onednn_linear:
        packed = sum(isinstance(module, PACKED) for module in model.modules())
        checks.append(Check("oneDNN prepacked Linear", packed > 0,
                            f"{packed} Linear layers on prepacked weights" if packed else "not packed",
                            "see the onednn_linear warning in the log (a torch without oneDNN, or a "
                            "model whose packed forward differed)"))
    return checks


def lone_step_check(profile: Profile, fast: FastPaths) -> Check | None:
    """Whether the lone stream's step the profile asks for (`lone_step` other than eager) was
    compiled and proven at load; None when it asks for none."""
    tuned = "" if fast.lone_templated is None else f", {fast.lone_templated} matmuls on the GEMM template"
    proven = f"one graph ({profile.lone_step}), compiled and proven in {fast.lone_seconds:.1f} s{tuned}"
    return _compiled_check("lone step", "a lone stream decodes", "lone_step", profile.lone_step,
                           fast.lone_problem, proven)


def batch_step_check(profile: Profile, fast: FastPaths) -> Check | None:
    """Whether the step of two or more streams the profile asks for (`batch_step: compiled`) was
    compiled and proven at load; None when it asks for none."""
    proven = f"one graph, compiled and proven in {fast.batch_seconds:.1f} s"
    return _compiled_check("batch step", "two or more streams decode", "batch_step", profile.batch_step,
                           fast.batch_problem, proven)


def _compiled_check(name: str, streams: str, key: str, asked: str, problem: str | None,
                    proven: str) -> Check | None:
    if asked == "eager":
        return None
    if problem is not None:
        return Check(f"compiled {name}", False, f"runs eager: {problem}",
                     f"{streams} eager, slower, after paying the compile at every start: set {key}: eager, "
                     "or report the probe's figures above")
    return Check(f"compiled {name}", True, proven)


def _placement_checks(model: PreTrainedModel, device: torch.device) -> list[Check]:
    """Weights in a GPU-worthy dtype, and every tensor on the device."""
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
    report = attention_report(model, profile, device)
    if not report.sdpa:
        return Check("SDPA attention", False, report.detail, "set `attn_implementation: sdpa` in the profile")
    return Check("SDPA attention", report.fast, report.detail,
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
