"""The one place that writes byte sizes and counts for people: plans, checkups, logs, scripts."""

from __future__ import annotations

KiB, MiB, GiB = 2**10, 2**20, 2**30


def bytes_text(count: int) -> str:
    """Bytes in GiB, MiB or KiB, whichever reads best."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(count) >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"


def short_bytes_text(count: int) -> str:
    """Bytes in the largest unit, without trailing zeros: 128 KiB, 1.5 GiB."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(count) >= scale:
            return f"{count / scale:.4g} {unit}"
    return f"{count} B"


def count_text(params: int) -> str:
    """A parameter count the way model cards write it: 8.03 B, 25.2 M."""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if params >= scale:
            return f"{params / scale:.2f} {unit}"
    return str(params)


def mib(count: int, digits: int = 1) -> str:
    """Bytes in MiB with a fixed number of decimals, for columns and log lines: 25.3 MiB."""
    return f"{count / MiB:.{digits}f} MiB"
