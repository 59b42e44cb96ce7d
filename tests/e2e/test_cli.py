"""The `llmd` command line: demo model, the default model, configuration errors, the memory check."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmd.demo.files import read_demo_cycle
from llmd.errors import EXIT_CONFIG, EXIT_DEVICE_UNAVAILABLE, EXIT_PREFLIGHT
from tests.helpers.configs import LLAMA_3_1_8B, eager_profile_file
from tests.helpers.daemon import start_daemon


def llmd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmd.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_demo_model_command_writes_a_loadable_model(tmp_path: Path) -> None:
    result = llmd("demo-model", str(tmp_path / "m"), "--size", "tiny")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m" / "config.json").is_file() and read_demo_cycle(tmp_path / "m")


def test_configuration_errors_exit_78_with_the_fix(tmp_path: Path) -> None:
    result = llmd("serve", "--profile", "no-such-profile")
    assert result.returncode == EXIT_CONFIG
    assert "no profile named `no-such-profile`" in result.stderr and "cpu" in result.stderr
    settings = tmp_path / "llmd.yaml"
    settings.write_text("prot: 9000\n")
    result = llmd("serve", "--config", str(settings))
    assert result.returncode == EXIT_CONFIG and "did you mean `port`" in result.stderr


def test_serve_without_a_model_builds_and_serves_the_demo_model(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        models = httpx.get(f"{daemon.base_url}/models").json()
        assert [m["id"] for m in models["data"]] == ["llmd-demo"]
        assert (tmp_path / "home" / "demo-model-small" / "config.json").is_file()
        reply = httpx.post(f"{daemon.base_url}/chat/completions", timeout=60, json={
            "model": "llmd-demo", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3, "temperature": 0})
        assert reply.json()["choices"][0]["message"]["content"] == "Hello! I"
        log = daemon.log()
        assert "memory plan: llmd-demo with profile cpu" in log and "FITS" in log
        # the plan's weights beside what loading measured: the same bytes for float32 safetensors
        pattern = r"memory: weights planned ([\d.]+) MiB, on the device after loading \1 MiB"
        assert re.search(pattern, log), log
    finally:
        assert daemon.stop() == 0, daemon.log()


def write_profile(path: Path, yaml_text: str) -> Path:
    path.write_text(yaml_text)
    return path


def llama_8b_config_only(tmp_path: Path) -> Path:
    """A Llama-3.1-8B model directory with its config.json and no weights."""
    model = tmp_path / "Llama-3.1-8B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    return model


def test_check_prints_the_plan_and_exits_0_when_it_fits(tiny_model: Path, tmp_path: Path) -> None:
    result = llmd("check", "--model", str(tiny_model), "--profile", str(eager_profile_file(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "weights" in result.stdout and "kv cache" in result.stdout
    assert "available RAM now" in result.stdout and "FITS" in result.stdout


def test_check_exits_77_with_the_fixes_when_it_does_not_fit(tiny_model: Path, tmp_path: Path) -> None:
    crowded = write_profile(tmp_path / "crowded.yaml", "device: cpu\nmax_running: 100000000\n")
    result = llmd("check", "--model", str(tiny_model), "--profile", str(crowded))
    assert result.returncode == EXIT_PREFLIGHT, result.stderr
    assert "DOES NOT FIT" in result.stdout and "  max_running: " in result.stdout
    assert "a machine with at least" in result.stdout


def test_check_plans_a_gpu_profile_for_a_given_card_on_any_machine(tmp_path: Path) -> None:
    model = llama_8b_config_only(tmp_path)
    fits = llmd("check", "--model", str(model), "--profile", "24gb-bf16-compile", "--gpu-memory", "24GiB")
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert "memory plan: Llama-3.1-8B" in fits.stdout and "--gpu-memory 24GiB" in fits.stdout
    refused = llmd("check", "--model", str(model), "--profile", "24gb-bf16-compile", "--gpu-memory", "12GiB")
    assert refused.returncode == EXIT_PREFLIGHT
    assert "--profile 12gb-4bit" in refused.stdout and "fits" in refused.stdout


def test_check_plans_the_multi_gpu_profile_per_gpu_for_the_gpus_given(tiny_model: Path) -> None:
    result = llmd("check", "--model", str(tiny_model), "--profile", "multi-gpu-bf16", "--gpus", "4",
                  "--gpu-memory", "80GiB")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "profile multi-gpu-bf16 (vllm, bfloat16" in out  # tensor: auto became the 4 GPUs given
    assert "TP 4 x PP 1 x DP 1 = 4 GPUs on 1 node(s) x 4 GPU(s) of 80.00 GiB" in out
    assert "exceeds the model's 2 KV heads" in out and "FITS:" in out  # the tiny model: 4 heads, 2 KV heads


def test_check_without_cuda_refuses_a_cuda_profile_and_names_gpu_memory(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the plan measures it")
    result = llmd("check", "--model", str(llama_8b_config_only(tmp_path)), "--profile", "12gb-4bit")
    assert result.returncode == EXIT_DEVICE_UNAVAILABLE  # not 77: systemd restarts it once the driver is up
    assert "CUDA is not available here" in result.stderr and "--gpu-memory" in result.stderr


def test_serve_on_vllm_without_vllm_here_exits_78_naming_its_environment(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: serve would start it")
    profile = tmp_path / "tp.yaml"
    profile.write_text("engine: vllm\ndevice: cuda\ndtype: bfloat16\nparallel:\n  tensor: 2\n")
    result = llmd("serve", "--model", str(tmp_path), "--profile", str(profile))
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert "asks for `engine: vllm`, and vLLM is not installed in this environment" in result.stderr
    assert "scripts/vllm-env DIR" in result.stderr


def test_serve_counts_the_gpus_for_tensor_auto_and_waits_for_cuda_without_them(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: serve counts its GPUs")
    result = llmd("serve", "--model", str(tmp_path), "--profile", "multi-gpu-bf16")
    assert result.returncode == EXIT_DEVICE_UNAVAILABLE, result.stderr  # systemd retries: a late driver
    assert "`parallel.tensor: auto` counts the GPUs, and CUDA sees none here" in result.stderr


def test_serve_refuses_with_77_before_loading_anything(tiny_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "config-only"  # no weights, no tokenizer: loading would fail with 1
    model.mkdir()
    shutil.copy(tiny_model / "config.json", model)
    greedy = write_profile(tmp_path / "greedy.yaml", "device: cpu\nmemory_headroom: 100TiB\n")
    result = llmd("serve", "--model", str(model), "--profile", str(greedy), "--port", "0")
    assert result.returncode == EXIT_PREFLIGHT, result.stderr
    assert "does not fit" in result.stderr and "DOES NOT FIT" in result.stderr
    assert "a machine with at least" in result.stderr and "serving" not in result.stderr


def test_profile_auto_is_logged_with_its_reason(tiny_model: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "llmd.cli", "check", "--model", str(tiny_model),
                             "--profile", "auto", "--no-load"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert re.search(r"profile auto -> (cpu|cpu-bf16|12gb-4bit|24gb-bf16-compile) \(.+\)", result.stderr)
