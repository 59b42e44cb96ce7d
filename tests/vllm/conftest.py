"""The vllm tier runs vLLM inside the test process: its imports and start-up raise deprecation and
future warnings from torch and its own dependencies, which the suite's `error` filter would turn
into failures far from anything llmd does (a start that "fails" on `torch.jit.script_method`).
Those two kinds are ignored here, in this tier only.

vLLM also closes its zmq sockets at shutdown but leaves their context to the garbage collector, which
warns about it (`ResourceWarning: Unclosed context`, raised inside `__del__` under the suite's `error`
filter): ignored in this tier's tests, and the engines still uncollected at the end are collected
before pytest's own last collection, where it would fail the run after every test passed."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import processes

ZMQ_CONTEXT = "Unclosed context"
VLLM_NOISE = ("ignore::DeprecationWarning", "ignore::FutureWarning", f"ignore:{ZMQ_CONTEXT}:ResourceWarning")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Let this tier's tests run through vLLM's own warnings."""
    for item in items:
        if item.path.parent.name == "vllm":
            for noise in VLLM_NOISE:
                item.add_marker(pytest.mark.filterwarnings(noise))


def pytest_unconfigure() -> None:
    """Collect what vLLM left to the garbage collector, its zmq contexts' warnings ignored."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ZMQ_CONTEXT, ResourceWarning)
        gc.collect()


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo model: vLLM's CPU attention refuses the tiny one's 16-wide heads
    ("Unsupported CPU attention configuration: head_dim=16"); the small one's are 64 wide."""
    from llmd.demo.build import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "small", "small")


@pytest.fixture
def no_process_left() -> Iterator[None]:
    """Fails the test that leaves any process it started running (vLLM's EngineCore, its workers, a
    worker node), then kills them, so the next test starts on a quiet machine."""
    with processes.no_process_left():
        yield
