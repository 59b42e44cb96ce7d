"""The per-GPU plan of a parallel (vLLM) deployment: weights and KV per rank, and each refusal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmd.cli import main
from llmd.config import Parallel, load_profile
from llmd.errors import ConfigError
from llmd.preflight.ranks import kv_heads_per_gpu, padded_vocab, rank_plan, stage_layers
from llmd.preflight.shape import shape_from_config
from llmd.units import GiB
from tests.helpers.configs import LLAMA_3_1_8B, LLAMA_3_1_70B, QWEN2_5_7B

LLAMA_70B = shape_from_config(LLAMA_3_1_70B)
LLAMA_8B = shape_from_config(LLAMA_3_1_8B)
H100 = 80 * GiB


def plan(shape=LLAMA_70B, gpu_bytes=H100, gpus_per_node=8, kv_dtype="auto", context=8192, **sizes: int):
    return rank_plan(shape, Parallel(**sizes), gpu_bytes=gpu_bytes, gpus_per_node=gpus_per_node,
                     dtype="bfloat16", kv_dtype=kv_dtype, context=context, overhead_bytes=4 * GiB)


def test_a_70b_model_does_not_fit_one_80gib_gpu_and_fits_at_tp_2_4_and_8() -> None:
    assert LLAMA_70B.params * 2 == pytest.approx(141e9, rel=0.01)  # the issue's ~141 GB in bfloat16
    alone = plan(tensor=1)
    assert not alone.fits and "leaving nothing for the KV cache" in alone.refusals[0]
    previous = None
    for tp in (2, 4, 8):
        stage, = plan(tensor=tp).stages
        # every tensor but the replicated norms is sliced: weights shrink by TP to within 1 %
        assert stage.weight_bytes == pytest.approx(LLAMA_70B.params * 2 / tp, rel=0.01)
        assert stage.kv_heads == 8 // tp
        assert stage.kv_bytes_per_token == 2 * 80 * (8 // tp) * 128 * 2
        assert plan(tensor=tp).fits
        if previous is not None:
            assert stage.tokens > previous.tokens
        previous = stage


def test_past_the_kv_heads_each_gpu_holds_a_replicated_head_and_says_so() -> None:
    at_8, at_16 = plan(shape=LLAMA_8B, tensor=8).stages[0], plan(shape=LLAMA_8B, tensor=16, gpus_per_node=16)
    assert at_8.kv_heads == at_16.stages[0].kv_heads == 1
    assert at_8.kv_bytes_per_token == at_16.stages[0].kv_bytes_per_token
    assert at_16.warnings and "exceeds the model's 8 KV heads" in at_16.warnings[0]
    assert kv_heads_per_gpu(4, 8) == 1 and kv_heads_per_gpu(8, 2) == 4


def test_pipeline_stages_split_the_layers_and_hold_the_embedding_and_head_at_the_ends() -> None:
    assert stage_layers(80, 2) == [40, 40] and stage_layers(81, 2) == [41, 40]
    assert stage_layers(32, 3) == [11, 11, 10] and stage_layers(10, 4) == [2, 3, 3, 2]
    first, last = plan(tensor=4, pipeline=2).stages
    vocab_slice = padded_vocab(128256, 4) * 8192 // 4 * 2
    assert first.layers == last.layers == 40 and first.kv_heads == last.kv_heads == 2
    assert first.weight_bytes - vocab_slice == last.weight_bytes - vocab_slice - 8192 * 2  # + the final norm
    assert first.kv_bytes_per_token == 2 * 40 * 2 * 128 * 2
    assert plan(tensor=4, pipeline=2).fits


def test_a_tied_head_is_counted_once_on_one_stage_and_copied_onto_the_last_of_several() -> None:
    tied = shape_from_config(QWEN2_5_7B | {"tie_word_embeddings": True})
    one, = plan(shape=tied, tensor=2).stages
    untied, = plan(shape=shape_from_config(QWEN2_5_7B), tensor=2).stages
    vocab_slice = padded_vocab(152064, 2) * 3584 // 2 * 2
    assert untied.weight_bytes - one.weight_bytes == vocab_slice
    first, last = plan(shape=tied, tensor=2, pipeline=2).stages
    assert first.weight_bytes + last.weight_bytes - 3584 * 2 == pytest.approx(untied.weight_bytes, rel=0.01)


def test_an_fp8_kv_cache_halves_the_bytes_per_token_and_doubles_the_tokens() -> None:
    bf16, fp8 = plan(tensor=4).stages[0], plan(tensor=4, kv_dtype="fp8").stages[0]
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.tokens == pytest.approx(2 * bf16.tokens, rel=0.001)


@pytest.mark.parametrize(("sizes", "message"), [
    ({"tensor": 3}, "64 attention heads do not divide by tensor parallel size 3; use one of 1, 2, 4, 8"),
    ({"tensor": 8, "pipeline": 2}, "= 16 GPUs, but 1 node(s) x 8 GPU(s) = 8"),
    ({"tensor": 2, "pipeline": 81}, "pipeline parallel size 81 exceeds the model's 80 layers"),
    ({"tensor": 2, "data": 8}, "tensor 2 x pipeline 1 x data 8 = 16 GPUs"),
])
def test_what_vllm_would_refuse_is_refused_before_any_process_starts(
    sizes: dict[str, int], message: str
) -> None:
    refused = plan(gpus_per_node=8, **sizes)
    assert not refused.fits and any(message in refusal for refusal in refused.refusals), refused.refusals


def test_kv_heads_that_neither_divide_nor_are_divided_by_tp_are_refused() -> None:
    odd = shape_from_config(LLAMA_3_1_8B | {"num_key_value_heads": 6, "num_attention_heads": 48})
    refused = plan(shape=odd, tensor=4)
    assert any("6 KV heads neither divide by tensor parallel size 4" in r for r in refused.refusals)


def test_a_context_longer_than_the_kv_room_is_refused_with_the_longest_that_fits() -> None:
    tight = plan(tensor=2, gpu_bytes=76 * GiB, context=131072)
    stage, = tight.stages
    assert 0 < stage.tokens < 131072 and not tight.fits
    assert f"holds {stage.tokens} tokens of KV cache after its weights, fewer than one 131072-token " \
           f"sequence; a max_context of at most {stage.tokens}" in tight.refusals[0]
    assert plan(tensor=2, gpu_bytes=76 * GiB, context=stage.tokens).fits


def test_data_parallel_replicas_add_gpus_not_memory_per_gpu() -> None:
    assert plan(tensor=2, data=4).stages == plan(tensor=2).stages
    assert Parallel(tensor=2, pipeline=2, data=2).gpus == 8


# --- the profile keys and `llmd check` -------------------------------------------------------


def vllm_profile(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "tp.yaml"
    path.write_text("engine: vllm\ndevice: cuda\ndtype: bfloat16\nmax_context: 8192\nmemory_headroom: 1GiB\n"
                    "parallel:\n  tensor: 4\n  pipeline: 2\n" + extra)
    return path


def config_only_model(tmp_path: Path) -> Path:
    model = tmp_path / "llama-70b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_3_1_70B))
    return model


def test_check_prints_the_plan_per_gpu_and_exits_by_whether_it_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, profile = str(config_only_model(tmp_path)), str(vllm_profile(tmp_path))
    plan = ["check", "--model", model, "--profile", profile, "--gpu-memory", "80GiB"]
    assert main([*plan, "--gpus", "8"]) == 0
    table = capsys.readouterr().out
    assert "TP 4 x PP 2 x DP 1 = 8 GPUs on 1 node(s) x 8 GPU(s) of 80.00 GiB" in table
    rows = [line.split() for line in table.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert [row[:2] for row in rows] == [["0", "40"], ["1", "40"]] and "FITS:" in table
    assert main([*plan, "--gpus", "4"]) == 77
    assert "8 GPUs, but 1 node(s) x 4 GPU(s) = 4" in capsys.readouterr().out
    assert main(["check", "--model", model, "--profile", profile]) == 78  # no machine to plan for
    assert "--gpus N (per node) and --gpu-memory SIZE" in capsys.readouterr().err


@pytest.mark.parametrize("gpus", [4, 8])
def test_check_plans_the_shipped_multi_gpu_profile_with_tensor_parallel_over_the_gpus_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpus: int
) -> None:
    model = str(config_only_model(tmp_path))
    assert main(["check", "--model", model, "--profile", "multi-gpu-bf16", "--gpus", str(gpus),
                 "--gpu-memory", "80GiB"]) == 0
    table = capsys.readouterr().out
    assert f"TP {gpus} x PP 1 x DP 1 = {gpus} GPUs on 1 node(s) x {gpus} GPU(s) of 80.00 GiB" in table
    rows = [line.split() for line in table.splitlines() if line.strip().startswith("0 ")]
    assert [row[:2] for row in rows] == [["0", "80"]] and "FITS:" in table  # one stage: all 80 layers
    assert main(["check", "--model", model, "--profile", "multi-gpu-bf16", "--gpu-memory", "80GiB"]) == 78
    assert "`auto` stands for the machine's GPU count" in capsys.readouterr().err


def test_gpus_are_refused_for_a_native_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(config_only_model(tmp_path))
    assert main(["check", "--model", model, "--profile", "cpu", "--gpus", "2", "--no-load"]) == 78
    assert "runs llmd's native engine on one device" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("parallel:\n  tensor: 2\n", "`parallel`: sizes are for `engine: vllm`"),
    ("kv_cache_dtype: fp8\n", "`kv_cache_dtype`: is for `engine: vllm`"),
    ("engine: vllm\nquantization: nf4\n", "use fp8 weights or an AWQ/GPTQ checkpoint"),
    ("engine: vllm\nonednn_linear: true\n", "set it to false with `engine: vllm`"),
    ("engine: vllm\nparallel:\n  nodes: 2\n", "2 nodes need `master_addr`"),
    ("engine: vllm\nparallel:\n  nodes: 2\n  node_rank: 2\n  master_addr: 10.0.0.1\n",
     "`node_rank` 2 is not below"),
])
def test_profile_keys_that_contradict_the_engine_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_profile(str(path))
