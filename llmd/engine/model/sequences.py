"""The running requests' sampling side: each one's `SequenceState`, and what a step gave beyond tokens.

The runner owns the model and the KV caches; this keeps, per request id, the state sampling
reads between steps, samples rows into tokens, and gathers into the step's `StepResult` the
logprobs a request asked for (its tokens', and a scored prompt's as its prefill goes).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch.profiler import record_function

from llmd.engine.model.sampling import Sampler, SequenceState, accept, row_maxima, score
from llmd.engine.types import RawScores, Request, Sampled, SamplingParams, StepResult

# The profiler range a step's sampling runs in: `scripts/profile_step.py` (llmd/bench/step_split.py)
# counts what runs inside it as sampling.
SAMPLING_RANGE = "llmd.sampling"


class Sequences:
    """Sampling states by request id, and the result of the step under way."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.result = StepResult([], [])
        self._states: dict[str, SequenceState] = {}
        self._prompt_scores: dict[str, list[RawScores | None]] = {}  # scored prefills under way

    def __len__(self) -> int:
        return len(self._states)

    def start_step(self) -> StepResult:
        """A fresh result for the step about to run (what ran outside a step is dropped)."""
        self.result = StepResult([], [])
        return self.result

    def begin(self, request: Request, logits: torch.Tensor, usable: bool, sampler: Sampler | None,
              end_ids: frozenset[int]) -> Sampled:
        """Sample a prefilled request's first token; its state is kept unless that failed."""
        state = SequenceState.start(request.params, request.prompt_ids, self.vocab_size, self.device, end_ids)
        token = self._accept(request.request_id, state, request.params, logits, usable, sampler)
        if isinstance(token, int):
            self._states[request.request_id] = state
        return token

    def inputs(self, rows: list[str]) -> tuple[list[int], list[int]]:
        """The batch rows' last tokens and positions: the next step's input."""
        states = [self._states[request_id] for request_id in rows]
        return [state.last_token for state in states], [state.position for state in states]

    def accept_rows(self, rows: list[str], requests: list[Request], logits: torch.Tensor,
                    sampler: Sampler | None) -> list[Sampled]:
        """Sample each batch row's next token; returned in `requests` order."""
        params = {request.request_id: request.params for request in requests}
        with sampling_range():
            usable, argmax = row_maxima(logits)
            tokens: dict[str, Sampled] = {}
            for row, request_id in enumerate(rows):
                state = self._states[request_id]
                state.position += 1
                tokens[request_id] = self._accept(request_id, state, params[request_id], logits[row],
                                                  usable[row], sampler, argmax[row])
        return [tokens[request.request_id] for request in requests]

    def _accept(self, request_id: str, state: SequenceState, params: SamplingParams, logits: torch.Tensor,
                usable: bool, sampler: Sampler | None, argmax: int | None = None) -> Sampled:
        """`accept`, and the token's logprobs kept in the step's result when the request asks."""
        token = accept(state, params, logits, usable, sampler, argmax)
        if params.logprobs is not None and isinstance(token, int):
            self.result.scores[request_id] = score(logits, token, params.logprobs)
        return token

    def prompt_scores(self, request_id: str) -> list[RawScores | None]:
        """A scored prompt's logprobs so far, to extend chunk by chunk (the first token's is None)."""
        return self._prompt_scores.setdefault(request_id, [None])

    def prompt_scored(self, request: Request, forked: list[Request]) -> None:
        """A scored prompt is prefilled: its logprobs go in the result, for it and each forked choice."""
        scores = self._prompt_scores.pop(request.request_id, None)
        if scores is not None:
            for owner in (request, *forked):
                self.result.prompt_scores[owner.request_id] = scores

    def drop(self, request_id: str) -> bool:
        """Forget a request's state; whether it had one (it was decoding)."""
        self._prompt_scores.pop(request_id, None)
        return self._states.pop(request_id, None) is not None


def sampling_range() -> AbstractContextManager[object]:
    """The `SAMPLING_RANGE` profiler range while a profiler records; nothing otherwise (a range
    costs 4.6 us per step unprofiled here, the check 0.2 us)."""
    if torch.autograd._profiler_enabled():
        return record_function(SAMPLING_RANGE)
    return contextlib.nullcontext()
