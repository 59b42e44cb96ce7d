"""The vllm tier runs vLLM inside the test process: its imports and start-up raise deprecation and
future warnings from torch and its own dependencies, which the suite's `error` filter would turn
into failures far from anything llmd does (a start that "fails" on `torch.jit.script_method`).
Those two kinds are ignored here, in this tier only."""

from __future__ import annotations

from pathlib import Path

import pytest

VLLM_NOISE = ("ignore::DeprecationWarning", "ignore::FutureWarning")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Let this tier's tests run through vLLM's own warnings."""
    for item in items:
        if item.path.parent.name == "vllm":
            for noise in VLLM_NOISE:
                item.add_marker(pytest.mark.filterwarnings(noise))


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo model: vLLM's CPU attention refuses the tiny one's 16-wide heads
    ("Unsupported CPU attention configuration: head_dim=16"); the small one's are 64 wide."""
    from llmd.demo.build import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "small", "small")
