"""Recent prompts' KV caches, so a request sharing a prefix skips recomputing it.

`PrefixIndex` decides which prompt matches and which one goes when the budget is spent; this
module keeps the tensors each stored prompt stands for and seeds a new request's cache.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from llmd.engine.model.prefix_index import PrefixIndex
from llmd.engine.model.request_cache import Layers, cache_layers, fill_cache


class PrefixCache:
    """Stored prompts' per-layer keys and values (batch of one), bounded by a total token count.

    The stored tensors are the ones the prompt's prefill produced; DynamicCache replaces (never
    edits) its tensors as it grows, so keeping references costs no copy.
    """

    def __init__(self, max_tokens: int, min_match: int) -> None:
        self.index: PrefixIndex[Layers] = PrefixIndex(max_tokens, min_match)

    @property
    def hits(self) -> int:
        """Requests that reused a stored prefix."""
        return self.index.hits

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens not recomputed thanks to a stored prefix."""
        return self.index.reused_tokens

    def store(self, token_ids: list[int], cache: DynamicCache) -> None:
        """Remember a completed prompt's cache, evicting the oldest beyond the budget."""
        self.store_layers(token_ids, [(layer.keys, layer.values) for layer in cache_layers(cache)])

    def store_layers(self, token_ids: list[int], layers: Layers) -> None:
        """Remember per-layer keys and values covering `token_ids`."""
        if self.index.fits(token_ids) and layers[0][0].shape[2] == len(token_ids):
            self.index.add(token_ids, layers)

    def store_prefilled(self, token_ids: list[int], cache: DynamicCache) -> bool:
        """Remember the tokens an unfinished prefill computed, unless a stored prompt already
        covers them or a value is not finite (no logits were sampled to vouch for them).

        Returns whether they were stored.
        """
        layers = [(layer.keys, layer.values) for layer in cache_layers(cache)]
        if not token_ids or self.index.longest(token_ids) >= len(token_ids) or not finite(layers):
            return False
        self.store_layers(token_ids, layers)
        return self.index.longest(token_ids) == len(token_ids)

    def reseed(self, prompt_ids: list[int], seeded: int, cache: DynamicCache) -> int:
        """Seed `cache` again for a request seeded with `seeded` tokens, if a longer prefix is
        stored now; the earlier seed's hit is taken back. Returns the tokens the cache holds
        (`seeded` when nothing longer is stored, `cache` left untouched)."""
        if min(self.index.longest(prompt_ids), len(prompt_ids) - 1) <= seeded:
            return seeded
        self.index.uncount(seeded)
        return self.seed(prompt_ids, cache)

    def seed(self, prompt_ids: list[int], cache: DynamicCache) -> int:
        """Fill `cache` with the longest stored prefix of `prompt_ids`; returns its length.

        At least the prompt's last token is always left to compute, for its logits.
        """
        match = self.index.match(prompt_ids)
        if match is None:
            return 0
        length = match.length
        fill_cache(cache, [(keys[:, :, :length], values[:, :, :length]) for keys, values in match.payload])
        return length


def finite(layers: Layers) -> bool:
    """Whether every key and value is a finite number."""
    return all(bool(torch.isfinite(keys).all() and torch.isfinite(values).all()) for keys, values in layers)
