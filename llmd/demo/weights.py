"""The demo model's tensors: embeddings and lm_head that make greedy decoding walk the cycle.

The attention and MLP weights are random and small next to the embeddings, so they move the
logits with the context (sampling varies) but never the argmax (greedy output is exact).
Written with numpy only: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmd.demo.sizes import DemoModelSize
from llmd.demo.tokenizer import SPECIAL_TOKENS

# The final hidden state is RMS-normalised, so only its direction reaches the logits. Every
# token embedding is a unit direction e_t, scaled to a norm the layers barely disturb:
#   e_t = BIAS_SHARE * axis0 + sqrt(1 - BIAS_SHARE**2) * f_t,   f_t a unit vector off axis 0.
# For cycle tokens but the last, f_t is random and off axis 1 as well; every other token (a
# "restart feeder") leans on axis 1 by RESTART_SHARE. The lm_head row of c_{i+1} is f_{c_i}, so
# c_i leads to c_{i+1}; the row of c_0 is axis 1, so every feeder leads to c_0; the rows of the
# special tokens point against axis 0, which every embedding shares, so they are never chosen,
# not even by sampling (EOS never ends a benchmark early). Rows no token leads to are random.

_BIAS_AXIS = 0
_RESTART_AXIS = 1
_BIAS_SHARE = 0.3
_RESTART_SHARE = 0.7
_EMBEDDING_RMS = 1.0
# Aimed-at ratio of all layers' residual updates to the embedding (attention averaging roughly
# halves it): enough to move the logits with the context, never enough to move the argmax.
_RESIDUAL_SHARE = 0.5
# Mean probability of the next cycle token at temperature 1: sampling must still wander.
_TARGET_TOP_PROBABILITY = 0.7
# Least lead of succ(t) over any other token, as a fraction of the logit scale, for every t.
_MIN_MARGIN = 0.2
_SPECIAL_IDS = list(range(len(SPECIAL_TOKENS)))


def _free_directions(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Random unit rows with nothing on the bias and restart axes."""
    directions = rng.standard_normal((rows, dim), dtype=np.float32)
    directions[:, [_BIAS_AXIS, _RESTART_AXIS]] = 0.0
    return directions / np.linalg.norm(directions, axis=1, keepdims=True)


def _free_parts(rng: np.random.Generator, dim: int, vocab_size: int, cycle: Sequence[int]) -> np.ndarray:
    """The f_t of every token: random for the cycle, leaning on the restart axis for feeders."""
    free = _free_directions(rng, vocab_size, dim)
    feeders = np.ones(vocab_size, dtype=bool)
    feeders[list(cycle[:-1])] = False
    free[feeders] *= np.float32(np.sqrt(1.0 - _RESTART_SHARE**2))
    free[feeders, _RESTART_AXIS] = _RESTART_SHARE
    return free


def _token_directions(free: np.ndarray) -> np.ndarray:
    """Unit embedding directions e_t: a fixed share on the bias axis plus the free part."""
    directions = free * np.float32(np.sqrt(1.0 - _BIAS_SHARE**2))
    directions[:, _BIAS_AXIS] = _BIAS_SHARE
    return directions


def _unit_lm_head(rng: np.random.Generator, free: np.ndarray, cycle: Sequence[int]) -> np.ndarray:
    """lm_head rows whose dot product with e_t is 1 for succ(t), -1 for specials, ~0 otherwise."""
    vocab_size, dim = free.shape
    unit = _free_directions(rng, vocab_size, dim)
    unit[list(cycle[1:])] = free[list(cycle[:-1])]
    unit[cycle[0]] = 0.0
    unit[cycle[0], _RESTART_AXIS] = 1.0 / _RESTART_SHARE
    unit /= np.float32(np.sqrt(1.0 - _BIAS_SHARE**2))
    unit[_SPECIAL_IDS] = 0.0
    unit[_SPECIAL_IDS, _BIAS_AXIS] = -1.0 / _BIAS_SHARE
    return unit


def _successors(vocab_size: int, cycle: Sequence[int]) -> np.ndarray:
    """The token greedy decoding must pick after each token: c_{i+1} after c_i, else c_0."""
    successors = np.full(vocab_size, cycle[0])
    successors[list(cycle[:-1])] = cycle[1:]
    return successors


def _check_margin(scores: np.ndarray, successors: np.ndarray) -> None:
    """Fail the build unless every token's successor leads all other tokens clearly."""
    rows = np.arange(len(successors))
    intended = scores[rows, successors]
    scores[rows, successors] = -np.inf
    if np.min(intended - scores.max(axis=1)) < _MIN_MARGIN:
        raise RuntimeError("this seed gives a demo model whose greedy walk may stray; try another")


