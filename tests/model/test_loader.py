"""Loading exactly as the profile says: placement, 4-bit, SDPA backends, the tuning checklist."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from llmd.config import load_profile
from llmd.engine.model.checklist import tuning_checklist
from llmd.engine.model.loader import load_model, misplaced_tensors, target_device, verify_placement
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.sdpa import BACKENDS, sdpa_backend_status
from llmd.engine.types import Request, SamplingParams
from llmd.errors import PreflightRefusal
from tests.helpers.configs import eager_profile, nf4_cpu_profile

CPU = eager_profile()


def kv_keys(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    """A key tensor from a real prefill through the runner."""
    request = Request("probe", prompt, SamplingParams(max_tokens=2))
    runner.first_token(request)
    keys = runner.kv_tensors(request.request_id)[0][0]
    runner.release("probe")
    return keys


def test_loads_onto_the_profile_device_in_its_dtype(tiny_model: Path) -> None:
    model, report = load_model(tiny_model, replace(CPU, dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not model.training and misplaced_tensors(model, torch.device("cpu")) == []
    params = sum(p.numel() for p in model.parameters())
    assert report.weight_bytes >= params * 2 and report.device_bytes == report.weight_bytes


def test_a_tensor_on_another_device_is_refused_by_name(tiny_model: Path) -> None:
    model, _ = load_model(tiny_model, CPU)
    norm = model.model.norm
    norm.weight = torch.nn.Parameter(torch.empty_like(norm.weight, device="meta"))
    assert misplaced_tensors(model, torch.device("cpu")) == ["model.norm.weight on meta"]
    with pytest.raises(PreflightRefusal, match=r"1 tensors are not on cpu: model\.norm\.weight on meta"):
        verify_placement(model, torch.device("cpu"))


def test_a_cuda_profile_without_cuda_refuses_instead_of_using_the_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    with pytest.raises(PreflightRefusal, match=r"needs CUDA.*does not fall back to the CPU"):
        target_device(load_profile("24gb-bf16-compile"))


def test_sdpa_backends_on_this_cpu_say_why_not() -> None:
    statuses = {s.name: s for s in sdpa_backend_status(torch.device("cpu"), torch.float32, 4, 16)}
    assert set(statuses) == set(BACKENDS)
    assert statuses["math"].usable and statuses["flash"].usable
    assert not statuses["cudnn"].usable and statuses["cudnn"].reason


def test_checklist_passes_for_the_cpu_profile(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, CPU)
    checks = tuning_checklist(runner.model, CPU, kv_keys(runner, list(range(3, 12))))
    assert [c.name for c in checks if not c.ok] == [], checks
    assert {c.name for c in checks} >= {"nothing offloaded", "eval mode", "inference mode", "KV cache on",
                                        "SDPA attention", "weights not float32 on a GPU",
                                        "oneDNN prepacked Linear"}


def test_checklist_catches_training_mode_no_cache_and_eager_attention(tiny_model: Path) -> None:
    eager = replace(CPU, attn_implementation="eager", sdpa_backends=())
    model, _ = load_model(tiny_model, eager)
    model.train()
    with torch.no_grad():  # autograd off, but not inference mode
        keys = model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=True).cache.layers[0].keys
    failed = {c.name: c for c in tuning_checklist(model, eager, keys) if not c.ok}
    assert set(failed) == {"eval mode", "inference mode", "SDPA attention"}
    assert all(c.fix for c in failed.values())
    failed = {c.name for c in tuning_checklist(model, eager, None) if not c.ok}
    assert "KV cache on" in failed


def test_nf4_loads_with_bitsandbytes_and_passes_the_checklist(tiny_model: Path, tmp_path: Path) -> None:
    profile = load_profile(str(nf4_cpu_profile(tmp_path)))
    runner = ModelRunner(tiny_model, profile)
    checks = {c.name: c for c in tuning_checklist(runner.model, profile, kv_keys(runner, list(range(3, 12))))}
    assert checks["bitsandbytes 4-bit"].ok, checks["bitsandbytes 4-bit"]
    assert "Linear layers in 4-bit" in checks["bitsandbytes 4-bit"].detail
    assert all(c.ok for c in checks.values()), checks
    _, full = load_model(tiny_model, replace(CPU, dtype="bfloat16"))
    assert runner.load_report.weight_bytes < 0.8 * full.weight_bytes
