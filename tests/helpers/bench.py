"""`llmd bench` run in the test's own process, as its command line would run it."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from llmd.bench import command


def bench_json(capsys: pytest.CaptureFixture[str], *argv: str,
               timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
    """`llmd bench ARGV --json`: its exit code and the report it printed."""
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args([*argv, "--json", "--timeout", str(timeout)]))
    return code, json.loads(capsys.readouterr().out)
