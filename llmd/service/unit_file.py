"""A systemd unit's text and its file: ExecStart words, units derived from the shipped one, the write.

`llmd install-service` writes llmd's unit (`install.py`) and, on the other nodes of a multi-node
deployment, a worker's (`worker.py`); both are the shipped `systemd/llmd.service` as it is or
reduced by `derived_unit`, so the sandbox is written once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath

# Directories the system unit hides from the service (ProtectHome=yes, PrivateTmp=yes).
HIDDEN_FROM_SERVICE = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")


def exec_argument(path: PurePosixPath | Path | str) -> str:
    """One ExecStart= word: `%` escaped as `%%`, quoted when it holds spaces or quotes."""
    word = str(path).replace("%", "%%")
    if re.search(r'[\s"\'\\]', word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word


def exec_start(words: Sequence[PurePosixPath | Path | str]) -> str:
    """The ExecStart= line running `words` (the program, then its arguments)."""
    return "ExecStart=" + " ".join(exec_argument(word) for word in words)


def derived_unit(system_unit: str, header: str, keep: Callable[[str, str], bool],
                 added: Mapping[str, Sequence[str]]) -> str:
    """The system unit's `Key=value` lines that `keep(section, line)` keeps, without its comments, under
    `header`, each section opening with its `added` lines."""
    lines, section = [header.rstrip("\n")], ""
    for raw in system_unit.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            lines += ["", line, *added.get(section, ())]
        elif "=" in line and not line.startswith(("#", ";")) and keep(section, line):
            lines.append(line)
    return "\n".join(lines) + "\n"


def hidden_from_service(path: Path | PurePosixPath) -> str | None:
    """The directory of `HIDDEN_FROM_SERVICE` that hides `path` from the system service, if any."""
    text = str(path)
    return next((d for d in HIDDEN_FROM_SERVICE if text == d or text.startswith(d.rstrip("/") + "/")), None)


def under_root(root: Path, target: PurePosixPath) -> Path:
    """Where the target system's absolute `target` lies in a tree rooted at `root`."""
    return root / target.relative_to("/")


def write_unit(path: Path, text: str) -> str:
    """Write atomically (a reader never sees half a unit); say whether it was new, changed or the same."""
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old == text:
        return f"kept     {path} (unchanged)"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text, encoding="utf-8")
    partial.chmod(0o644)
    os.replace(partial, path)
    return f"{'wrote' if old is None else 'replaced':<8} {path}"