def _mean_successor_probability(logits: np.ndarray, successors: np.ndarray) -> float:
    """Mean softmax probability of each row's successor."""
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    intended = weights[np.arange(len(successors)), successors]
    return float(np.mean(intended / weights.sum(axis=1)))


def _logit_scale(scores: np.ndarray, successors: np.ndarray) -> float:
    """The logit scale at which the next cycle token has the target mean probability."""
    low, high = 0.0, 64.0
    for _ in range(40):
        middle = (low + high) / 2
        if _mean_successor_probability(middle * scores, successors) < _TARGET_TOP_PROBABILITY:
            low = middle
        else:
            high = middle
    # Rounded, so that float noise in the matmul cannot change the bytes written.
    return round(high, 2)


def _token_weights(
    rng: np.random.Generator, dim: int, vocab_size: int, cycle: Sequence[int]
) -> dict[str, np.ndarray]:
    """Embedding and lm_head matrices that make greedy decoding walk `cycle`."""
    free = _free_parts(rng, dim, vocab_size, cycle)
    directions = _token_directions(free)
    unit_head = _unit_lm_head(rng, free, cycle)
    successors = _successors(vocab_size, cycle)
    scale = _logit_scale(directions[list(cycle)] @ unit_head.T, successors[list(cycle)])
    _check_margin(directions @ unit_head.T, successors)
    return {
        "model.embed_tokens.weight": directions * np.float32(_EMBEDDING_RMS * np.sqrt(dim)),
        # The final RMSNorm brings the hidden state to norm sqrt(dim); the lm_head undoes that.
        "lm_head.weight": unit_head * np.float32(scale / np.sqrt(dim)),
        "model.norm.weight": np.ones(dim, dtype=np.float32),
    }


def _gaussian(rng: np.random.Generator, shape: tuple[int, int], gain: float) -> np.ndarray:
    """A random projection whose output has `gain` times the RMS of its input."""
    weight = rng.standard_normal(shape, dtype=np.float32)
    weight *= np.float32(gain / np.sqrt(shape[1]))
    return weight


def _layer_gain(num_layers: int) -> float:
    """Gain of the value, output and MLP projections: a sublayer adds about gain**2 RMS."""
    # The updates of 2 * num_layers sublayers add up like a random walk.
    return float(np.sqrt(_RESIDUAL_SHARE * _EMBEDDING_RMS / np.sqrt(2 * num_layers)))


def _layer_weights(rng: np.random.Generator, size: DemoModelSize, layer: int) -> dict[str, np.ndarray]:
    """Random attention and MLP weights of one decoder layer, small next to the embeddings."""
    d, gain = size.hidden_size, _layer_gain(size.num_layers)
    q_width, kv_width = size.num_heads * size.head_dim, size.num_kv_heads * size.head_dim
    prefix = f"model.layers.{layer}"
    return {
        # Queries and keys at full gain, so attention really depends on the content.
        f"{prefix}.self_attn.q_proj.weight": _gaussian(rng, (q_width, d), 1.0),
        f"{prefix}.self_attn.k_proj.weight": _gaussian(rng, (kv_width, d), 1.0),
        f"{prefix}.self_attn.v_proj.weight": _gaussian(rng, (kv_width, d), gain),
        f"{prefix}.self_attn.o_proj.weight": _gaussian(rng, (d, q_width), gain),
        f"{prefix}.mlp.gate_proj.weight": _gaussian(rng, (size.intermediate_size, d), gain),
        f"{prefix}.mlp.up_proj.weight": _gaussian(rng, (size.intermediate_size, d), gain),
        f"{prefix}.mlp.down_proj.weight": _gaussian(rng, (d, size.intermediate_size), gain),
        f"{prefix}.input_layernorm.weight": np.ones(d, dtype=np.float32),
        f"{prefix}.post_attention_layernorm.weight": np.ones(d, dtype=np.float32),
    }


def demo_weights(
    size: DemoModelSize, vocab_size: int, cycle: Sequence[int], seed: int
) -> dict[str, np.ndarray]:
    """All tensors of the demo model, by their LlamaForCausalLM names."""
    rng = np.random.default_rng(seed)
    tensors = _token_weights(rng, size.hidden_size, vocab_size, cycle)
    for layer in range(size.num_layers):
        tensors.update(_layer_weights(rng, size, layer))
    return tensors
