"""The preflight plan on the tiny demo model: its counts, CUDA-only options, RAM without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from msgspec.structs import replace

from llmd.config import load_profile
from llmd.errors import ConfigError
from llmd.preflight.plan import plan_for_model
from llmd.preflight.shape import read_model_shape, shape_from_config

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
