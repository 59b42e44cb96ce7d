"""Sampling on hand-made logits: penalties, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from llmd.engine.runner import apply_penalties, keep_top_k, keep_top_p, sample
from llmd.engine.types import SamplingParams

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
