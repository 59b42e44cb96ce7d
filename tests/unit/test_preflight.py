"""The preflight memory plan: model shapes, byte arithmetic, verdicts and the fixes it suggests."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from msgspec.structs import replace
from safetensors.numpy import save_file

from llmd.config import Profile, load_profile
from llmd.errors import ConfigError
from llmd.preflight.hardware import HardwareFacts, MemoryBudget, choose_profile, gpu_memory_budget
from llmd.preflight.plan import (
    CONTEXT_STEP,
    CUDA_CONTEXT_BYTES,
    MIN_USEFUL_CONTEXT,
    memory_plan,
)
from llmd.preflight.render import render_plan
from llmd.preflight.shape import (
    ModelShape,
    attention_heads,
    context_limit,
    read_model_shape,
    read_safetensors_header,
    shape_from_config,
)
from llmd.units import GiB
from tests.helpers.configs import LLAMA_3_1_8B, QWEN2_5_7B

LLAMA = shape_from_config(LLAMA_3_1_8B)
BF16 = load_profile("24gb-bf16-compile")
NF4 = load_profile("12gb-4bit")


def weights(shape: ModelShape, profile: Profile) -> int:
    plan = memory_plan(shape, profile, gpu_memory_budget("1TiB"))
    return plan.weight_bytes


# --- shapes and byte arithmetic --------------------------------------------------------------


def test_published_parameter_counts_follow_from_the_configs() -> None:
    assert LLAMA.params == 8_030_261_248
    assert LLAMA.embedding_params == LLAMA.lm_head_params == 128256 * 4096
    assert shape_from_config(QWEN2_5_7B).params == 7_615_616_512  # q/k/v biases included


def test_llama_8b_weights_in_bf16_and_nf4_with_double_quant() -> None:
    assert weights(LLAMA, BF16) == pytest.approx(16.06e9, rel=0.01)
    assert weights(LLAMA, NF4) == pytest.approx(5.7e9, rel=0.03)
    single_quant = weights(LLAMA, replace(NF4, double_quant=False))
    saved_by_double_quant = LLAMA.linear_params * (4.5 - 4.127) / 8
    assert single_quant - weights(LLAMA, NF4) == pytest.approx(saved_by_double_quant, rel=0.01)


def test_kv_cache_bytes_per_token() -> None:
    assert LLAMA.kv_bytes_per_token("bfloat16") == 131072
    assert shape_from_config(QWEN2_5_7B).kv_bytes_per_token("bfloat16") == 57344
    assert LLAMA.kv_bytes_per_token("float32") == 2 * 131072


def test_kv_cache_lines_reserve_the_running_set_and_the_prefix_cache() -> None:
    plan = memory_plan(LLAMA, BF16, gpu_memory_budget("24GiB"))
    lines = {item.name: item.bytes for item in plan.items}
    assert lines["kv cache"] == 131072 * 8192 * 4 == 4 * GiB
    assert lines["prefix cache"] == 131072 * 8192 == GiB
    assert lines["decode logits"] == 4 * 128256 * 4 * 3
    assert lines["cuda context"] == CUDA_CONTEXT_BYTES
    assert "cuda graph pool" in lines  # compile: reduce-overhead
    assert "cuda graph pool" not in {item.name for item in memory_plan(LLAMA, NF4, plan.budget).items}


def test_max_autotune_plans_a_second_copy_of_every_matmul_weight() -> None:
    budget = MemoryBudget(bytes=1024 * GiB, source="test", counts_cuda_context=False)
    for name, weight_bytes in (("cpu-bf16", 2), ("cpu", 4)):
        plain = memory_plan(LLAMA, replace(load_profile(name), lone_step="compiled"), budget)
        tuned = memory_plan(LLAMA, replace(load_profile(name), lone_step="max-autotune"), budget)
        lines = {item.name: item.bytes for item in tuned.items}
        # the decoder's linear layers and the untied head, in the weights' dtype
        assert lines["lone step weights"] == (LLAMA.linear_params + LLAMA.lm_head_params) * weight_bytes
        assert tuned.needed - plain.needed == lines["lone step weights"]
        assert "lone step weights" not in {item.name for item in plain.items}
    int8 = {item.name: item.bytes for item in
            memory_plan(LLAMA, replace(load_profile("cpu-int8"), lone_step="max-autotune"), budget).items}
    rows = LLAMA.layers * (4096 + 1024 + 1024 + 4096 + 2 * 14336 + 4096) + 128256  # a bf16 scale each
    assert int8["lone step weights"] == LLAMA.linear_params + LLAMA.lm_head_params + 2 * rows


def test_a_template_copy_that_does_not_fit_is_planned_away_not_refused() -> None:
    tuned = replace(load_profile("cpu-bf16"), lone_step="max-autotune")
    compiled = replace(tuned, lone_step="compiled")
    roomy = MemoryBudget(bytes=1024 * GiB, source="test", counts_cuda_context=False)
    needs = memory_plan(LLAMA, compiled, roomy).needed
    copy = memory_plan(LLAMA, tuned, roomy).needed - needs
    # room for everything but the copy: served as `compiled`, and the plan says why
    tight = memory_plan(LLAMA, tuned, MemoryBudget(needs + copy // 2, "test"), "llama")
    assert tight.fits and tight.profile.lone_step == "compiled" and tight.needed == needs
    assert "lone step weights" not in {item.name for item in tight.items}
    assert tight.dropped_copy is not None and "GEMM template copy" in tight.dropped_copy
    assert tight.dropped_copy in render_plan(tight)
    # room for the copy too: kept
    kept = memory_plan(LLAMA, tuned, MemoryBudget(needs + copy, "test"))
    assert kept.fits and kept.profile.lone_step == "max-autotune" and kept.dropped_copy is None
    # room for neither: the refusal is the compiled plan's, its fixes without the copy
    short = memory_plan(LLAMA, tuned, MemoryBudget(needs // 2, "test"))
    assert not short.fits and short.profile.lone_step == "compiled" and short.fixes is not None
    assert short.fixes.memory_needed == needs


def test_measured_free_memory_already_excludes_the_cuda_context() -> None:
    plan = memory_plan(LLAMA, BF16, MemoryBudget(24 * GiB, "measured free now"))
    assert "cuda context" not in {item.name for item in plan.items}


def test_the_model_caps_the_context() -> None:
    config = LLAMA_3_1_8B | {"max_position_embeddings": 4096}
    plan = memory_plan(shape_from_config(config), BF16, gpu_memory_budget("24GiB"))
    assert plan.context == 4096
    assert "capped by the model's max_position_embeddings 4096" in render_plan(plan)


def test_a_config_without_a_needed_field_names_it() -> None:
    config = {key: value for key, value in LLAMA_3_1_8B.items() if key != "hidden_size"}
    with pytest.raises(ConfigError, match="`hidden_size` is None"):
        shape_from_config(config)


def test_a_composite_config_is_planned_from_its_text_config() -> None:
    composite = {"model_type": "llava", "text_config": LLAMA_3_1_8B, "vision_config": {"hidden_size": 1024}}
    assert shape_from_config(composite) == LLAMA


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}, (32, 8, 128)),
        ({"num_attention_heads": 32, "hidden_size": 4096}, (32, 32, 128)),
        ({"num_attention_heads": 16, "num_key_value_heads": None, "head_dim": None, "hidden_size": 2048},
         (16, 16, 128)),
        ({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 3072},
         (8, 4, 256)),
    ],
)
def test_attention_heads_read_a_config_dict_and_attributes_alike(
    fields: dict[str, Any], expected: tuple[int, int, int]
) -> None:
    assert attention_heads(fields) == expected
    assert attention_heads(SimpleNamespace(**fields)) == expected


def test_attention_heads_read_a_transformers_config_by_attribute_so_its_aliases_hold() -> None:
    class Gpt2LikeConfig:  # transformers' attribute_map maps num_attention_heads to n_head
        n_head, n_embd = 12, 768
        num_attention_heads = property(lambda self: self.n_head)
        hidden_size = property(lambda self: self.n_embd)

    assert attention_heads(Gpt2LikeConfig()) == (12, 12, 64)


def test_attention_heads_refuse_a_field_that_is_not_a_positive_integer() -> None:
    with pytest.raises(ConfigError, match="model config: `num_key_value_heads` is 0") as refused:
        attention_heads({"num_attention_heads": 8, "num_key_value_heads": 0, "hidden_size": 512})
    assert refused.value.param == "num_key_value_heads"
    with pytest.raises(ConfigError, match="`hidden_size` is None"):
        attention_heads({"num_attention_heads": 8})


@pytest.mark.parametrize(
    ("limit", "expected"), [(None, 8192), (0, 8192), (4096, 4096), (8192, 8192), (131072, 8192)]
)
def test_the_context_limit_is_the_profile_capped_by_the_model(limit: int | None, expected: int) -> None:
    assert BF16.max_context == 8192
    assert context_limit(limit, BF16) == expected


# --- verdicts and fixes ----------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "card"), [(BF16, "24GiB"), (NF4, "12GiB")])
def test_the_8b_shape_fits_the_cards_the_gpu_profiles_are_named_for(profile: Profile, card: str) -> None:
    plan = memory_plan(LLAMA, profile, gpu_memory_budget(card))
    assert plan.fits and plan.fixes is None
    assert plan.requests_at_context >= profile.max_running
    assert "FITS" in render_plan(plan) and f"--gpu-memory {card}" in render_plan(plan)


def test_8gib_refuses_the_4bit_profile_and_the_suggested_context_really_fits() -> None:
    budget = gpu_memory_budget("8GiB")
    plan = memory_plan(LLAMA, NF4, budget)
    assert not plan.fits and plan.fixes is not None
    context = plan.fixes.max_context
    assert context is not None and MIN_USEFUL_CONTEXT <= context < NF4.max_context
    assert memory_plan(LLAMA, replace(NF4, max_context=context), budget).fits
    assert not memory_plan(LLAMA, replace(NF4, max_context=context + CONTEXT_STEP), budget).fits
    assert f"max_context: {context}" in render_plan(plan)


def test_8gib_refuses_16_bit_weights_and_points_to_4_bits_and_a_bigger_card() -> None:
    plan = memory_plan(LLAMA, BF16, gpu_memory_budget("8GiB"))
    assert not plan.fits and plan.fixes is not None
    assert plan.fixes.max_context is None and plan.fixes.max_running is None  # the weights alone
    assert plan.requests_at_context == 0
    four_bit = plan.fixes.four_bit
    assert four_bit is not None and four_bit.change == "--profile 12gb-4bit"
    assert four_bit.weights == weights(LLAMA, NF4) and not four_bit.fits
    assert plan.fixes.memory_needed == plan.needed
    text = render_plan(plan)
    card = f"a card with at least {math.ceil(plan.needed / GiB)} GiB"
    assert "DOES NOT FIT" in text and "--profile 12gb-4bit" in text and card in text


def test_measured_free_memory_refuses_and_the_suggested_max_running_fits() -> None:
    budget = MemoryBudget(20 * GiB, "measured free now")
    plan = memory_plan(LLAMA, BF16, budget)
    assert not plan.fits and plan.fixes is not None
    running = plan.fixes.max_running
    assert running is not None and 1 <= running < BF16.max_running
    assert memory_plan(LLAMA, replace(BF16, max_running=running), budget).fits
    assert not memory_plan(LLAMA, replace(BF16, max_running=running + 1), budget).fits
    assert plan.requests_at_context == running  # "room for N requests" is the same arithmetic
    assert plan.fixes.memory_needed == plan.needed + CUDA_CONTEXT_BYTES  # a card also holds the context


def test_a_smaller_prefix_cache_is_suggested_when_it_is_enough() -> None:
    budget = MemoryBudget(memory_plan(LLAMA, NF4, gpu_memory_budget("12GiB")).needed - GiB // 2, "test")
    plan = memory_plan(LLAMA, NF4, budget)
    assert plan.fixes is not None
    tokens = plan.fixes.prefix_cache_tokens
    assert tokens is not None and 0 < tokens < NF4.prefix_cache_tokens
    assert memory_plan(LLAMA, replace(NF4, prefix_cache_tokens=tokens), budget).fits
    assert not memory_plan(LLAMA, replace(NF4, prefix_cache_tokens=tokens + CONTEXT_STEP), budget).fits


def test_the_table_reads_per_item() -> None:
    text = render_plan(memory_plan(LLAMA, BF16, gpu_memory_budget("24GiB"), "Llama-3.1-8B"))
    assert "weights" in text and "14.96 GiB" in text and "8.03 B params" in text
    assert "128 KiB/token × 8192 tokens × 4 running" in text
    assert re.search(r"^  available +24.00 GiB  --gpu-memory 24GiB$", text, re.MULTILINE)


# --- reading a model directory ---------------------------------------------------------------

TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10,
    "max_position_embeddings": 64, "tie_word_embeddings": False,
}


def tiny_tensors() -> dict[str, np.ndarray]:
    """One Llama layer with a q bias: linear q 64 + k, v 2·32 + o 64 + MLP 3·128 = 576."""
    shapes = {
        "model.embed_tokens.weight": (10, 8),
        "model.layers.0.self_attn.q_proj.weight": (8, 8),
        "model.layers.0.self_attn.q_proj.bias": (8,),
        "model.layers.0.self_attn.k_proj.weight": (4, 8),
        "model.layers.0.self_attn.v_proj.weight": (4, 8),
        "model.layers.0.self_attn.o_proj.weight": (8, 8),
        "model.layers.0.mlp.gate_proj.weight": (16, 8),
        "model.layers.0.mlp.up_proj.weight": (16, 8),
        "model.layers.0.mlp.down_proj.weight": (8, 16),
        "model.layers.0.input_layernorm.weight": (8,),
        "model.layers.0.post_attention_layernorm.weight": (8,),
        "model.norm.weight": (8,),
        "lm_head.weight": (10, 8),
    }
    return {name: np.zeros(shape, dtype=np.float16) for name, shape in shapes.items()}


def write_model(directory: Path, shards: list[dict[str, np.ndarray]], config: dict[str, Any]) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"))
        return directory
    weight_map = {}
    for number, shard in enumerate(shards, 1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / name))
        weight_map |= dict.fromkeys(shard, name)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def assert_tiny_counts(shape: ModelShape, lm_head: int = 80) -> None:
    assert shape.counted_from == "safetensors headers"
    assert (shape.linear_params, shape.embedding_params, shape.lm_head_params) == (576, 80, lm_head)
    assert shape.other_params == 8 + 3 * 8  # q bias, two layer norms, the final norm
    assert shape.largest_linear_params == 128


def test_safetensors_headers_give_exact_counts(tmp_path: Path) -> None:
    shape = read_model_shape(write_model(tmp_path / "m", [tiny_tensors()], TINY_CONFIG))
    assert_tiny_counts(shape)
    assert read_safetensors_header(tmp_path / "m" / "model.safetensors")["lm_head.weight"] == (10, 8)


def test_sharded_checkpoints_are_read_through_their_index(tmp_path: Path) -> None:
    tensors = list(tiny_tensors().items())
    shards = [dict(tensors[:5]), dict(tensors[5:])]
    assert_tiny_counts(read_model_shape(write_model(tmp_path / "m", shards, TINY_CONFIG)))
    (tmp_path / "m" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"shards missing: model-00002-of-00002\.safetensors"):
        read_model_shape(tmp_path / "m")


def test_tied_embeddings_count_once(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m", [tiny_tensors()], TINY_CONFIG | {"tie_word_embeddings": True})
    assert_tiny_counts(read_model_shape(model), lm_head=0)


def test_without_a_checkpoint_the_config_arithmetic_counts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    assert read_model_shape(tmp_path) == LLAMA


def test_a_missing_or_broken_model_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}/config.json: no config.json here")):
        read_model_shape(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_model_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ConfigError, match=r"model\.safetensors: not a safetensors file"):
        read_model_shape(tmp_path)


@pytest.mark.parametrize(
    ("facts", "chosen", "reason"),
    [
        (HardwareFacts(int(23.6 * GiB), "RTX 4090", False), "24gb-bf16-compile", "RTX 4090 with 23.60 GiB"),
        (HardwareFacts(80 * GiB, "H100", True), "24gb-bf16-compile", "compiled decode"),
        (HardwareFacts(int(11.7 * GiB), "RTX 3060", False), "12gb-4bit", "4-bit weights"),
        (HardwareFacts(8 * GiB, "RTX 3070", False), "12gb-4bit", "memory plan will say whether it fits"),
        (HardwareFacts(None, None, True), "cpu-bf16", "native bfloat16"),
        (HardwareFacts(None, None, False), "cpu", "float32"),
    ],
)
def test_profile_auto_picks_by_gpu_memory_then_cpu(facts: HardwareFacts, chosen: str, reason: str) -> None:
    name, why = choose_profile(facts)
    assert (name, reason in why) == (chosen, True), why
    assert load_profile(name).engine == "native"  # a shipped profile; never vLLM without being asked


def test_the_prefill_workspace_is_planned_for_a_whole_step_whatever_the_lone_piece() -> None:
    budget = gpu_memory_budget("1TiB")
    pieces = [memory_plan(LLAMA, replace(BF16, lone_prefill_tokens=size), budget) for size in (512, 2048)]
    workspaces = [next(item for item in plan.items if item.name == "prefill workspace") for plan in pieces]
    assert workspaces[0] == workspaces[1] and "2048-token prefill step" in workspaces[0].note
