"""Bounds on what one prompt may cost the host: which prompts are large, how many encode at once,
and handing the memory of a large encode back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Any

# A chat with more characters than this encodes in one of `LARGE_PROMPT_SLOTS` slots. Encoding
# costs ~100 bytes per token on top of the text, so 64 Ki characters stay well under 10 MiB.
LARGE_PROMPT_CHARS = 64 * 1024
LARGE_PROMPT_SLOTS = 2


def text_length(value: Any) -> int:
    """Characters in all the strings of a message structure (dict values, list items)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_length(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(text_length(item) for item in value)
    return 0


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)  # glibc only; musl and macOS have none


def release_free_memory() -> None:
    """Return the C heap's free pages to the system (glibc's `malloc_trim(0)`; elsewhere nothing).

    glibc keeps the arenas a large encode freed: without this a burst of big prompts leaves
    gigabytes resident for good.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
