"""Profiles end to end: `llmd serve` loads the tiny model in 4 bits, or in int8, and answers; the
shipped CPU profile compiles its steps before /ready."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.helpers.configs import nf4_cpu_profile
from tests.helpers.daemon import start_daemon


@pytest.mark.parametrize("profile", ["nf4", pytest.param("cpu-int8", marks=pytest.mark.slow)])
def test_a_quantized_profile_serves_a_request(tiny_model: Path, tmp_path: Path, profile: str) -> None:
    chosen = str(nf4_cpu_profile(tmp_path)) if profile == "nf4" else profile
    daemon = start_daemon(tmp_path, "--model", str(tiny_model), "--profile", chosen)
    try:
        client = openai.OpenAI(base_url=daemon.base_url, api_key="none")
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=8,
            messages=[{"role": "user", "content": "Hello"}],
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert reply.choices[0].finish_reason == "length"
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "model loaded" in daemon.log()
    if profile == "cpu-int8":
        log = daemon.log()
        assert "Linear layers in int8" in log and "int8: probe logits within" in log
        assert "loading peak" in log  # the plan logged before loading counts the bfloat16 peak
        # the shipped lone step, compiled with max-autotune and proven, its template copy planned
        assert "(lone_step: max-autotune, compiled and proven in" in log
        assert "matmuls on inductor's GEMM template" in log and "lone step weights" in log
        # and the shipped batch step
        assert "(batch_step: compiled, compiled and proven in" in log


@pytest.mark.slow
def test_the_default_cpu_profile_compiles_both_steps(tiny_model: Path, tmp_path: Path) -> None:
    # serve's default profile, compiled from an empty inductor cache: its kernels timed afresh
    daemon = start_daemon(tmp_path, "--model", str(tiny_model), "--profile", "cpu",
                          env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}, ready_timeout=600)
    try:
        client = openai.OpenAI(base_url=daemon.base_url, api_key="none")
        reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=8,
                                               messages=[{"role": "user", "content": "Hello"}])
        assert reply.usage is not None and reply.usage.completion_tokens == 8
    finally:
        assert daemon.stop() == 0, daemon.log()
    log = daemon.log()
    assert "with profile cpu " in log and "lone step weights" in log
    assert "(lone_step: max-autotune, compiled and proven in" in log
    assert "(batch_step: compiled, compiled and proven in" in log
    assert "TypedStorage" not in log  # torch's own autotuner trips that deprecation; not the user's concern
