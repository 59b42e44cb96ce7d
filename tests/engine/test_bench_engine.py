"""`llmd bench --in-process MODEL --method engine`: llmd's engine timed without HTTP, on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.bench import bench_json

Capture = pytest.CaptureFixture[str]


def test_engine_beside_the_runner_in_the_order_asked(tiny_model: Path, capsys: Capture) -> None:
    code, report = bench_json(capsys, "--in-process", str(tiny_model), "--method", "engine",
                              "--method", "runner", "-c", "2", "-n", "2", "--max-tokens", "8",
                              "--prompt-tokens", "30", "--ignore-eos", "--repeats", "2", timeout=60)
    assert code == 0 and report["prompt_tokens"] == 30
    assert [run["label"] for run in report["runs"]] == ["in-process engine", "in-process runner"] * 2
    engine_runs = [run for run in report["runs"] if run["label"] == "in-process engine"]
    for run in engine_runs:  # 2 clients x 2 requests, every one its 8 tokens
        assert run["ok"] == 4 and run["errors"] == 0 and run["completion_tokens"] == 32
        # each distinct prompt's tag may tokenize a token longer or shorter than the one fitted
        assert abs(run["prompt_tokens"] - 30) <= 2 and 0 < run["chunks_per_token"] <= 1.0
        assert run["ttft_ms_p50"] > 0 and run["gap_ms_p50"] > 0
    assert set(report["median_output_tokens_per_s"]) == {"in-process engine", "in-process runner"}
    # the runner decodes one prompt for all; the report says so where both ran
    assert report["distinct_prompts"] is False and report["temperature"] == 0.0


def test_engine_alone_keeps_the_plan_and_reports_refusals(tiny_model: Path, capsys: Capture) -> None:
    code, report = bench_json(capsys, "--in-process", str(tiny_model), "--method", "engine",
                              "-c", "2", "-n", "1", "--max-tokens", "6", "--prompt-tokens", "20",
                              "--ignore-eos", "--warmup", "0", "--temperature", "0.7", timeout=60)
    assert code == 0 and [run["label"] for run in report["runs"]] == ["in-process engine"]
    assert report["distinct_prompts"] is True and report["temperature"] == 0.7
    assert report["runs"][0]["ok"] == 2 and report["runs"][0]["completion_tokens"] == 12
    assert any("llmd's engine without HTTP" in note for note in report["notes"])

    # a request the engine refuses (the budget past the model's context) is that request's error
    code, report = bench_json(capsys, "--in-process", str(tiny_model), "--method", "engine",
                              "-c", "2", "-n", "1", "--max-tokens", "100000", "--warmup", "0", timeout=60)
    run = report["runs"][0]
    assert code == 1 and run["ok"] == 0 and run["errors"] == 2
    assert all("ContextLengthExceeded" in message for message in run["error_messages"])
