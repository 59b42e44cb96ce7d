"""The sizes the map holds the code to (issue 13): rooms small enough to say what lives in them."""

from __future__ import annotations

import ast
from pathlib import Path

import llmd

PACKAGE = Path(llmd.__file__).parent
MODULE_LINES = 450
RUNNER_LINES = 250


def test_every_module_is_under_the_size_limit() -> None:
    sizes = {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in PACKAGE.rglob("*.py")}
    assert len(sizes) > 60
    assert {name: lines for name, lines in sizes.items() if lines >= MODULE_LINES} == {}


def test_the_model_runner_class_is_under_its_limit() -> None:
    tree = ast.parse((PACKAGE / "engine" / "model" / "runner.py").read_text(encoding="utf-8"))
    (runner,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ModelRunner"]
    assert runner.end_lineno is not None
    assert runner.end_lineno - runner.lineno + 1 < RUNNER_LINES
