"""A burst of whole prompts prefilled in one forward pass, left-padded, then split per request.

A burst of newcomers costs one pass instead of one each; every request still ends with its own
unpadded cache, as after a prefill of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from llmd.engine.model.request_cache import cache_layers, fill_cache, new_cache


@dataclass(frozen=True, slots=True)
class PaddedPrefill:
    """The padded pass's cache and logits; `row` takes one request's share out."""

    config: Any
    cache: DynamicCache
    logits: torch.Tensor  # [rows, 1, vocab]: each row's last token
    width: int

    def row(self, row: int, length: int) -> tuple[DynamicCache, torch.Tensor]:
        """Row `row`'s own cache of its `length` prompt tokens, and its last-token logits."""
        start = self.width - length
        own = new_cache(self.config)
        # copies: a view would keep the whole padded batch alive in the prefix cache
        rows = (slice(row, row + 1), slice(None), slice(start, None))
        fill_cache(own, [(layer.keys[rows].clone(), layer.values[rows].clone())
                         for layer in cache_layers(self.cache)])
        return own, self.logits[row, -1]


def prefill_padded(model: PreTrainedModel, device: torch.device, prompts: list[list[int]]) -> PaddedPrefill:
    """Run whole prompts through the model together, left-padded to the longest."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    positions = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        length = len(prompt)
        ids[row, width - length :] = torch.tensor(prompt)
        mask[row, width - length :] = 1
        positions[row, width - length :] = torch.arange(length)
    cache = new_cache(model.config)
    out = model(
        input_ids=ids.to(device), attention_mask=mask.to(device),
        position_ids=positions.to(device), cache=cache, use_cache=True, logits_to_keep=1,
    )
    return PaddedPrefill(model.config, cache, out.logits, width)
