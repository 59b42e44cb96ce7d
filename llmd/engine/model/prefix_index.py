"""Which stored prompt shares the longest prefix with a new one: token ids only, no tensors.

The index keeps prompts under a total token budget, least recently used first out, and counts
its hits. What each prompt stands for (its KV cache) is the caller's payload; `prefix_cache`
keeps the tensors beside it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

Payload = TypeVar("Payload")


@dataclass(frozen=True, slots=True)
class PrefixMatch(Generic[Payload]):
    """A stored prompt's payload and how many of its leading tokens the new prompt reuses."""

    payload: Payload
    length: int


class PrefixIndex(Generic[Payload]):
    """Stored prompts by their token ids, bounded by `max_tokens` in all, oldest out first."""

    def __init__(self, max_tokens: int, min_match: int) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[tuple[int, ...], Payload] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens stored, over every prompt."""
        return self._tokens

    def fits(self, token_ids: list[int]) -> bool:
        """Whether a prompt this long can be stored at all."""
        return len(token_ids) <= self.max_tokens

    def add(self, token_ids: list[int], payload: Payload) -> None:
        """Store a prompt (a known one only counts as used again), evicting beyond the budget."""
        key = tuple(token_ids)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = payload
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            evicted, _ = self._entries.popitem(last=False)
            self._tokens -= len(evicted)

    def match(self, prompt_ids: list[int]) -> PrefixMatch[Payload] | None:
        """The stored prompt sharing the longest prefix with `prompt_ids` (the oldest of equals),
        counted as a hit; None below `min_match`. The prompt's last token is never matched: it
        is left to compute, for its logits."""
        best, length = None, 0
        for key in self._entries:
            shared = shared_prefix_length(key, prompt_ids)
            if shared > length:
                best, length = key, shared
        length = min(length, len(prompt_ids) - 1)
        if best is None or length < self.min_match:
            return None
        self._entries.move_to_end(best)
        self.hits += 1
        self.reused_tokens += length
        return PrefixMatch(self._entries[best], length)

    def longest(self, prompt_ids: list[int]) -> int:
        """The longest prefix of `prompt_ids` some stored prompt shares; a look, not a hit."""
        return max((shared_prefix_length(key, prompt_ids) for key in self._entries), default=0)

    def uncount(self, length: int) -> None:
        """Take back one hit of `length` tokens (a request seeded again, with a longer match)."""
        if length:
            self.hits -= 1
            self.reused_tokens -= length

    def payloads(self) -> Iterator[Payload]:
        """Every stored payload, least recently used first."""
        return iter(self._entries.values())


def shared_prefix_length(first: tuple[int, ...] | list[int], second: list[int]) -> int:
    """How many leading token ids the two sequences have in common."""
    pairs = enumerate(zip(first, second, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(first), len(second)))
