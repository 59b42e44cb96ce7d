"""The wheel ships every llmd package and the files beside the code (profiles, systemd unit).

`scripts/wheel-check` (run by CI) builds the wheel and runs llmd from a fresh venv outside
the checkout; these tests keep pyproject's hand-kept package list honest in milliseconds.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from llmd.config import PROFILES_DIR, load_profile, shipped_profiles
from llmd.service.install import SHIPPED_DIR
from llmd.shipped import CHECKOUT

PYPROJECT = tomllib.loads((CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def test_every_llmd_package_is_listed_for_the_wheel() -> None:
    inits = (CHECKOUT / "llmd").rglob("__init__.py")
    found = {".".join(init.parent.relative_to(CHECKOUT).parts) for init in inits}
    listed = set(SETUPTOOLS["packages"])
    assert found <= listed, f"packages missing from pyproject's list: {sorted(found - listed)}"
    assert listed - found == {"llmd.profiles", "llmd.systemd"}


def test_the_shipped_folders_are_mapped_in_with_their_files() -> None:
    mapped = SETUPTOOLS["package-dir"]
    for package, folder in mapped.items():
        patterns = SETUPTOOLS["package-data"][package]
        assert any((CHECKOUT / folder).glob(pattern) for pattern in patterns), (package, folder)
    assert set(mapped.values()) == {PROFILES_DIR.name, SHIPPED_DIR.name}


def test_a_checkout_reads_its_own_top_level_folders() -> None:
    assert PROFILES_DIR == CHECKOUT / "profiles" and SHIPPED_DIR == CHECKOUT / "systemd"
    assert {"cpu", "cpu-bf16", "12gb-4bit", "24gb-bf16-compile", "multi-gpu-bf16", "vllm-cpu"} <= set(
        shipped_profiles())
    assert load_profile("cpu").name == "cpu" and Path(SHIPPED_DIR / "llmd.service").is_file()
