"""Attention for the static batch's steps, and its registration with transformers.

`decode_attention` is transformers' SDPA for one new token per row with grouped-query heads
packed, even when compiled; `fused_attention` hands a fused step's attention to
`FusedLayout.attend`. Both reach transformers through its attention interface under names of
their own: `register_attention` puts them there, called by the loader when a model loads (not
as a side effect of importing this module). `Window` is the eager decode step's attention over
a window of the batch's columns, `FusedLayout` a fused step's: decode rows first, then each
prompt chunk causally over its own cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

DECODE_ATTENTION = "llmd_decode_sdpa"


@dataclass(frozen=True, slots=True)
class LayerTensors:
    """One StaticLayer's keys, values and write column (its `cumulative_length`, a 0-d tensor)."""

    keys: torch.Tensor
    values: torch.Tensor
    column: torch.Tensor

    @classmethod
    def of(cls, layer: Any) -> LayerTensors:
        """The tensors a transformers StaticLayer allocated."""
        return cls(layer.keys, layer.values, layer.cumulative_length)


def decode_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA for one new token per row, each key/value head's query heads packed as its queries.

    transformers' sdpa does the same, but only outside torch.compile: compiled, it repeats every
    key/value head for its query heads, which copies the whole static cache per layer per step
    (2.3x slower decode on the small demo model at 4096 tokens of capacity). Anything else goes
    to transformers' sdpa.
    """
    groups = int(getattr(module, "num_key_value_groups", 1))
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if query.shape[2] != 1 or groups == 1 or not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    return decode_rows(query, key, value, attention_mask, scaling).unsqueeze(1), None


@dataclass(frozen=True, slots=True)
class PrefillInput:
    """One request's prompt chunk for a fused step: its tokens, where they start, its own cache."""

    token_ids: list[int]
    start: int
    cache: DynamicCache


@dataclass(frozen=True, slots=True)
class Segment:
    """A prompt chunk's place in a fused step's packed sequence."""

    offset: int  # where the chunk's tokens sit in the packed sequence
    length: int
    cache: DynamicCache
    mask: torch.Tensor | None  # causal over the cached tokens and the chunk; None: plain causal

    @classmethod
    def of(cls, chunk: PrefillInput, offset: int, device: torch.device) -> Segment:
        """The chunk at `offset`, with its mask built once for every layer."""
        length, mask = len(chunk.token_ids), None
        if chunk.start:  # causal, shifted right by what the cache already holds
            mask = torch.ones((length, chunk.start + length), dtype=torch.bool, device=device)
            mask = mask.tril(chunk.start)
        return cls(offset, length, chunk.cache, mask)


@dataclass(frozen=True, slots=True)
class Window:
    """Attention of a decode step: one new token per row, over columns [start, column]."""

    layers: list[LayerTensors]  # the static batch's, written at `column`
    column: int
    rows: int
    start: int
    mask: torch.Tensor | None  # [rows, 1, 1, window] columns each row attends to; None: all

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None) -> torch.Tensor:
        """Write each row's key and value at the column; each row attends over the window.
        query is [rows, heads, 1, dim], key and value [rows, kv_heads, 1, dim]; the result is
        [rows, 1, heads * dim]."""
        rows, column, tensors = self.rows, self.column, self.layers[layer]
        tensors.keys[:rows, :, column] = key[:, :, 0]
        tensors.values[:rows, :, column] = value[:, :, 0]
        keys = tensors.keys[:rows, :, self.start : column + 1]
        values = tensors.values[:rows, :, self.start : column + 1]
        return decode_rows(query, keys, values, self.mask, scaling).reshape(rows, 1, -1)


def decode_rows(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 mask: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """One query token per row ([rows, heads, 1, dim]) over each row's keys, grouped-query heads
    packed as their key/value head's queries: [rows, heads, dim]."""
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    packed = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=scaling)
    return out.reshape(rows, heads, values.shape[-1])


@dataclass(frozen=True, slots=True)
class FusedLayout:
    """Which packed tokens are whose in a fused step: decode rows first, then prompt chunks."""

    layers: list[LayerTensors]  # the static batch's, written at `column`
    column: int
    rows: int  # decode slots [0, rows), one token each
    start: int  # the window's first column
    mask: torch.Tensor  # [rows, 1, 1, window] columns each decode row attends to
    segments: list[Segment]

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None) -> torch.Tensor:
        """Attention for one packed sequence of decode tokens and prompt chunks, per request.

        Decode row r writes its key and value into slot r of the static batch at the column
        and attends over the window; a chunk appends to its own cache and attends causally
        over it. query/key/value are [1, heads, tokens, dim]; the result is [1, tokens,
        heads * dim].
        """
        heads, kv_heads = query.shape[1], key.shape[1]
        rows, column, tensors = self.rows, self.column, self.layers[layer]
        tensors.keys[:rows, :, column] = key[0, :, :rows].transpose(0, 1)
        tensors.values[:rows, :, column] = value[0, :, :rows].transpose(0, 1)
        keys = tensors.keys[:rows, :, self.start : column + 1]
        values = tensors.values[:rows, :, self.start : column + 1]
        rows_query = query[0, :, :rows].transpose(0, 1).unsqueeze(2)  # [rows, heads, 1, dim]
        outputs = [decode_rows(rows_query, keys, values, self.mask, scaling)]
        for segment in self.segments:
            span = slice(segment.offset, segment.offset + segment.length)
            cached: Any = segment.cache.layers[layer]
            all_keys, all_values = cached.update(key[:, :, span], value[:, :, span])
            out = F.scaled_dot_product_attention(
                query[:, :, span], all_keys, all_values, attn_mask=segment.mask,
                is_causal=segment.mask is None, scale=scaling, enable_gqa=heads > kv_heads)
            outputs.append(out[0].transpose(0, 1))
        return torch.cat(outputs).flatten(1).unsqueeze(0)


FUSED_ATTENTION = "llmd_fused"
UNSUPPORTED_ATTENTION_KWARGS = ("sliding_window", "softcap", "s_aux", "position_bias")


def fused_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface onto `FusedLayout.attend`: [1, tokens, heads, dim]."""
    layout: FusedLayout = kwargs["llmd_fused"]
    odd = [name for name in UNSUPPORTED_ATTENTION_KWARGS if kwargs.get(name) is not None]
    if odd:
        raise NotImplementedError(f"the fused step does not do {', '.join(odd)}")
    out = layout.attend(int(module.layer_idx), query, key, value, scaling)  # type: ignore[arg-type]
    return out.view(*out.shape[:2], query.shape[1], -1), None


def register_attention() -> None:
    """Make llmd's attention known to transformers by name (idempotent; the loader calls it)."""
    AttentionInterface.register(FUSED_ATTENTION, fused_attention)
    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


@contextlib.contextmanager
def attention_implementation(config: Any, name: str | None) -> Iterator[None]:
    """Run the model with attention `name` inside the block (the decode step; prefill keeps its own)."""
    if name is None:
        yield
        return
    saved = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = saved
