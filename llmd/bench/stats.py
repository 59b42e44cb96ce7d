"""The bench's arithmetic: percentiles, gaps between chunks, rates and their rounding."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linearly interpolated between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def gaps(times: Sequence[float]) -> list[float]:
    """Differences between successive timestamps."""
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def chunks_per_token(chunks: int, tokens: int) -> float | None:
    """Content-bearing chunks per completion token (1.0 = one chunk per token)."""
    return chunks / tokens if tokens > 0 else None


def tokens_per_s(tokens: int, seconds: float) -> float | None:
    """Throughput, or None when no time elapsed."""
    return tokens / seconds if seconds > 0 else None


def decode_tokens_per_s(chunk_times: Sequence[float], tokens: int) -> float | None:
    """One stream's decode rate: tokens after the first over the first-to-last chunk span."""
    if tokens < 2 or len(chunk_times) < 2:
        return None
    return tokens_per_s(tokens - 1, chunk_times[-1] - chunk_times[0])


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds, rounded to the microsecond."""
    return None if seconds is None else round(seconds * 1000, 3)


def rounded(value: float | None, digits: int = 3) -> float | None:
    """`value` rounded to `digits`, None kept."""
    return None if value is None else round(value, digits)
