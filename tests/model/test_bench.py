"""`llmd-bench --in-process`: the runner and transformers' generate on the tiny model, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.bench import bench_json
from tests.helpers.configs import eager_profile_file

Capture = pytest.CaptureFixture[str]


def test_in_process_batch_on_the_tiny_model(tiny_model: Path, tmp_path: Path, capsys: Capture) -> None:
    profile = str(eager_profile_file(tmp_path))
    code, report = bench_json(capsys, "--in-process", str(tiny_model), "--profile", profile,
                              "-c", "2", "-n", "1", "--max-tokens", "8", "--prompt-tokens", "30",
                              "--warmup", "0")
    assert code == 0 and report["prompt_tokens"] == 30
    labels = [run["label"] for run in report["runs"]]
    assert labels == ["in-process runner", "in-process generate"]
    for run in report["runs"]:
        assert run["ok"] == 2 and run["completion_tokens"] == 16 and run["chunks_per_token"] == 1.0
