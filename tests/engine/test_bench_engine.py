"""`llmd bench --in-process MODEL --method engine`: llmd's engine timed without HTTP, on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.bench import bench_json
from tests.helpers.configs import eager_profile_file

Capture = pytest.CaptureFixture[str]


def test_the_engine_takes_the_http_plan(tiny_model: Path, tmp_path: Path, capsys: Capture) -> None:
    profile = str(eager_profile_file(tmp_path))
    code, report = bench_json(capsys, "--in-process", str(tiny_model), "--profile", profile,
                              "--method", "engine", "-c", "2", "-n", "2", "--max-tokens", "8",
                              "--prompt-tokens", "30", "--ignore-eos", "--repeats", "2",
                              "--temperature", "0.7", timeout=60)
    assert code == 0 and abs(report["prompt_tokens"] - 30) <= 2
    assert [run["label"] for run in report["runs"]] == ["in-process engine"] * 2
    for run in report["runs"]:  # 2 clients x 2 requests, every one its 8 tokens
        assert run["ok"] == 4 and run["errors"] == 0 and run["completion_tokens"] == 32
        # each distinct prompt's tag may tokenize a token longer or shorter than the one fitted
        assert abs(run["prompt_tokens"] - 30) <= 2 and 0 < run["chunks_per_token"] <= 1.0
        assert run["ttft_ms_p50"] > 0 and run["gap_ms_p50"] > 0
    assert report["distinct_prompts"] is True and report["temperature"] == 0.7
    assert any("llmd's engine without HTTP, 2 client(s) x 2 requests" in note for note in report["notes"])


def test_a_request_the_engine_refuses_is_that_requests_error(
    tiny_model: Path, tmp_path: Path, capsys: Capture
) -> None:
    # the budget past the model's context: refused before it reaches the worker
    profile = str(eager_profile_file(tmp_path))
    code, report = bench_json(capsys, "--in-process", str(tiny_model), "--profile", profile,
                              "--method", "engine", "-c", "2", "-n", "1", "--max-tokens", "100000",
                              "--warmup", "0", timeout=60)
    run = report["runs"][0]
    assert code == 1 and run["ok"] == 0 and run["errors"] == 2
    assert all("ContextLengthExceeded" in message for message in run["error_messages"])
