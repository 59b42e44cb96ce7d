"""`llmd check` on a loaded model: the plan next to what loading measured, and the checklist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.configs import eager_profile, eager_profile_file

CPU = eager_profile()


def llmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmd.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_check_loads_the_model_and_prints_the_checklist(tiny_model: Path, tmp_path: Path) -> None:
    result = llmd("check", "--model", str(tiny_model), "--profile", str(eager_profile_file(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "FITS" in out and "measured after loading on cpu" in out
    for name in ("nothing offloaded", "eval mode", "inference mode", "KV cache on", "SDPA attention"):
        assert f"[pass] {name}" in out
    assert "all checks passed" in out


def test_a_failing_check_prints_its_fix_and_exits_1(tiny_model: Path, tmp_path: Path) -> None:
    eager = tmp_path / "eager.yaml"
    eager.write_text("device: cpu\nattn_implementation: eager\n")
    result = llmd("check", "--model", str(tiny_model), "--profile", str(eager))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[FAIL] SDPA attention: attention implementation is `eager`" in result.stdout
    assert "fix: set `attn_implementation: sdpa` in the profile" in result.stdout
    assert "1 of" in result.stdout and "checks failed" in result.stdout


def test_no_load_prints_only_the_plan(tiny_model: Path) -> None:
    result = llmd("check", "--model", str(tiny_model), "--no-load")
    assert result.returncode == 0 and "skipped (--no-load)" in result.stdout
    assert "measured after loading" not in result.stdout
