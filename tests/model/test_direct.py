"""The direct decode step: each layout it takes decodes as transformers does; others keep transformers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from llmd.engine.model import layer_walk
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch
from llmd.engine.types import Request
from tests.helpers.configs import eager_profile
from tests.helpers.engine import greedy, staggered_batch

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=211, max_position_embeddings=256)
# What sets each layout apart: attention biases (qwen2), per-head q/k norms (qwen3), an
# explicit head_dim that is not hidden/heads (qwen3), plain llama with biases and no GQA.
LAYOUTS: dict[str, dict[str, Any]] = {
    "llama": dict(attention_bias=True, mlp_bias=True, num_key_value_heads=4),
    "mistral": dict(sliding_window=None),
    "qwen2": dict(use_sliding_window=False),
    "qwen3": dict(head_dim=24, use_sliding_window=False),
}
PROMPTS = [[(7 * k + 3 * i) % 200 + 5 for i in range(6 + 5 * k)] for k in range(4)]


def saved_model(root: Path, kind: str, **changes: Any) -> Path:
    config = AutoConfig.for_model(kind, **(SMALL | changes))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    path = root / kind
    model.save_pretrained(path)
    return path


def generate_alone(path: Path, prompt: list[int], count: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=count,
                             min_new_tokens=count, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_each_layout_decodes_staggered_requests_as_generate_does_alone(tmp_path: Path, kind: str) -> None:
    path = saved_model(tmp_path, kind, **LAYOUTS[kind])
    runner = ModelRunner(path, eager_profile())
    assert runner.fast_paths.direct_problem is None
    assert isinstance(runner.batch, StaticDecodeBatch) and runner.batch.direct is not None
    layer = runner.batch.model.model.layers[0]  # the walk calls q/k/v and gate/up as one weight each
    assert layer_walk.group_of(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
    assert layer_walk.group_of(layer.mlp.gate_proj, layer.mlp.up_proj)
    requests = [Request(f"r{k}", prompt, greedy(100)) for k, prompt in enumerate(PROMPTS)]
    # joins of longer and shorter prompts (padded rows), and a leave in the middle
    tokens = staggered_batch(runner, requests, steps=14, leave={6: "r1"})
    for k, prompt in enumerate(PROMPTS):
        produced = tokens[f"r{k}"]
        assert produced == generate_alone(path, prompt, len(produced)), (kind, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_embedding_is_transformers_own_to_the_bit(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    # [rows, tokens, heads, dim]
    q, k = torch.randn(2, 5, 6, 16, dtype=dtype), torch.randn(2, 5, 3, 16, dtype=dtype)
    angles = torch.randn(2, 5, 8)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    expected_q, expected_k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    sign = torch.tensor([-1.0] * 8 + [1.0] * 8, dtype=dtype)
    signed_sin = (sin * sign).unsqueeze(2)
    assert torch.equal(layer_walk.rotated(q, cos.unsqueeze(2), signed_sin).transpose(1, 2), expected_q)
    assert torch.equal(layer_walk.rotated(k, cos.unsqueeze(2), signed_sin).transpose(1, 2), expected_k)


def test_a_layout_it_was_not_written_for_keeps_transformers_forward(tmp_path: Path) -> None:
    path = saved_model(tmp_path, "gemma", head_dim=16)  # scaled embeddings, (1 + w) norms
    model = AutoModelForCausalLM.from_pretrained(path)
    assert "model type 'gemma'" in (layer_walk.unsupported_reason(model) or "")
    with pytest.raises(ValueError, match="gemma"):
        layer_walk.DirectDecoder(model)
    runner = ModelRunner(path, eager_profile())
    assert runner.fast_paths.direct_problem is not None and "gemma" in runner.fast_paths.direct_problem
    request = Request("r", PROMPTS[1], greedy(8))
    ours = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(7)]
    assert ours == generate_alone(path, PROMPTS[1], 8)


def test_a_direct_step_that_disagrees_with_transformers_is_not_used(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x  # a plausible bug

    monkeypatch.setattr(layer_walk, "rotated", no_rotary)
    with caplog.at_level(logging.WARNING, "llmd.engine"):
        runner = ModelRunner(tiny_model, eager_profile())
    problem = runner.fast_paths.direct_problem
    assert problem is not None and "logits differ" in problem
    assert "the direct step failed its probe" in caplog.text
    assert isinstance(runner.batch, StaticDecodeBatch) and runner.batch.direct is None
    assert runner.active_sequences == 0  # the probe's requests are gone
    request = Request("r", PROMPTS[2], greedy(6))
    ours = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(5)]
    assert ours == generate_alone(tiny_model, PROMPTS[2], 6)


def test_a_lone_request_runs_without_a_mask_and_a_padded_batch_with_one(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    masks: list[bool] = []
    real_forward = layer_walk.DirectDecoder.forward

    def recording_forward(self: layer_walk.DirectDecoder, *args: Any) -> torch.Tensor:
        masks.append(args[2].__self__.mask is not None)  # the step's attention: a bound Window.attend
        return real_forward(self, *args)

    runner = ModelRunner(tiny_model, eager_profile())
    monkeypatch.setattr(layer_walk.DirectDecoder, "forward", recording_forward)
    first, second = (Request(f"r{k}", PROMPTS[3 - 2 * k], greedy(10)) for k in range(2))
    runner.first_token(first)
    runner.decode([first])
    runner.first_token(second)  # shorter: its row is padded
    runner.decode([first, second])
    runner.release(second.request_id)
    runner.decode([first])  # the window ends at the last slot in use: slot 0 alone again
    assert masks == [False, True, False]
