"""Bench timing on the model side: transformers' `generate`, timestamped token by token.

`llmd bench --in-process` sets this beside llmd's own step loop, to measure both the same way.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel

from llmd.engine.model.loader import generation_eos_ids


class _TokenClock:
    """A `generate` streamer that only timestamps each step's new tokens (no text, no thread)."""

    def __init__(self, rows: int) -> None:
        self.times: list[float] = []
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        """Timestamp one step's new tokens (the first call hands in the prompt: skipped)."""
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        for row, token in zip(self.ids, value.reshape(-1).tolist(), strict=True):
            row.append(int(token))

    def end(self) -> None:
        """`generate` is done; nothing is buffered."""


@torch.inference_mode()
def measure_generate(
    model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int
) -> tuple[float, list[float], list[list[int]]]:
    """Greedy batched `model.generate`, left-padded: (start, step times, token ids per row)."""
    pad = min(generation_eos_ids(model), default=0)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    clock = _TokenClock(len(prompts))
    start = time.perf_counter()
    model.generate(  # type: ignore[operator]
        ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens, streamer=clock, pad_token_id=pad,
    )
    return start, clock.times, clock.ids
