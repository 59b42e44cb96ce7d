"""What the `llmd install-service` tests share: the shipped unit, a real executable, the command line."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from llmd.service import install

TEMPLATE = (install.SHIPPED_DIR / "llmd.service").read_text(encoding="utf-8")
TRUE = Path(shutil.which("true") or "/bin/true")  # a real executable, for systemd-analyze


def install_args(*argv: str) -> argparse.Namespace:
    """`llmd install-service ARGV` as its parser reads it."""
    parser = argparse.ArgumentParser()
    install.add_arguments(parser)
    return parser.parse_args(argv)
