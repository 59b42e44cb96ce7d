"""The decode step of Llama-family models, run without transformers' module machinery.

At one new token per row, transformers' forward spends about as long in Python as the
CPU spends multiplying: module calls, keyword plumbing, the mask built anew each step,
the cache's bookkeeping. On the small demo model (bfloat16, 2 cores) a one-row step took
6.5 ms, of which the Linear layers were 3.1 ms. `DirectDecoder` walks the same layers
doing the same tensor operations in the same order, with the model's own weights, norms,
rotary embedding and activation, and reads and writes keys and values straight in the
static batch's tensors: 4.9 ms for that step, with logits equal to the bit.

Only the decoder layers this file is written for are taken (`unsupported_reason`), and
the runner checks the step against transformers' forward when the model loads; anything
else keeps transformers' forward. Prefill and the fused step stay with transformers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from llmd.engine.onednn import PackedLinear

Op = Callable[[torch.Tensor], torch.Tensor]
# Decoder layers that are exactly: norm → q/k/v (optionally a per-head q/k norm) → rotary →
# attention → o, residual, norm → down(act(gate) * up), residual; embeddings unscaled,
# logits straight from lm_head.
LAYOUTS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class KeyValues(Protocol):
    """One layer's cache in the static batch: [slots, kv_heads, capacity, head_dim] each."""

    @property
    def keys(self) -> torch.Tensor: ...

    @property
    def values(self) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """Where a step reads and writes: rows [0, rows), columns [start, column], written at column."""

    rows: int
    start: int
    column: int
    mask: torch.Tensor | None  # [rows, window] columns each row attends to; None: all of them


@dataclass(frozen=True, slots=True)
class _Layer:
    attention_norm: Op
    q: Op
    k: Op
    v: Op
    o: Op
    q_norm: Op | None
    k_norm: Op | None
    mlp_norm: Op
    gate: Op
    up: Op
    down: Op
    act: Op
    scaling: float


class DirectDecoder:
    """One token per row through a supported model, over a window of the static batch."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(reason)
        inner = model.model
        config = model.config.get_text_config(decoder=True)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(inner.layers[0].self_attn.head_dim)
        self._embed: Op = inner.embed_tokens.forward
        self._rotary: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
        self._rotary = inner.rotary_emb.forward
        self._rope = sys.modules[type(inner.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self._layers = [_layer(layer) for layer in inner.layers[: config.num_hidden_layers]]
        self._norm: Op = inner.norm.forward
        self._head = linear_op(model.lm_head)

    def step(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Sequence[KeyValues],
        window: DecodeWindow,
    ) -> torch.Tensor:
        """Logits [rows, 1, vocab] for input_ids [rows, 1]; writes each layer's key and value."""
        rows, column = window.rows, window.column
        mask = None if window.mask is None else window.mask[:, None, None, :]
        hidden = self._embed(input_ids)
        cos, sin = self._rotary(hidden, position_ids)
        groups = self.heads // self.kv_heads
        for layer, kv in zip(self._layers, cache, strict=True):
            x = layer.attention_norm(hidden)
            q = self._heads(layer.q(x), self.heads, layer.q_norm)
            k = self._heads(layer.k(x), self.kv_heads, layer.k_norm)
            v = layer.v(x).view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            kv.keys[:rows, :, column] = k[:, :, 0]
            kv.values[:rows, :, column] = v[:, :, 0]
            keys = kv.keys[:rows, :, window.start : column + 1]
            values = kv.values[:rows, :, window.start : column + 1]
            # each key/value head's query heads as its queries, as `decode_attention` does
            packed = q.reshape(rows, self.kv_heads, groups, self.head_dim)
            out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=layer.scaling)
            out = out.reshape(rows, self.heads, 1, self.head_dim).transpose(1, 2).reshape(rows, 1, -1)
            hidden = hidden + layer.o(out)
            x = layer.mlp_norm(hidden)
            hidden = hidden + layer.down(layer.act(layer.gate(x)) * layer.up(x))
        return self._head(self._norm(hidden))

    def _heads(self, projected: torch.Tensor, heads: int, norm: Op | None) -> torch.Tensor:
        """[rows, 1, heads * dim] → [rows, heads, 1, dim], through the per-head norm if any."""
        split = projected.view(projected.shape[0], 1, heads, self.head_dim)
        return (split if norm is None else norm(split)).transpose(1, 2)


def unsupported_reason(model: Any) -> str | None:
    """Why `DirectDecoder` cannot run this model, or None when it can."""
    config = model.config.get_text_config(decoder=True)
    kind = getattr(config, "model_type", None)
    if kind not in LAYOUTS:
        return f"model type {kind!r} is not one of {', '.join(sorted(LAYOUTS))}"
    inner = getattr(model, "model", None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, part) for part in parts) or not hasattr(model, "lm_head"):
        return "the model is not laid out as model.{embed_tokens, layers, norm, rotary_emb} + lm_head"
    if any(hasattr(module, "_hf_hook") for module in model.modules()):
        return "accelerate hooks move tensors between devices"
    attention = type(inner.layers[0].self_attn)
    if not hasattr(sys.modules[attention.__module__], "apply_rotary_pos_emb"):
        return f"{attention.__name__}'s module has no apply_rotary_pos_emb"
    for index, layer in enumerate(inner.layers):
        missing = [name for name in LAYER_PARTS if _get(layer, name) is None]
        if missing:
            return f"layer {index} has no {', '.join(missing)}"
    return None


LAYER_PARTS = (
    "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
    "self_attn.v_proj", "self_attn.o_proj", "self_attn.head_dim", "self_attn.scaling",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.act_fn",
)


def linear_op(module: torch.nn.Module) -> Op:
    """The layer's own computation, called without nn.Module's per-call machinery."""
    if isinstance(module, PackedLinear):
        weight, bias, pointwise = module.packed_weight, module.bias, torch.ops.mkldnn._linear_pointwise
        return lambda x: pointwise(x.contiguous(), weight, bias, "none", [], "")
    if type(module) is torch.nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    return module  # anything else (bitsandbytes' 4-bit layers) through its own __call__


def _layer(layer: Any) -> _Layer:
    attention, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    return _Layer(
        attention_norm=layer.input_layernorm.forward,
        q=linear_op(attention.q_proj), k=linear_op(attention.k_proj),
        v=linear_op(attention.v_proj), o=linear_op(attention.o_proj),
        q_norm=None if q_norm is None else q_norm.forward,
        k_norm=None if k_norm is None else k_norm.forward,
        mlp_norm=layer.post_attention_layernorm.forward,
        gate=linear_op(mlp.gate_proj), up=linear_op(mlp.up_proj), down=linear_op(mlp.down_proj),
        act=getattr(mlp.act_fn, "forward", mlp.act_fn), scaling=float(attention.scaling),
    )


def _get(module: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        module = getattr(module, name, None)
    return module
