"""A request's own KV cache: transformers' `DynamicCache`, made and edited the way llmd needs.

A request prefills into one of these; the dynamic batch stacks them, the static batch copies
them in, and the prefix cache stores and re-seeds their tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values


def cache_layers(cache: DynamicCache) -> list[Any]:
    """The cache's per-layer key/value holders (plain DynamicLayers for full attention)."""
    return list(cache.layers)


def fill_cache(cache: DynamicCache, layers: Layers) -> None:
    """Make an empty cache hold these per-layer keys and values (the tensors themselves)."""
    for layer, (keys, values) in zip(cache_layers(cache), layers, strict=True):
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    sync_lengths(cache)


def new_cache(config: Any) -> DynamicCache:
    """An empty per-request cache whose sliding-window layers keep every token.

    transformers' sliding-window layers drop keys older than the window as they go. The
    decode batch pads, stacks and trims caches by columns, and the prefix cache stores whole
    prompts, so every layer must hold the same columns: these layers record the whole past
    and still give attention only the window (and the mask sizes say so).
    """
    cache = DynamicCache(config=config)
    for layer in cache_layers(cache):
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


def sync_lengths(cache: DynamicCache) -> None:
    """Tell sliding-window layers how many columns they hold after we edited their tensors."""
    for layer in cache_layers(cache):
        if hasattr(layer, "cumulative_length") and getattr(layer, "is_initialized", False):
            layer.cumulative_length = int(layer.keys.shape[-2])


def shared_cache(config: Any, cache: DynamicCache) -> DynamicCache:
    """A second cache over the same keys and values (no copy): a forked choice's, from its leader's.

    Safe to share: a DynamicCache replaces its tensors as it grows and the batches copy or
    concatenate them, so neither owner's writes reach the other.
    """
    twin = new_cache(config)
    fill_cache(twin, [(layer.keys, layer.values) for layer in cache_layers(cache)])
    return twin
