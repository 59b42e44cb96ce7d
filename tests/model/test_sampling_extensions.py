"""min_p, repetition_penalty and min_tokens on hand-made logits, against direct references.

The references are transformers' own logits processors (what `generate` applies) and plain
torch written out here; an option left at its default must leave the logits untouched.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from llmd.engine.model.sampling import (
    SequenceState,
    accept,
    apply_repetition_penalty,
    keep_min_p,
    sample,
    steer,
)
from llmd.engine.types import SamplingParams

VOCAB = 64
PROMPT = [3, 5, 5, 17, 40]
END = frozenset({63})


def logits_row(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def state_for(params: SamplingParams, prompt: list[int] = PROMPT) -> SequenceState:
    return SequenceState.start(params, prompt, VOCAB, torch.device("cpu"), END)


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0, 10.0])
def test_repetition_penalty_equals_transformers_processor(penalty: float) -> None:
    logits, output = logits_row(1), [7, 40]
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[PROMPT + output] = True
    ours = apply_repetition_penalty(logits, seen, penalty)
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    theirs = processor(torch.tensor([PROMPT + output]), logits.unsqueeze(0))[0]
    torch.testing.assert_close(ours, theirs)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([2.0, -2.0, 0.0, 3.0])
    seen = torch.tensor([True, True, True, False])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [1.0, -4.0, 0.0, 3.0]


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 1.0])
def test_min_p_equals_transformers_warper(min_p: float) -> None:
    logits = logits_row(2)
    ours = keep_min_p(logits, min_p)
    no_ids = cast(torch.LongTensor, torch.zeros(1, 1, dtype=torch.long))  # the warper reads none
    theirs = MinPLogitsWarper(min_p)(no_ids, logits.unsqueeze(0))[0]
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(ours[torch.isfinite(ours)], logits[torch.isfinite(ours)])


def test_min_p_is_applied_after_temperature() -> None:
    logits = torch.tensor([2.0, 1.0, -3.0])
    params = SamplingParams(max_tokens=1, temperature=0.5, min_p=0.2)
    drawn = {sample(logits, params, torch.Generator().manual_seed(s), None) for s in range(300)}
    scaled = torch.softmax(logits / 0.5, dim=-1)
    assert drawn == {i for i in range(3) if scaled[i] >= 0.2 * scaled.max()} == {0}


def test_unused_options_leave_the_logits_untouched() -> None:
    params = SamplingParams(max_tokens=4)
    state = state_for(params)
    assert state.seen is None and state.held_back is None
    logits = logits_row(3)
    assert steer(state, params, logits) is logits  # the same tensor: no work at all


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    params = SamplingParams(max_tokens=5, temperature=0.0, min_tokens=2, stop_token_ids=(9,))
    state = state_for(params)
    logits = torch.zeros(VOCAB)
    logits[[9, 63]] = 10.0  # the stop id and EOS are the model's favourites
    tokens = [accept(state, params, logits, True, None) for _ in range(3)]
    assert tokens[0] not in (9, 63) and tokens[1] not in (9, 63) and tokens[2] in (9, 63)
    assert torch.isfinite(steer(state, params, logits)).all()


def test_repetition_penalty_tracks_prompt_and_output_tokens() -> None:
    params = SamplingParams(max_tokens=5, temperature=0.0, repetition_penalty=4.0)
    state = state_for(params, prompt=[1])
    logits = torch.zeros(VOCAB)
    logits[[1, 2, 3]] = torch.tensor([8.0, 7.0, 6.0])
    tokens = [accept(state, params, logits, True, None) for _ in range(4)]
    # 1 is in the prompt (8 / 4 = 2 < 7); 2 and 3 fall once picked; then all three are penalized
    # once, however often they appeared (a presence, not a count): 1 leads again.
    assert tokens == [2, 3, 1, 1]
    assert state.seen is not None and state.seen[[1, 2, 3]].all() and int(state.seen.sum()) == 3


def test_a_huge_repetition_penalty_stays_finite() -> None:
    logits = torch.tensor([1e30, -1e30, 0.0])
    penalized = apply_repetition_penalty(logits, torch.ones(3, dtype=torch.bool), 10.0)
    assert torch.isfinite(penalized).all()
