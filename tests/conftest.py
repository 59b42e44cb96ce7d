"""Shared fixtures (a tiny demo model built offline, a session `llmd serve`) and the tier markers.

The folder a test lives in is its tier (DESIGN.md): tests/unit, model, engine, api, e2e, gpu.
Each item gets the marker named after its folder, so `-m "not e2e"` works as well as a path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.daemon import Daemon, is_llmd_serve, start_daemon

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS = Path(__file__).parent
TIERS = ("unit", "model", "engine", "api", "e2e", "gpu", "vllm")


def tier_of(item: pytest.Item) -> str | None:
    """The tier folder an item lives in, or None for a test outside them."""
    parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each item with its tier; skip the gpu tier where CUDA is not available, and `slow`
    tests unless LLMD_SLOW=1 (`scripts/dev test slow`; CI runs them as a step of their own)."""
    tiers = {item: tier_of(item) for item in items}
    for item, tier in tiers.items():
        if tier is not None:
            item.add_marker(tier)
    if os.environ.get("LLMD_SLOW") != "1":
        skip_slow = pytest.mark.skip(reason="slow: `scripts/dev test slow` runs it")
        for item in items:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(skip_slow)
    if "gpu" in tiers.values() and not cuda_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in (item for item, tier in tiers.items() if tier == "gpu"):
            item.add_marker(skip)


def cuda_available() -> bool:
    """Whether torch sees a CUDA device; imported only here, so other tiers never pay for torch."""
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model (random weights, local tokenizer, chat template)."""
    from llmd.demo.build import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "tiny", "tiny")


@pytest.fixture(autouse=True)
def stop_daemons_left_running() -> Iterator[None]:
    """Stop any `llmd serve` a test started and left running (it failed before its own stop).

    Otherwise it serves on until its Popen is collected in some later test, where the
    "ResourceWarning: subprocess ... is still running" surfaces as an unraisable error.
    Child processes are compared, not Daemon objects, so a daemon counts however a test
    started it (tests.helpers.daemon, a CLI subprocess). Fixtures of wider scope start before this one.
    """
    before = {child.pid for child in psutil.Process().children()}
    yield
    for child in psutil.Process().children():
        if child.pid not in before and is_llmd_serve(child):
            child.terminate()
            try:
                child.wait(20)
            except psutil.TimeoutExpired:
                child.kill()
                child.wait(20)


@pytest.fixture(scope="session")
def daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon serving the tiny model for the end-to-end tests."""
    running = start_daemon(tmp_path_factory.mktemp("daemon"), "--model", str(tiny_model),
                           "--served-model-name", "tiny")
    yield running
    code = running.stop()
    assert code == 0, f"exit code {code}:\n{running.log()}"
