"""Sampling on hand-made logits: penalties, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import pytest
import torch

from llmd.engine.model.sampling import (
    SequenceState,
    accept,
    apply_penalties,
    generator_seed,
    keep_top_k,
    keep_top_p,
    row_maxima,
    sample,
    usable_rows,
)
from llmd.engine.types import SamplingParams
from llmd.errors import InvalidRequest

LOGITS = torch.tensor([4.0, 3.5, 1.0, 0.0, -1.0])


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax() -> None:
    assert sample(LOGITS, SamplingParams(max_tokens=1, temperature=0.0), None, None) == 0


def test_frequency_and_presence_penalties_follow_openai() -> None:
    counts = torch.tensor([3.0, 0.0, 1.0, 0.0, 0.0])
    params = SamplingParams(max_tokens=1, presence_penalty=0.5, frequency_penalty=0.25)
    penalized = apply_penalties(LOGITS, counts, params)
    assert penalized.tolist() == [4.0 - 0.75 - 0.5, 3.5, 1.0 - 0.25 - 0.5, 0.0, -1.0]


def test_a_penalty_changes_the_greedy_choice() -> None:
    counts = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    params = SamplingParams(max_tokens=1, temperature=0.0, frequency_penalty=1.0)
    assert sample(LOGITS, params, None, counts) == 1


def test_negative_penalty_encourages_repeats() -> None:
    counts = torch.tensor([0.0, 0.0, 0.0, 0.0, 2.0])
    params = SamplingParams(max_tokens=1, temperature=0.0, frequency_penalty=-2.0, presence_penalty=-2.0)
    assert sample(LOGITS, params, None, counts) == 4


def test_top_k_keeps_exactly_k() -> None:
    kept = keep_top_k(LOGITS, 2)
    assert torch.isfinite(kept).tolist() == [True, True, False, False, False]
    assert torch.equal(keep_top_k(LOGITS, 10), LOGITS)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.softmax(LOGITS, dim=-1)
    assert probs[0] < 0.6 < probs[0] + probs[1]
    assert torch.isfinite(keep_top_p(LOGITS, 0.6)).tolist() == [True, True, False, False, False]
    assert torch.isfinite(keep_top_p(LOGITS, 0.01)).tolist() == [True, False, False, False, False]


def test_sampling_only_draws_from_what_top_k_and_top_p_keep() -> None:
    params = SamplingParams(max_tokens=1, temperature=2.0, top_k=3, top_p=0.99)
    drawn = {sample(LOGITS, params, generator(seed), None) for seed in range(200)}
    assert drawn <= {0, 1, 2} and len(drawn) > 1


def test_same_seed_same_draws_and_the_global_generator_is_untouched() -> None:
    params = SamplingParams(max_tokens=1, temperature=1.5)
    state = torch.get_rng_state()
    first = [sample(LOGITS, params, g, None) for g in [generator(7)] for _ in range(20)]
    second = [sample(LOGITS, params, g, None) for g in [generator(7)] for _ in range(20)]
    assert first == second
    assert torch.equal(torch.get_rng_state(), state)


EXTREMES = [
    {"temperature": 1e-38},  # logits / temperature overflowed float32: a NaN softmax
    {"temperature": 9.9e-6},  # below the greedy floor
    {"top_p": 1e-45},
    {"top_p": 7e-46},  # rounds to 0 in float32: every token was dropped
    {"top_p": 5e-324},  # the smallest positive double
    {"temperature": 1e-38, "top_p": 1e-45, "top_k": 3},
]


@pytest.mark.parametrize("extreme", EXTREMES, ids=str)
def test_extreme_but_valid_values_give_the_argmax(extreme: dict[str, float]) -> None:
    params = SamplingParams(max_tokens=1, **extreme)  # type: ignore[arg-type]
    assert [sample(LOGITS, params, generator(seed), None) for seed in range(20)] == [0] * 20


def test_top_p_always_keeps_the_most_likely_token() -> None:
    for top_p in (1e-45, 7e-46, 5e-324):
        assert torch.isfinite(keep_top_p(LOGITS, top_p)).tolist() == [True, False, False, False, False]


def test_the_greedy_floor_is_vllms() -> None:
    assert SamplingParams(max_tokens=1, temperature=9.99e-6).greedy
    assert not SamplingParams(max_tokens=1, temperature=1e-5).greedy


def test_huge_logits_cannot_overflow_the_temperature_division() -> None:
    logits = torch.tensor([3e36, 2e36, -3e38, 0.0])
    params = SamplingParams(max_tokens=1, temperature=1e-4, frequency_penalty=-2.0)
    counts = torch.tensor([0.0, 0.0, 0.0, 5.0])
    assert {sample(logits, params, generator(seed), counts) for seed in range(20)} <= {0, 1}


def test_a_masked_token_is_usable_but_nan_or_inf_is_not() -> None:
    rows = torch.tensor([[1.0, float("-inf"), 0.0], [1.0, float("nan"), 0.0],
                         [float("inf"), 0.0, 0.0], [float("-inf")] * 3])
    assert usable_rows(rows) == [True, False, False, False]


def test_one_reduction_gives_each_row_its_usability_and_argmax_first_on_a_tie() -> None:
    rows = torch.tensor([[1.0, 3.0, 3.0], [float("nan"), 5.0, 0.0], [-1.0, -2.0, -0.5]])
    usable, argmax = row_maxima(rows)
    assert usable == [True, False, True] and argmax[0] == 1 and argmax[2] == 2


def test_a_greedy_row_takes_the_batch_argmax_unless_something_steers_or_penalises_it() -> None:
    def first(params: SamplingParams, argmax: int) -> int | object:
        state = SequenceState.start(params, [1, 2], vocab_size=5, device=torch.device("cpu"))
        return accept(state, params, LOGITS, True, None, argmax)

    # the argmax handed in is taken as is: nothing recomputes it
    assert first(SamplingParams(max_tokens=1, temperature=0.0), 3) == 3
    # a bias, a penalty or a sampling temperature go through steer and sample on the logits
    assert first(SamplingParams(max_tokens=1, temperature=0.0, logit_bias=((2, 100.0),)), 0) == 2
    assert first(SamplingParams(max_tokens=1, temperature=0.0, presence_penalty=1.0), 3) == 0
    assert first(SamplingParams(max_tokens=1, temperature=0.0, repetition_penalty=1.5), 3) == 0


SEEDS = [0, 1, 2**32, 2**32 + 1, 2**63, 2**64 - 1]


def test_seeds_differing_anywhere_in_64_bits_draw_differently() -> None:
    """torch's CPU generator reads only a seed's low 32 bits: 0, 2**32 and 2**63 drew alike."""
    assert [SamplingParams(max_tokens=1, seed=seed).seed for seed in SEEDS] == SEEDS
    torch_seeds = [generator_seed(seed) for seed in SEEDS]
    assert len({s & 0xFFFFFFFF for s in torch_seeds}) == len(SEEDS)
    assert all(0 <= s < 2**64 for s in torch_seeds)
    streams = {tuple(torch.rand(4, generator=generator(s)).tolist()) for s in torch_seeds}
    assert len(streams) == len(SEEDS)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_outside_64_bits_is_refused_naming_seed(seed: int) -> None:
    with pytest.raises(InvalidRequest) as refused:
        SamplingParams(max_tokens=1, seed=seed)
    assert refused.value.param == "seed" and refused.value.status == 400
