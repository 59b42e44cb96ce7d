"""The step profile's arithmetic (llmd/bench/step_split.py) on rows shaped like the profiler's.

`scripts/profile_step.py` runs the profiler itself; here the rows are written by hand.
"""

from __future__ import annotations

import pytest

from llmd.bench.step_split import (
    CATEGORIES,
    PYTHON,
    SAMPLING_RANGE,
    STEP_RANGE,
    OpRow,
    StepRun,
    category,
    category_totals,
    split_step,
    torch_calls,
)

STEP = (STEP_RANGE,)


def one_step(step: int = 0, linear_us: float = 300.0) -> list[OpRow]:
    """One decode step as the profiler shows it: a layer's ops, sampling, the step's own Python."""
    return [
        OpRow(STEP_RANGE, 40.0, (), step),
        OpRow("mkldnn::_linear_pointwise", linear_us, STEP, step),
        OpRow("aten::reshape", 2.0, (*STEP, "mkldnn::_linear_pointwise"), step),
        OpRow("aten::scaled_dot_product_attention", 3.0, STEP, step),
        OpRow("aten::_scaled_dot_product_flash_attention_for_cpu", 50.0,
              (*STEP, "aten::scaled_dot_product_attention"), step),
        OpRow("aten::mean", 4.0, STEP, step),
        OpRow("aten::sum", 5.0, (*STEP, "aten::mean"), step),
        OpRow("aten::add_", 6.0, STEP, step),
        OpRow("aten::cat", 7.0, STEP, step),
        OpRow("aten::copy_", 8.0, STEP, step),  # the KV cache write
        OpRow("aten::slice", 1.0, STEP, step),
        OpRow(SAMPLING_RANGE, 20.0, STEP, step),
        OpRow("aten::argmax", 9.0, (*STEP, SAMPLING_RANGE), step),
        OpRow("aten::to", 2.0, (*STEP, SAMPLING_RANGE), step),
    ]


@pytest.mark.parametrize(("row", "expected"), [
    (OpRow("mkldnn::_linear_pointwise", 1.0), "matmul"),
    (OpRow("aten::_weight_int8pack_mm", 1.0), "matmul"),
    (OpRow("aten::t", 1.0, ("aten::linear",)), "matmul"),
    (OpRow("aten::softmax", 1.0, ("aten::_scaled_dot_product_attention_math",)), "attention"),
    (OpRow("aten::bmm", 1.0, ("aten::scaled_dot_product_attention",)), "attention"),
    (OpRow("aten::copy_", 1.0, ("aten::to", "aten::_to_copy")), "norm/rope/act"),
    (OpRow("aten::mul_", 1.0), "norm/rope/act"),
    (OpRow("aten::copy_", 1.0), "kv/copies"),
    (OpRow("aten::empty", 1.0, ("aten::contiguous", "aten::clone")), "kv/copies"),
    (OpRow("aten::argmax", 1.0, (STEP_RANGE, SAMPLING_RANGE)), "sampling"),
    (OpRow("aten::mul", 1.0, (SAMPLING_RANGE,)), "sampling"),
    (OpRow("aten::as_strided", 1.0, ("aten::slice",)), "other ops"),
    (OpRow(STEP_RANGE, 1.0), PYTHON),
])
def test_an_op_goes_to_what_it_ran_inside_first(row: OpRow, expected: str) -> None:
    assert category(row) == expected


def test_totals_sum_self_times_per_category_and_leave_the_step_range_to_python() -> None:
    totals = category_totals(one_step())
    assert totals == {"matmul": 302.0, "attention": 53.0, "norm/rope/act": 22.0, "sampling": 31.0,
                      "kv/copies": 8.0, "other ops": 1.0}
    assert list(totals) == list(CATEGORIES)


def test_calls_count_the_ops_called_from_python_only() -> None:
    # linear, sdpa, mean, add_, cat, copy_, slice, argmax and to (inside llmd's ranges alone)
    assert torch_calls(one_step()) == 9


def test_split_takes_each_categorys_median_and_python_is_what_the_ops_leave() -> None:
    rows = [*one_step(0), *one_step(1, linear_us=9000.0), *one_step(2)]  # step 1 was preempted
    split = split_step(StepRun(rows, 3, wall_us=500.0, profiled_us=600.0), ("small", "cpu", 8),
                       weight_bytes=3_000_000)
    assert split.category_us["matmul"] == 302.0
    assert split.category_us[PYTHON] == pytest.approx(500.0 - 417.0)
    assert sum(split.category_us.values()) == pytest.approx(split.wall_us)
    assert split.share("matmul") == pytest.approx(302.0 / 500.0)
    assert split.tokens_per_s == pytest.approx(8 / 500e-6)
    assert split.matmul_gb_s == pytest.approx(3_000_000 / 302e-6 / 1e9)
    assert split.calls == 9
