"""The layer rule the map (DESIGN.md) states: outside the model side, nothing imports torch.

The API, the settings, the scheduling side of the engine, the service parts and the tools
import without torch, in a fresh interpreter as `llmd serve` starts; a module that drags it
in would cost every tool seconds and memory, and the API tier its fake engine.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import llmd

# Where torch is allowed: the model side, and the tokenizer (transformers loads torch with it;
# DESIGN.md allows transformers there). The worker imports both lazily, on its own thread.
MODEL_SIDE = {
    *(f"llmd.engine.model.{name}" for name in (
        "abandon", "attention", "batch", "checklist", "dynamic_batch", "graph_call", "int8", "layer_walk",
        "loader",
        "lone_step", "onednn", "prefill", "prefix_cache", "request_cache", "probes", "runner", "sampling",
        "sdpa", "sequences", "static_batch", "threads", "timing",
    )),
    "llmd.engine.tokenizer",
}


def torch_free_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(llmd.__path__, "llmd.")]
    return sorted(name for name in names if name not in MODEL_SIDE)


def test_every_module_outside_the_model_side_imports_without_torch() -> None:
    modules = torch_free_modules()
    assert {"llmd.api.app", "llmd.engine.client", "llmd.engine.scheduler", "llmd.config", "llmd.checkup",
            "llmd.engine.worker",
            "llmd.engine.model.prefix_index"} <= set(modules)
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "    if 'torch' in sys.modules:\n"
            "        raise SystemExit(f'{name} imported torch')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr or result.stdout


def source_file(module: str) -> str:
    """Where a module's source is, found without importing the module itself."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return spec.origin


def llmd_imports() -> dict[str, set[str]]:
    """Each llmd module and the llmd modules it imports anywhere in its text (lazy ones too)."""
    files = {name: source_file(name) for name in [*torch_free_modules(), *MODEL_SIDE]}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmd"):
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("llmd")}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    found: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(graph[name])
    return found


def test_no_llmd_module_imports_itself_back_through_others() -> None:
    graph = llmd_imports()
    cycles = sorted(name for name in graph if name in reachable(graph, name))
    assert not cycles, f"import cycles through: {cycles}"


def test_the_model_side_list_names_every_module_that_imports_torch_or_transformers() -> None:
    names = {m.name for m in pkgutil.walk_packages(llmd.__path__, "llmd.")}
    assert names >= MODEL_SIDE, MODEL_SIDE - names


def test_the_worker_reaches_torch_only_through_the_runner() -> None:
    """GPU memory and out-of-memory detection are the runner's: the worker's own text has no torch."""
    tree = ast.parse(Path(source_file("llmd.engine.worker")).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] == "torch"}
