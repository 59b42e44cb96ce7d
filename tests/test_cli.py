"""The `llmd` command line: demo model, the default model, configuration errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from llmd.demo_model import read_demo_cycle
from llmd.errors import EXIT_CONFIG
from tests.conftest import start_daemon


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
    finally:
        assert daemon.stop() == 0, daemon.log()
