"""The preflight plan on the tiny demo model: its counts, CUDA-only options, RAM without torch; the
memory a vLLM plan measures on CUDA cards (torch.cuda faked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from msgspec.structs import replace

from llmd.config import load_profile
from llmd.errors import ConfigError
from llmd.preflight import hardware
from llmd.preflight.plan import plan_for_model
from llmd.preflight.shape import read_model_shape, shape_from_config
from llmd.units import GiB

BF16 = load_profile("24gb-bf16-compile")


def test_the_demo_model_counts_match_the_loaded_model(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    shape = read_model_shape(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert shape.params == sum(p.numel() for p in model.parameters())
    config = json.loads((tiny_model / "config.json").read_text())
    assert replace(shape_from_config(config), counted_from=shape.counted_from) == shape


def test_gpu_memory_plans_only_cuda_profiles(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="--gpu-memory plans a CUDA profile"):
        plan_for_model(tiny_model, load_profile("cpu"), "8GiB")
    with pytest.raises(ConfigError, match="--gpu-memory: not a size: `lots`"):
        plan_for_model(tiny_model, BF16, "lots")


def test_the_cpu_plan_measures_available_ram_without_torch(tiny_model: Path) -> None:
    code = (
        "import sys; from llmd.config import load_profile; from llmd.preflight.plan import plan_for_model; "
        f"plan = plan_for_model({str(tiny_model)!r}, load_profile('cpu')); "
        "assert plan.budget.source == 'available RAM now', plan.budget; "
        "assert 'torch' not in sys.modules, 'preflight imported torch'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_vllm_plan_on_cuda_takes_each_cards_free_memory_from_nvml(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    totals, used = [80 * GiB, 80 * GiB], [1 * GiB, 5 * GiB]  # a desktop, then a leftover process
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(
        total_memory=totals[i]))
    monkeypatch.setattr(torch.cuda, "device_memory_used", lambda i: used[i])
    profile = load_profile("multi-gpu-bf16", gpus=2)
    assert hardware.rank_budget(profile) == (75 * GiB, 2)  # the fuller card bounds every rank

    def no_nvml(index: int) -> int:
        raise ModuleNotFoundError("No module named 'pynvml'")

    monkeypatch.setattr(torch.cuda, "device_memory_used", no_nvml)
    with caplog.at_level("WARNING", logger="llmd.preflight"):
        assert hardware.rank_budget(profile) == (80 * GiB, 2)
    assert "planning on its total 80.00 GiB" in caplog.text
