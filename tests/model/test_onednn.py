"""`onednn_linear`: Linear layers on prepacked weights compute what nn.Linear does, and back off safely."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from llmd.config import load_profile
from llmd.engine.model.checklist import tuning_checklist
from llmd.engine.model.dynamic_batch import DynamicDecodeBatch
from llmd.engine.model.loader import load_model, tensor_bytes
from llmd.engine.model.onednn import (
    PACKED,
    PackedGroup,
    PackedLinear,
    PackedPart,
    pack_linears,
    unpack_linears,
)
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.static_batch import StaticDecodeBatch, UnsupportedCache
from llmd.engine.model.threads import ThreadPlan
from llmd.errors import ConfigError
from tests.helpers.configs import eager_profile
from tests.helpers.modules import TiedAndHalf

CPU = eager_profile()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_linear_computes_what_the_linear_does(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias, dtype=dtype)
    packed = PackedLinear(linear)
    inputs = [torch.randn(1, 48, dtype=dtype), torch.randn(3, 7, 48, dtype=dtype),
              torch.randn(48, 9, dtype=dtype).t()]  # one row, a batch of sequences, a transposed view
    with torch.inference_mode():
        for x in inputs:
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        back = packed.unpacked()
        torch.testing.assert_close(back.weight, linear.weight, rtol=0, atol=0)
        torch.testing.assert_close(back(inputs[1]), linear(inputs[1]), rtol=0, atol=0)


def siblings(dtype: torch.dtype) -> list[torch.nn.Linear]:
    torch.manual_seed(1)
    shapes = ((32, True), (16, False), (24, True))  # widths, and biases on some
    return [torch.nn.Linear(40, width, bias=bias, dtype=dtype) for width, bias in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_siblings_packed_as_one_each_compute_what_their_linear_does(dtype: torch.dtype) -> None:
    linears = siblings(dtype)
    group = PackedGroup(linears)
    parts = [PackedPart(group, index) for index in range(3)]
    x, y = torch.randn(2, 5, 40, dtype=dtype), torch.randn(1, 40, dtype=dtype)
    tolerance = {"rtol": 1e-5, "atol": 1e-5}
    with torch.inference_mode():
        whole = group(x)
        for index, linear in enumerate(linears):  # in turn on one tensor: the group runs once
            torch.testing.assert_close(parts[index](x), linear(x), **tolerance)
            share = whole[..., group.starts[index] : group.starts[index] + linear.out_features]
            torch.testing.assert_close(share, linear(x), **tolerance)
        # out of order, again, and interleaved with another input: always the right answer
        for index, z in [(2, x), (2, x), (0, y), (1, x), (1, y), (0, x), (2, y)]:
            torch.testing.assert_close(parts[index](z), linears[index](z), **tolerance)
        for index, linear in enumerate(linears):
            back = parts[index].unpacked()
            torch.testing.assert_close(back.weight, linear.weight, rtol=0, atol=0)
            assert (back.bias is None) == (linear.bias is None)
            if linear.bias is not None:
                torch.testing.assert_close(back.bias, linear.bias, rtol=0, atol=0)


def test_a_group_keeps_no_tensor_once_every_sibling_has_its_share() -> None:
    group = PackedGroup(siblings(torch.float32))
    x = torch.randn(3, 40)
    with torch.inference_mode():
        group.share(0, x)
        group.share(1, x)
        assert group._input is x
        group.share(2, x)
    assert group._input is None and group._output is None


def test_tied_and_other_weights_are_left_alone() -> None:
    model = TiedAndHalf()
    report = pack_linears(model)
    assert report.packed == 1 and isinstance(model.proj, PackedLinear)
    assert report.skipped == {"half": "float16 weights", "head": "weight shared with another module (tied)"}
    assert model.head.weight is model.embed.weight
    assert unpack_linears(model) == 1 and type(model.proj) is torch.nn.Linear


def test_the_cpu_profile_loads_packed_and_gives_the_plain_models_logits(tiny_model: Path) -> None:
    packed, report = load_model(tiny_model, CPU)
    plain, plain_report = load_model(tiny_model, replace(CPU, onednn_linear=False))
    assert report.prepack is not None and plain_report.prepack is None
    config = plain.config
    linears = config.num_hidden_layers * 7 + 1  # q k v o, gate up down, and the output head
    assert report.prepack.packed == linears and not report.prepack.skipped
    assert report.prepack.groups == config.num_hidden_layers * 2  # q/k/v and gate/up
    assert sum(isinstance(m, PACKED) for m in packed.modules()) == linears
    assert sum(isinstance(m, PackedGroup) for m in packed.modules()) == report.prepack.groups
    assert report.weight_bytes == pytest.approx(plain_report.weight_bytes, rel=0.01)
    assert tensor_bytes(packed) == report.weight_bytes
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.inference_mode():
        torch.testing.assert_close(packed(input_ids=ids).logits, plain(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-4)


def test_a_model_that_fails_packed_is_served_unpacked(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def reads_the_weight(self: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        raise AttributeError("'PackedLinear' object has no attribute 'weight'")

    monkeypatch.setattr(PackedLinear, "forward", reads_the_weight)
    with caplog.at_level(logging.WARNING, "llmd.engine"):
        model, report = load_model(tiny_model, CPU)
    assert report.prepack is None
    assert not any(isinstance(m, PACKED) for m in model.modules())
    assert "failed its probe (AttributeError" in caplog.text
    check = {c.name: c for c in tuning_checklist(model, CPU, None)}["oneDNN prepacked Linear"]
    assert not check.ok and check.detail == "not packed"
    with torch.inference_mode():
        assert model(input_ids=torch.tensor([[3, 4, 5]])).logits.isfinite().all()


@pytest.mark.parametrize(("changes", "message"), [
    ({"device": "cuda"}, "packs weights for the CPU's oneDNN, but `device` is `cuda`"),
    ({"kv_cache": "static", "compile": "default"}, "and `compile` both rewrite the Linear layers"),
])
def test_contradicting_onednn_profiles_are_refused(
    tmp_path: Path, changes: dict[str, str], message: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("onednn_linear: true\n" + "".join(f"{k}: {v}\n" for k, v in changes.items()))
    with pytest.raises(ConfigError, match=message):
        load_profile(str(path))


def test_an_eager_static_cache_falls_back_for_layers_it_cannot_hold(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def sliding(*args: object) -> None:
        raise UnsupportedCache("kv_cache: static handles full-attention layers only, this model also has "
                               "SlidingWindowLayer")

    monkeypatch.setattr("llmd.engine.model.static_batch._allocate", sliding)
    assert CPU.kv_cache == "static"
    with caplog.at_level(logging.WARNING, "llmd.engine"):
        runner = ModelRunner(tiny_model, CPU)
    assert isinstance(runner.batch, DynamicDecodeBatch)
    assert "decoding with the dynamic cache instead" in caplog.text
    with pytest.raises(UnsupportedCache):
        ModelRunner(tiny_model, replace(CPU, compile="default", onednn_linear=False))
    monkeypatch.undo()
    assert isinstance(ModelRunner(tiny_model, CPU).batch, StaticDecodeBatch)


def test_with_packed_weights_a_lone_stream_decodes_on_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmd.engine.model.threads.psutil.cpu_count", lambda logical=True: 4)
    packed = ThreadPlan.for_profile(CPU)
    plain = ThreadPlan.for_profile(replace(CPU, onednn_linear=False))
    pinned = ThreadPlan.for_profile(replace(CPU, torch_threads=3))
    assert packed is not None and plain is not None and pinned is not None
    assert (packed.for_rows(1), packed.for_rows(8)) == (4, 4)
    assert (plain.for_rows(1), plain.for_rows(8)) == (3, 4)
    assert (pinned.for_rows(1), pinned.for_rows(8)) == (3, 3)
    assert ThreadPlan.for_profile(replace(CPU, device="cuda", onednn_linear=False)) is None


@pytest.mark.parametrize(("preset", "expected"), [(None, "64"), ("300", "300")])
def test_both_primitive_caches_are_capped_unless_the_user_set_them(preset: str | None, expected: str) -> None:
    """Each new GEMM shape (prompt length) is a cached ~1 MiB oneDNN primitive: uncapped, memory
    grows with varied traffic. Checked in a fresh interpreter, as `llmd serve` starts."""
    names = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    env = {k: v for k, v in os.environ.items() if k not in names}
    if preset is not None:
        env |= dict.fromkeys(names, preset)
    code = f"import os, llmd.engine.model.onednn; print(*(os.environ[n] for n in {names!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [expected, expected]
