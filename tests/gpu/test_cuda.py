"""The shipped CUDA profiles on a real GPU: the model lands on the device and serves the walk.

Skipped without CUDA (the tier's conftest); `scripts/gpu_check.py` is the longer GPU check
(an 8B shape, memory plan against measurement, compiled against eager timing).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmd.bench.decoder import InProcessDecoder
from llmd.config import load_profile
from llmd.demo.files import read_demo_cycle
from llmd.shipped import shipped_dir

MESSAGES = [{"role": "user", "content": "Say something in Korean."}]
SHIPPED = [load_profile(path.stem, gpus=1) for path in shipped_dir("profiles").glob("*.yaml")]
# llmd's own engine on CUDA; the vLLM profiles run in the vLLM environment (README: manual checks)
CUDA_PROFILES = sorted(p.name for p in SHIPPED if p.device == "cuda" and p.engine == "native")


def test_the_shipped_cuda_profiles_are_the_ones_the_readme_names() -> None:
    assert CUDA_PROFILES == ["12gb-4bit", "24gb-bf16-compile"]
    assert sorted(p.name for p in SHIPPED if p.device == "cuda" and p.engine == "vllm") == ["multi-gpu-bf16"]


@pytest.mark.parametrize("name", CUDA_PROFILES)
def test_every_weight_lands_on_the_gpu(tiny_model: Path, name: str) -> None:
    decoder = InProcessDecoder(tiny_model, name)
    devices = {parameter.device.type for parameter in decoder.runner.model.parameters()}
    assert devices == {"cuda"}


def test_the_bf16_profile_decodes_the_demo_walk_on_the_gpu(tiny_model: Path) -> None:
    decoder = InProcessDecoder(tiny_model, "24gb-bf16-compile")
    assert next(decoder.runner.model.parameters()).dtype == torch.bfloat16
    trace = decoder.decode(decoder.prompt_ids(MESSAGES), 48)
    assert trace.token_ids == read_demo_cycle(tiny_model)[:48]


def test_the_4bit_profile_decodes_on_the_gpu(tiny_model: Path) -> None:
    decoder = InProcessDecoder(tiny_model, "12gb-4bit")
    trace = decoder.decode(decoder.prompt_ids(MESSAGES), 16)
    assert len(trace.token_ids) == 16
