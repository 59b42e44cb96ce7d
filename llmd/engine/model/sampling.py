"""Sampling: one token from one row of logits under a request's parameters, and its state.

Each decoding request keeps a `SequenceState` (its seeded generator, the counts its penalties
read, its last token and position) between steps; `accept` samples a row and advances it. A
row that cannot be sampled becomes a `RowFailure`: that request ends, the step's others go on.

The order, as vLLM's: `min_tokens` masks the ids that would end the request, `logit_bias` is
added, then `repetition_penalty`, presence and frequency penalties, then greedy argmax or temperature,
`min_p`, `top_k`, `top_p`. An option left at its default costs no tensor work: its state is
None and its step is skipped.

Logprobs (`score`, `score_rows`) are taken from the model's raw logits, before all of that.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass
from typing import Protocol

import torch

from llmd.engine.types import RawScores, RowFailure, Sampled, SamplingParams, TokenMatcher
from llmd.errors import EngineFailure

log = logging.getLogger("llmd.engine")

# Real logits are within a few hundred of zero. Clamped to this, penalties (at most 2 per
# generated token) and the division by the smallest non-greedy temperature (1e-5) stay far
# below float32's 3.4e38, so sampling arithmetic cannot overflow into inf or NaN.
LOGIT_BOUND = 1e30
UINT64 = (1 << 64) - 1


class Sampler(Protocol):
    """How the runner picks a token from one row of logits (`sample`, or a test's stand-in)."""

    def __call__(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                 token_counts: torch.Tensor | None) -> int: ...


@dataclass(slots=True)
class SequenceState:
    """The per-request sampling state the runner keeps between steps.

    `seen` marks every id in the prompt or output (for `repetition_penalty`); `held_back` holds
    the ids masked while fewer than `min_tokens` are generated (EOS and `stop_token_ids`).
    """

    generator: torch.Generator | None
    token_counts: torch.Tensor | None
    last_token: int
    position: int
    seen: torch.Tensor | None = None
    held_back: torch.Tensor | None = None
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # `logit_bias`: ids and their values
    grammar: Grammar | None = None  # a constrained request's matcher and its mask words
    generated: int = 0

    @classmethod
    def start(cls, params: SamplingParams, prompt_ids: list[int], vocab_size: int, device: torch.device,
              end_ids: frozenset[int] = frozenset()) -> SequenceState:
        """A request's state before its first token: seeded if it samples, counting if penalized.

        `end_ids`: the model's EOS ids, masked with `stop_token_ids` until `min_tokens`.
        """
        return cls(generator=new_generator(params, device),
                   token_counts=new_token_counts(params, vocab_size, device),
                   last_token=-1, position=len(prompt_ids),
                   seen=new_seen(params, prompt_ids, vocab_size, device),
                   held_back=new_held_back(params, end_ids, vocab_size, device),
                   bias=new_bias(params, device),
                   grammar=Grammar.start(params, vocab_size))


BITS = torch.arange(32, dtype=torch.int32)


@dataclass(slots=True)
class Grammar:
    """A constrained request's matcher, and the 32-bit words its masks are written into (CPU)."""

    matcher: TokenMatcher
    words: torch.Tensor

    @classmethod
    def start(cls, params: SamplingParams, vocab_size: int) -> Grammar | None:
        """The request's grammar state at its start; None when it is unconstrained."""
        if params.constraint is None:
            return None
        return cls(params.constraint.matcher(), torch.zeros((vocab_size + 31) // 32, dtype=torch.int32))

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The row with every token the grammar does not allow next at -inf."""
        self.matcher.unsafe_compute_mask_ptr(self.words.data_ptr(), self.words.numel() * 4)
        allowed = ((self.words.unsqueeze(-1) >> BITS) & 1).flatten()[: logits.shape[-1]].bool()
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


def new_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own generator, seeded from its seed or at random; None when greedy."""
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else secrets.randbits(64)
    return torch.Generator(device=device).manual_seed(generator_seed(seed))


def new_token_counts(params: SamplingParams, vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """Zeroed per-token counts for a penalized request's penalties; None when unpenalized."""
    if not params.penalized:
        return None
    return torch.zeros(vocab_size, dtype=torch.float32, device=device)


def new_seen(params: SamplingParams, prompt_ids: list[int], vocab_size: int,
             device: torch.device) -> torch.Tensor | None:
    """Which ids the prompt holds, for `repetition_penalty`; None when it is 1 (off)."""
    if not params.repeat_penalized:
        return None
    seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    ids = [token for token in prompt_ids if 0 <= token < vocab_size]
    seen[torch.tensor(ids, dtype=torch.long, device=device)] = True
    return seen


def new_held_back(params: SamplingParams, end_ids: frozenset[int], vocab_size: int,
                  device: torch.device) -> torch.Tensor | None:
    """The ids `min_tokens` masks (EOS and stop ids inside the vocabulary); None without it."""
    ids = sorted(i for i in end_ids | set(params.stop_token_ids) if 0 <= i < vocab_size)
    if params.min_tokens == 0 or not ids:
        return None
    return torch.tensor(ids, dtype=torch.long, device=device)


def new_bias(params: SamplingParams, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`logit_bias` as (ids, values) tensors, ready to add to a row; None without it.

    The ids are the client's, checked against the vocabulary at submission.
    """
    if not params.logit_bias:
        return None
    ids = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long, device=device)
    values = torch.tensor([value for _, value in params.logit_bias], dtype=torch.float32, device=device)
    return ids, values


def accept(state: SequenceState, params: SamplingParams, logits: torch.Tensor, usable: bool,
           sampler: Sampler | None, argmax: int | None = None) -> Sampled:
    """Sample one row and advance its state; a row that cannot be sampled fails alone.

    `sampler` None: `sample`, looked up when called. `argmax`: the row's argmax if already known
    (`row_maxima`), which is the token when nothing but greedy decoding decides it.
    """
    if not usable:
        return RowFailure("the model's logits for this request are not finite")
    try:
        if argmax is not None and sampler is None and params.greedy and state.token_counts is None \
                and not steers(state, params):
            token = argmax
        else:
            token = (sampler or sample)(steer(state, params, logits), params, state.generator,
                                        state.token_counts)
    except Exception as exc:  # one request's sampling must not end the step's other rows
        log.exception("sampling one request failed")
        return RowFailure(f"{type(exc).__name__} while sampling: {exc}")
    if state.grammar is not None and not state.grammar.matcher.consume_token(token):
        return RowFailure(f"the grammar refused the sampled token: {state.grammar.matcher.get_error()}")
    if state.token_counts is not None:
        state.token_counts[token] += 1
    if state.seen is not None:
        state.seen[token] = True
    state.last_token = token
    state.generated += 1
    return token


def steer(state: SequenceState, params: SamplingParams, logits: torch.Tensor) -> torch.Tensor:
    """The row with what is the request's own: `min_tokens`' mask, `logit_bias`, `repetition_penalty`,
    and a grammar's mask of the tokens it allows next.

    Returned as given (no tensor work) for a request that uses none of them.
    """
    if not steers(state, params):
        return logits
    logits = logits.float().clamp(-LOGIT_BOUND, LOGIT_BOUND)
    if state.held_back is not None and state.generated < params.min_tokens:
        logits = logits.index_fill(0, state.held_back, float("-inf"))
    if state.bias is not None:
        logits = logits.index_add(0, *state.bias)
    if state.seen is not None:
        logits = apply_repetition_penalty(logits, state.seen, params.repetition_penalty)
    if state.grammar is not None:  # last: what the grammar forbids stays forbidden
        logits = state.grammar.mask(logits)
    return logits


def steers(state: SequenceState, params: SamplingParams) -> bool:
    """Whether `steer` changes the row: a mask, bias, penalty or grammar of the request's own applies."""
    holding = state.held_back is not None and state.generated < params.min_tokens
    return holding or state.seen is not None or state.bias is not None or state.grammar is not None


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    token_counts: torch.Tensor | None,
) -> int:
    """Pick the next token from one row of (usable, see `usable_rows`) logits under `params`."""
    logits = logits.float().clamp(-LOGIT_BOUND, LOGIT_BOUND)
    if token_counts is not None:
        logits = apply_penalties(logits, token_counts, params)
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.min_p > 0.0:
        logits = keep_min_p(logits, params.min_p)
    if params.top_k > 0:
        logits = keep_top_k(logits, params.top_k)
    if params.top_p < 1.0:
        logits = keep_top_p(logits, params.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generator_seed(seed: int) -> int:
    """The torch seed for a request's seed in [0, 2**64): a bijection (splitmix64's output
    function) that carries every bit into the low 32, the only ones the CPU generator uses
    (mt19937: 0, 2**32 and 2**63 give one stream); CUDA's Philox uses all 64. Taken raw or
    reduced, seeds that differ only above bit 31 sampled the same tokens on the CPU."""
    z = (seed + 0x9E3779B97F4A7C15) & UINT64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & UINT64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & UINT64
    return z ^ (z >> 31)


def usable_rows(logits: torch.Tensor) -> list[bool]:
    """Per row of a (rows, vocab) tensor: can a token be sampled from it? (`row_maxima`)"""
    return row_maxima(logits)[0]


def row_maxima(logits: torch.Tensor) -> tuple[list[bool], list[int]]:
    """Per row of a (rows, vocab) tensor: can a token be sampled from it, and its argmax.

    Usable: no NaN, no +inf, and some finite logit (-inf is how a model masks a token out):
    exactly when the row's max is finite, as max propagates NaN. The argmax (the first, on a
    tie, as `torch.argmax`) is a greedy row's token (`accept`). One reduction for all rows (8 x
    32k on the CPU: 82 us, a sixth of their greedy argmaxes one by one; elementwise isfinite
    checks took 4 ms), where a greedy row alone took a cast, a clamp and an argmax of its own.
    """
    best, where = logits.max(dim=-1)
    return [math.isfinite(value) for value in best.tolist()], where.tolist()


def token_or_raise(token: Sampled) -> int:
    """The token, or the row's failure raised as an `EngineFailure`."""
    if isinstance(token, RowFailure):
        raise EngineFailure(f"generation failed: {token.message}")
    return token


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """OpenAI's presence and frequency penalties over the tokens generated so far."""
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF's and vLLM's repetition penalty over the ids in `seen`: positive logits divided by it,
    the others multiplied; clamped, so a large penalty cannot push a logit to -inf or NaN."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits).clamp(-LOGIT_BOUND, LOGIT_BOUND)


def keep_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Mask every token whose probability is below `min_p` times the likeliest token's."""
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Mask every logit below the k-th largest."""
    if k >= logits.numel():
        return logits
    threshold = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < threshold, float("-inf"))


def keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # A token is dropped when the tokens before it already reach top_p; the first always stays.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop_sorted[0] = False  # also when top_p rounds to 0 in float32 (below ~7e-46)
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def score(logits: torch.Tensor, token: int, top: int) -> RawScores:
    """`token`'s logprob in one row of raw logits and the row's `top` likeliest tokens."""
    return score_rows(logits.unsqueeze(0), [token], top)[0]


def score_rows(logits: torch.Tensor, tokens: list[int], top: int) -> list[RawScores]:
    """Per row of (rows, vocab) raw logits: its token's logprob (`log_softmax`, float32) and the
    `top` likeliest tokens, most likely first. One device sync for all rows."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(1)).squeeze(1).tolist()
    if top == 0:
        return [RawScores(token, value) for token, value in zip(tokens, chosen, strict=True)]
    values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]), dim=-1)
    rows = zip(tokens, chosen, ids.tolist(), values.tolist(), strict=True)
    return [
        RawScores(token, value, tuple(top_ids), tuple(top_values))
        for token, value, top_ids, top_values in rows
    ]
