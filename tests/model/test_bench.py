"""`llmd-bench --in-process`: the runner and transformers' generate on the tiny model, no server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from llmd.bench import command

Capture = pytest.CaptureFixture[str]


def _bench_json(capsys: Capture, *argv: str) -> tuple[int, dict[str, Any]]:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args([*argv, "--json", "--timeout", "30"]))
    return code, json.loads(capsys.readouterr().out)


def test_in_process_batch_on_the_tiny_model(tiny_model: Path, capsys: Capture) -> None:
    code, report = _bench_json(capsys, "--in-process", str(tiny_model), "-c", "2", "-n", "1",
                               "--max-tokens", "8", "--prompt-tokens", "30", "--warmup", "0")
    assert code == 0 and report["prompt_tokens"] == 30
    labels = [run["label"] for run in report["runs"]]
    assert labels == ["in-process runner", "in-process generate"]
    for run in report["runs"]:
        assert run["ok"] == 2 and run["completion_tokens"] == 16 and run["chunks_per_token"] == 1.0
