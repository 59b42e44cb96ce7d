"""The checkup on demo models: its measured memory is within 10 % of the preflight plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmd.checkup import run_checkup
from llmd.demo.build import build_demo_model
from llmd.preflight.hardware import MemoryBudget
from llmd.preflight.plan import memory_plan
from llmd.preflight.shape import read_model_shape
from tests.helpers.configs import eager_profile

CPU = eager_profile()


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_plan_is_within_10_percent_of_measured_memory(size: str, tmp_path: Path, tiny_model: Path) -> None:
    model = tiny_model if size == "tiny" else build_demo_model(tmp_path / size, size)
    shape = read_model_shape(model)
    plan = memory_plan(shape, CPU, MemoryBudget(64 * 2**30, "test"))
    planned_weights = plan.weight_bytes
    checkup = run_checkup(model, CPU)
    assert checkup.load.weight_bytes == pytest.approx(planned_weights, rel=0.10)
    assert checkup.kv_bytes_per_token == shape.kv_bytes_per_token(CPU.dtype)
    assert checkup.passed, checkup.checks
