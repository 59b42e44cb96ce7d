"""The decode batch of `kv_cache: dynamic`: the running requests' own caches stacked, left-padded."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from llmd.engine.model.request_cache import Layers, cache_layers, sync_lengths


class DynamicDecodeBatch:
    """The running requests' KV caches stacked along the batch dimension, left-padded.

    Every row ends at the same column, so one forward pass appends one token to all of
    them; `mask` marks real tokens (1) and left padding (0). A request joins after its own
    prefill and leaves by dropping its row; columns that are padding in every row go too.
    """

    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.request_ids: list[str] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        """Rows the next step computes: one per running request."""
        return len(self.request_ids)

    @property
    def warm_up_rows(self) -> int:
        """Nothing to warm up: the step is transformers' forward, never compiled."""
        return 0

    def warm_up(self) -> float:
        """Nothing to compile: 0 seconds."""
        return 0.0

    def join(self, request_id: str, cache: DynamicCache) -> None:
        """Add a prefilled request's cache as the last row."""
        length = cache.get_seq_length()
        mask = torch.ones((1, length), dtype=torch.long, device=cache_layers(cache)[0].keys.device)
        if self.cache is None or self.mask is None:
            self.cache, self.mask = cache, mask
        else:
            width = max(length, self.mask.shape[1])
            for mine, theirs in zip(cache_layers(self.cache), cache_layers(cache), strict=True):
                mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
                mine.values = torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)])
            self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
            sync_lengths(self.cache)
        self.request_ids.append(request_id)

    def leave(self, request_id: str, *, scrub: bool = False) -> None:
        """Drop a request's row and any column left as padding in every row (`scrub`: nothing
        of the row stays behind anyway)."""
        row = self.request_ids.index(request_id)
        del self.request_ids[row]
        if not self.request_ids:
            self.cache = self.mask = None
            return
        assert self.cache is not None and self.mask is not None
        keep = [i for i in range(self.mask.shape[0]) if i != row]
        self.mask = self.mask[keep]
        first = int(self.mask.any(dim=0).nonzero()[0])
        self.mask = self.mask[:, first:]
        for layer in cache_layers(self.cache):
            layer.keys = layer.keys[keep, :, first:]
            layer.values = layer.values[keep, :, first:]
        sync_lengths(self.cache)

    def row_views(self, request_id: str) -> Layers | None:
        """One row's keys and values without its padding: views into the batch, valid until a step."""
        if request_id not in self.request_ids or self.cache is None or self.mask is None:
            return None
        row = self.request_ids.index(request_id)
        start = int(self.mask[row].nonzero()[0])
        return [
            (layer.keys[row : row + 1, :, start:], layer.values[row : row + 1, :, start:])
            for layer in cache_layers(self.cache)
        ]

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One forward pass over the growing, left-padded batch; the next-token logits per row."""
        ids = torch.tensor([[token] for token in tokens], dtype=torch.long, device=self.device)
        where = torch.tensor([[position] for position in positions], dtype=torch.long, device=self.device)
        mask = self._step_mask()
        out = self.model(input_ids=ids, position_ids=where, attention_mask=mask,
                         cache=self.cache, use_cache=True)
        return out.logits[:, -1]  # type: ignore[no-any-return]

    def _step_mask(self) -> torch.Tensor | None:
        """The attention mask for the next token: None while no row is padded."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        return self.mask if len(self.request_ids) > 1 and not bool(self.mask.all()) else None


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad dimension 2 (cache) or 1 (mask) on the left up to `width`."""
    dim = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
