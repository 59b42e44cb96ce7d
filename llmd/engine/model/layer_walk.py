"""The steps of Llama-family models, run without transformers' module machinery.

At one new token per row, transformers' forward spends about as long in Python as the
CPU spends multiplying: module calls, keyword plumbing, the mask built anew each step,
the cache's bookkeeping. On the small demo model (bfloat16, 2 cores) a one-row step took
6.5 ms, of which the Linear layers were 3.1 ms. `DirectDecoder` walks the same layers
doing the same tensor operations in the same order, with the model's own weights, norms,
rotary embedding and activation: 4.9 ms for that step, with logits equal to the bit.
Attention is the caller's (`Attend`): the static batch's decode window, or the fused
step's per-request layout (7 decoding rows beside a 32-token chunk: 12.4 vs 14.0 ms).

Siblings packed as one weight (onednn.PackedGroup: q/k/v, gate/up) are called once and their
output split, and the rotary embedding is four tensor operations for queries and keys together
(`rotated`) instead of seven for each: 3.3 instead of 3.7 ms for that one-row step, the
logits still equal to the bit.

Only the decoder layers this file is written for are taken (`unsupported_reason`), and
the runner checks the step against transformers' forward when the model loads; anything
else keeps transformers' forward. A prefill on its own stays with transformers."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from llmd.engine.model.int8 import Int8Linear, int8_matmul
from llmd.engine.model.onednn import PackedGroup, PackedLinear, PackedPart, packed_linear
from llmd.preflight.shape import attention_heads

Op = Callable[[torch.Tensor], torch.Tensor]
# Decoder layers that are exactly: norm → q/k/v (optionally a per-head q/k norm) → rotary →
# attention → o, residual, norm → down(act(gate) * up), residual; embeddings unscaled,
# logits straight from lm_head.
LAYOUTS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# What each decoder layer must have (dotted attribute paths).
LAYER_PARTS = (
    "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
    "self_attn.v_proj", "self_attn.o_proj", "self_attn.head_dim", "self_attn.scaling",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.act_fn",
)


# One layer's attention, done by whoever owns the cache: (layer index, queries [rows, heads,
# tokens, dim] and keys, values [rows, kv_heads, tokens, dim], rotary applied, and the scaling)
# → [rows, tokens, heads * dim]. It stores the keys and values where they belong.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Layer:
    attention_norm: Op
    qkv: Op | None  # q, k and v side by side, when packed as one weight
    q: Op
    k: Op
    v: Op
    o: Op
    q_norm: Op | None
    k_norm: Op | None
    mlp_norm: Op
    gate_up: Op | None  # gate and up side by side, when packed as one weight
    gate: Op
    up: Op
    down: Op
    act: Op
    scaling: float


class DirectDecoder:
    """A supported model's layers, called directly; attention comes from the caller."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(reason)
        inner = model.model
        config = model.config.get_text_config(decoder=True)
        self.heads, self.kv_heads, _ = attention_heads(config)
        # The width the attention module itself was built with: the views must match it.
        self.head_dim = int(inner.layers[0].self_attn.head_dim)
        self._embed: Op = inner.embed_tokens.forward
        self._rotary: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
        self._rotary = inner.rotary_emb.forward
        # [-1 .. -1, 1 .. 1] over a head, in the hidden states' dtype (the embedding's), made once
        embedding = inner.embed_tokens.weight
        self._sign = torch.ones(self.head_dim, dtype=embedding.dtype, device=embedding.device)
        self._sign[: self.head_dim // 2] = -1
        self._layers = [_layer(layer) for layer in inner.layers[: config.num_hidden_layers]]
        self._norm: Op = inner.norm.forward
        self._head = linear_op(model.lm_head)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend: Attend,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [rows, kept tokens, vocab] for input_ids [rows, tokens] (`keep`: token indices)."""
        hidden = self._embed(input_ids)
        cos, sin = self._rotary(hidden, position_ids)
        cos, signed_sin = cos.unsqueeze(2), (sin * self._sign).unsqueeze(2)  # for `rotated`
        for index, layer in enumerate(self._layers):
            x = layer.attention_norm(hidden)
            q, k, v = self._attention_inputs(layer, x, cos, signed_sin)
            hidden = hidden + layer.o(attend(index, q, k, v, layer.scaling))
            x = layer.mlp_norm(hidden)
            if layer.gate_up is None:
                gated = layer.act(layer.gate(x)) * layer.up(x)
            else:
                gate, up = layer.gate_up(x).chunk(2, dim=-1)
                gated = layer.act(gate) * up
            hidden = hidden + layer.down(gated)
        hidden = self._norm(hidden)
        return self._head(hidden if keep is None else hidden[:, keep])

    def _attention_inputs(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [rows, heads, tokens, dim] of normed x, rotary applied."""
        rows, tokens = x.shape[:2]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        if layer.qkv is None:
            q = layer.q(x).view(rows, tokens, heads, dim)
            k = layer.k(x).view(rows, tokens, kv_heads, dim)
            v = layer.v(x)
        else:
            qk, v = layer.qkv(x).split(((heads + kv_heads) * dim, kv_heads * dim), dim=-1)
            qk = qk.view(rows, tokens, heads + kv_heads, dim)
            q, k = qk[:, :, :heads], qk[:, :, heads:]
        if layer.qkv is not None and layer.q_norm is None and layer.k_norm is None:
            qk = rotated(qk, cos, signed_sin)  # still side by side in the projection's output: as one
            q, k = qk[:, :, :heads], qk[:, :, heads:]
        else:
            q = q if layer.q_norm is None else layer.q_norm(q)
            k = k if layer.k_norm is None else layer.k_norm(k)
            q, k = rotated(q, cos, signed_sin), rotated(k, cos, signed_sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.view(rows, tokens, kv_heads, dim).transpose(1, 2)


def rotated(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of x [rows, tokens, heads, dim] as transformers' apply_rotary_pos_emb
    computes it, x cos + rotate_half(x) sin with rotate_half(x) = [-x2, x1]: x's halves swapped
    times [-sin, sin] are the same products to the bit, in four operations instead of seven."""
    *outer, dim = x.shape
    swapped = x.view(*outer, 2, dim // 2).flip(-2).view(x.shape)
    return x * cos + swapped * signed_sin


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


def import_inductor() -> None:
    """Import the compiler now, quietly: in torch 2.13 its imports trip torch.jit's own deprecation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._inductor.compile_fx  # noqa: F401


def linear_op(module: torch.nn.Module) -> Op:
    """The layer's own computation, called without nn.Module's per-call machinery.

    A packed weight is handed over as a Parameter, as transformers' own weights are: compiled
    with freezing (lone_step), that makes it one of the graph's constants (oneDNN's linear needs
    its weight constant there), the same tensor, not a copy. So are an int8 layer's weight and
    scales: inductor's GEMM template (`lone_step: max-autotune`) takes only constant weights."""
    if isinstance(module, PackedLinear | PackedGroup):
        packed, bias = torch.nn.Parameter(module.packed_weight, requires_grad=False), module.bias
        return lambda x: packed_linear(x, packed, bias)
    if isinstance(module, Int8Linear):
        constant = functools.partial(torch.nn.Parameter, requires_grad=False)
        qweight, scales, offset = constant(module.qweight), constant(module.scales), module.bias
        return lambda x: int8_matmul(x, qweight, scales, offset)
    if type(module) is torch.nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    return module  # anything else (bitsandbytes' 4-bit layers) through its own __call__


def _layer(layer: Any) -> _Layer:
    attention, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    qkv = group_of(attention.q_proj, attention.k_proj, attention.v_proj)
    gate_up = group_of(mlp.gate_proj, mlp.up_proj)
    if gate_up is not None and len(set(gate_up.widths)) != 1:
        gate_up = None  # the walk halves the group's output
    return _Layer(
        attention_norm=layer.input_layernorm.forward,
        qkv=None if qkv is None else linear_op(qkv),
        q=linear_op(attention.q_proj), k=linear_op(attention.k_proj),
        v=linear_op(attention.v_proj), o=linear_op(attention.o_proj),
        q_norm=None if q_norm is None else q_norm.forward,
        k_norm=None if k_norm is None else k_norm.forward,
        mlp_norm=layer.post_attention_layernorm.forward,
        gate_up=None if gate_up is None else linear_op(gate_up),
        gate=linear_op(mlp.gate_proj), up=linear_op(mlp.up_proj), down=linear_op(mlp.down_proj),
        act=getattr(mlp.act_fn, "forward", mlp.act_fn), scaling=float(attention.scaling),
    )


def group_of(*modules: torch.nn.Module) -> PackedGroup | None:
    """The PackedGroup that `modules` are the parts of, whole and in order; else None."""
    first = modules[0]
    if not isinstance(first, PackedPart):
        return None
    group = first.group
    parts = [(module.group, module.index) for module in modules if isinstance(module, PackedPart)]
    return group if parts == [(group, index) for index in range(len(group.widths))] else None


def _get(module: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        module = getattr(module, name, None)
    return module
