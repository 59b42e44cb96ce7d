"""Prefill beyond one request's plain chunk: a burst of whole prompts in one padded pass, and a
prompt whose every token's logprobs are asked for.

A burst of newcomers costs one pass instead of one each; every request still ends with its own
unpadded cache, as after a prefill of its own. A scored prefill keeps every position's logits,
so it runs in pieces that bound those logits' memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from llmd.engine.model.request_cache import cache_layers, fill_cache, new_cache
from llmd.engine.model.sampling import score_rows
from llmd.engine.types import RawScores

# Positions per pass of a scored prefill: their float32 logits (128 x a 152k vocabulary: 78 MB)
# are what it holds beyond a plain prefill.
SCORED_PIECE_TOKENS = 128


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


def prefill_chunk(model: PreTrainedModel, cache: DynamicCache, prompt: list[int], start: int, stop: int
                  ) -> torch.Tensor:
    """Run prompt tokens [start, stop) into `cache`; the last one's logits."""
    ids = torch.tensor([prompt[start:stop]], dtype=torch.long, device=model.device)
    positions = torch.arange(start, stop, device=model.device).unsqueeze(0)
    out = model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


def prefill_scored(model: PreTrainedModel, cache: DynamicCache, prompt: list[int], start: int, stop: int,
                   top: int) -> tuple[torch.Tensor, list[RawScores]]:
    """Run prompt tokens [start, stop) into `cache`, scoring each prompt token they predict.

    Returns the last position's logits and the scores of prompt tokens start+1 .. stop (those the
    prompt holds): the logits at position p describe the token at p + 1.
    """
    scores: list[RawScores] = []
    last = torch.empty(0)
    for begin in range(start, stop, SCORED_PIECE_TOKENS):
        end = min(stop, begin + SCORED_PIECE_TOKENS)
        ids = torch.tensor([prompt[begin:end]], dtype=torch.long, device=model.device)
        positions = torch.arange(begin, end, device=model.device).unsqueeze(0)
        logits = model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True).logits[0]
        targets = prompt[begin + 1 : end + 1]
        scores += score_rows(logits[: len(targets)], targets, top) if targets else []
        last = logits[-1]
    return last, scores
