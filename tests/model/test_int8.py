"""`quantization: int8`: weight-only int8 Linear layers compute q * scale, keep the model's logits
within their bound, are planned as they are held, and refuse what they cannot do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace
from safetensors.torch import load_file, save_file

from llmd.config import load_profile
from llmd.engine.model import int8
from llmd.engine.model.checklist import tuning_checklist
from llmd.engine.model.int8 import Int8Linear, quantize_linears, quantize_rows
from llmd.engine.model.loader import load_model, tensor_bytes
from llmd.engine.model.probes import INT8_TOLERANCE
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.threads import ThreadPlan
from llmd.engine.types import Request, SamplingParams
from llmd.errors import ConfigError, PreflightRefusal
from llmd.preflight.hardware import MemoryBudget
from llmd.preflight.plan import memory_plan
from llmd.preflight.render import render_plan
from llmd.preflight.shape import read_model_shape
from tests.helpers.modules import TiedAndHalf

INT8 = load_profile("cpu-int8")
BF16 = load_profile("cpu-bf16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_are_quantized_symmetrically_to_within_half_a_step(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weight = torch.randn(40, 96).to(dtype)
    weight[3] = 0.0  # an all-zero row keeps a usable scale
    q, scales = quantize_rows(weight)
    assert q.dtype == torch.int8 and scales.dtype == dtype and q.shape == weight.shape
    assert int(q.abs().max()) <= 127
    assert (q.abs().amax(dim=1)[torch.arange(40) != 3] >= 126).all()  # each row's range is used
    error = (weight.float() - q.float() * scales.float().unsqueeze(1)).abs()
    assert (error <= 0.5 * scales.float().unsqueeze(1) + 1e-6).all()
    assert not q[3].any() and bool(scales[3] > 0)


@pytest.mark.parametrize("rows", [1, 8, int8.DEQUANTIZE_ABOVE_ROWS + 5])  # the kernel; the converted GEMM
@pytest.mark.parametrize("bias", [True, False])
def test_an_int8_linear_multiplies_by_its_dequantized_weight(rows: int, bias: bool) -> None:
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 48, bias=bias, dtype=torch.bfloat16)
    layer = Int8Linear.quantized(linear)
    x = torch.randn(2, rows, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = torch.nn.functional.linear(x.float(), layer.dequantized().float(),
                                          None if linear.bias is None else linear.bias.float())
        got = layer(x)
    assert got.shape == (2, rows, 48) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)  # bfloat16 output rounding
    assert float((layer.dequantized().float() - linear.weight.detach().float()).abs().max()) < 0.01


def test_a_tied_head_gets_its_own_int8_copy_and_float16_stays() -> None:
    model = TiedAndHalf()
    embedding = model.embed.weight.detach().clone()
    report = quantize_linears(model)
    assert report.quantized == 2 and isinstance(model.proj, Int8Linear) and isinstance(model.head, Int8Linear)
    assert report.tied_copies == ("head",) and report.skipped == {"half": "float16 weights"}
    assert report.int8_bytes == 16 * 16 + 16 * 4 + 32 * 16 + 32 * 4  # int8 weights + a float32 scale per row
    torch.testing.assert_close(model.embed.weight.detach(), embedding, rtol=0, atol=0)  # kept as it was
    step = float(embedding.abs().max()) / 127
    torch.testing.assert_close(model.head.dequantized(), embedding, rtol=0, atol=step)
    assert "head as its own int8 copy" in report.summary() and "float16" in report.summary()


def test_a_tied_model_is_planned_and_held_with_its_head_copied(tiny_model: Path, tmp_path: Path) -> None:
    tied = tmp_path / "tied"
    shutil.copytree(tiny_model, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    tensors = load_file(tied / "model.safetensors")
    del tensors["lm_head.weight"]  # as a tied checkpoint is saved: the head is the embedding
    save_file(tensors, tied / "model.safetensors", metadata={"format": "pt"})
    model, report = load_model(tied, INT8)
    assert report.quantized is not None and report.quantized.tied_copies == ("lm_head",)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    plan = memory_plan(read_model_shape(tied), INT8, MemoryBudget(1 << 40, "test"))
    assert plan.weight_bytes == pytest.approx(report.weight_bytes, rel=0.01)
    assert "the tied head as its own copy" in render_plan(plan)


def test_the_int8_profile_serves_close_to_bfloat16_in_half_the_linear_bytes(tiny_model: Path) -> None:
    quantized, report = load_model(tiny_model, INT8)
    plain, plain_report = load_model(tiny_model, replace(BF16, onednn_linear=False))
    assert report.quantized is not None and plain_report.quantized is None
    config = plain.config
    linears = config.num_hidden_layers * 7 + (0 if config.tie_word_embeddings else 1)
    assert report.quantized.quantized == linears
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == linears
    tied = {"lm_head"} if config.tie_word_embeddings else set()
    originals = [m for name, m in plain.named_modules() if type(m) is torch.nn.Linear and name not in tied]
    weights, rows = sum(m.weight.numel() for m in originals), sum(m.out_features for m in originals)
    assert report.quantized.int8_bytes == weights + 2 * rows  # a byte a weight, a bfloat16 scale a row
    assert tensor_bytes(quantized) == report.weight_bytes < plain_report.weight_bytes
    shape = read_model_shape(tiny_model)
    plan = memory_plan(shape, INT8, MemoryBudget(1 << 40, "test"))
    assert plan.weight_bytes == pytest.approx(report.weight_bytes, rel=0.01)  # the plan counts what is held
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.inference_mode():
        want, got = plain(input_ids=ids).logits.float(), quantized(input_ids=ids).logits.float()
    assert float((want - got).abs().max()) <= INT8_TOLERANCE * float(want.abs().max())
    check = {c.name: c for c in tuning_checklist(quantized, INT8, None)}["int8 Linear layers"]
    assert check.ok and f"{linears} Linear layers" in check.detail


def test_the_runner_decodes_on_int8_layers_through_the_direct_walk(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, INT8)
    assert runner.fast_paths.direct_problem is None  # the layer walk calls the int8 layers
    assert runner.fast_paths.lone_problem is None  # and the shipped max-autotune lone step is proven
    request = Request("r", list(range(5, 30)), SamplingParams(max_tokens=6))
    tokens = [runner.first_token(request)]
    for _ in range(5):
        tokens += runner.decode([request])
    runner.release(request.request_id)
    vocab = int(runner.model.config.vocab_size)
    assert len(tokens) == 6 and all(0 <= token < vocab for token in tokens)


def test_an_int8_model_that_loses_its_logits_is_refused(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def scrambled(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = quantize_rows(weight)
        return q.flip(1).contiguous(), scales  # every row's values in the wrong columns

    monkeypatch.setattr(int8, "quantize_rows", scrambled)
    with pytest.raises(PreflightRefusal, match=r"logits differ from the torch.bfloat16 model's by up to .* "
                                                r"use a profile with quantization: none"):
        load_model(tiny_model, INT8)


def test_a_torch_without_the_kernel_is_refused_by_name(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(torch, "_weight_int8pack_mm")
    with pytest.raises(PreflightRefusal, match="has no _weight_int8pack_mm"):
        load_model(tiny_model, INT8)


@pytest.mark.parametrize(("changes", "message"), [
    ({"device": "cuda"}, "int8 is weight-only int8 for the CPU's kernels, but `device` is `cuda`"),
    ({"kv_cache": "static", "compile": "default"}, "int8 layers run eagerly; set `compile: none`"),
])
def test_contradicting_int8_profiles_are_refused(
    tmp_path: Path, changes: dict[str, str], message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("quantization: int8\n" + "".join(f"{k}: {v}\n" for k, v in changes.items()))
    with pytest.raises(ConfigError, match=message):
        load_profile(str(path))


def test_the_plan_counts_loadings_bfloat16_peak_when_it_is_the_larger(tiny_model: Path) -> None:
    shape = read_model_shape(tiny_model)
    # no lone step weights either: they would outweigh the peak
    lean = replace(INT8, lone_step="eager", max_running=1, max_context=64, prefix_cache_tokens=0,
                   max_step_tokens=32, lone_prefill_tokens=32, memory_headroom="0")
    plan = memory_plan(shape, lean, MemoryBudget(1 << 40, "test"))
    served = sum(item.bytes for item in plan.items)
    assert plan.load_peak == shape.params * 2 > served  # the bfloat16 weights, before quantizing
    assert plan.needed == plan.load_peak
    text = render_plan(plan)
    assert "loading peak" in text and "int8 + a bfloat16 scale per row" in text
    roomy = memory_plan(shape, INT8, MemoryBudget(1 << 40, "test"))
    assert roomy.needed == sum(item.bytes for item in roomy.items) > roomy.load_peak
    short = memory_plan(shape, lean, MemoryBudget(served + 1, "test"))
    assert not short.fits and short.fixes is not None  # serving would fit, loading would not
    assert memory_plan(shape, BF16, MemoryBudget(1 << 40, "test")).load_peak == 0


def test_int8_layers_decode_a_lone_stream_on_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmd.engine.model.threads.psutil.cpu_count", lambda logical=True: 4)
    int8_plan = ThreadPlan.for_profile(INT8)
    plain = ThreadPlan.for_profile(replace(INT8, quantization="none"))  # no int8, no oneDNN packing
    assert int8_plan is not None and plain is not None
    assert (int8_plan.for_rows(1), int8_plan.for_rows(8)) == (4, 4)
    assert (plain.for_rows(1), plain.for_rows(8)) == (3, 4)
