"""The only code that runs the model: load, prefill, one decode step, sampling.

Called from exactly one thread (the worker). Each running request keeps its own KV
cache and sampling state here, keyed by request id, until `release`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.utils import logging as hf_logging

from llmd.config import Profile
from llmd.engine.types import Request, SamplingParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class SequenceState:
    """The per-request tensors the runner keeps between steps."""

    cache: DynamicCache
    generator: torch.Generator | None
    token_counts: torch.Tensor | None
    last_token: int
    position: int


class ModelRunner:
    """Owns the model; turns prompts and previous tokens into next tokens."""

    def __init__(self, model_dir: str | Path, profile: Profile) -> None:
        self.threads = ThreadPlan.for_profile(profile)
        if self.threads is not None:
            torch.set_num_threads(self.threads.decode)
        self.profile = profile
        self.device = torch.device(profile.device)
        self.model = load_model(model_dir, profile)
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.eos_token_ids = generation_eos_ids(self.model)
        self._sequences: dict[str, SequenceState] = {}

    @torch.inference_mode()
    def prefill(self, request: Request) -> int:
        """Run the whole prompt, keep its KV cache, and sample the first new token."""
        ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)
        with prefill_threads(self.threads):
            logits = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits
        state = SequenceState(
            cache=cache,
            generator=self._generator(request.params),
            token_counts=self._token_counts(request.params),
            last_token=-1,
            position=len(request.prompt_ids),
        )
        self._sequences[request.request_id] = state
        return self._accept(state, request.params, logits[0, -1])

    @torch.inference_mode()
    def decode(self, requests: list[Request]) -> list[int]:
        """One decode step for each request; returns one new token id per request."""
        return [self._decode_one(request) for request in requests]

    def release(self, request_id: str) -> None:
        """Free the KV cache and sampling state of a finished or aborted request."""
        self._sequences.pop(request_id, None)

    @property
    def active_sequences(self) -> int:
        """How many requests hold a KV cache right now."""
        return len(self._sequences)

    def _decode_one(self, request: Request) -> int:
        state = self._sequences[request.request_id]
        ids = torch.tensor([[state.last_token]], dtype=torch.long, device=self.device)
        positions = torch.tensor([[state.position]], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, position_ids=positions, cache=state.cache, use_cache=True)
        state.position += 1
        return self._accept(state, request.params, out.logits[0, -1])

    def _accept(self, state: SequenceState, params: SamplingParams, logits: torch.Tensor) -> int:
        token = sample(logits, params, state.generator, state.token_counts)
        if state.token_counts is not None:
            state.token_counts[token] += 1
        state.last_token = token
        return token

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        return torch.Generator(device=self.device).manual_seed(seed % (1 << 63))

    def _token_counts(self, params: SamplingParams) -> torch.Tensor | None:
        if not params.penalized:
            return None
        return torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """Intra-op threads for CPU inference, decode and prefill apart.

    Decode leaves one physical core to the event loop and the clients: a thread team that
    fills every core stalls at its barrier whenever the HTTP side runs, and one thread
    decodes a small model as fast as two (measured on 2 cores, see the bench notes).
    Prefill is compute-bound and nothing streams during it for a lone request, so it
    takes every core: 75 ms vs 34-57 ms for a 76-token prompt on the small demo model.
    """

    decode: int
    prefill: int

    @classmethod
    def for_profile(cls, profile: Profile) -> ThreadPlan | None:
        """None off the CPU; the profile's `torch_threads` pins both numbers when set."""
        if profile.device != "cpu":
            return None
        if profile.torch_threads:
            return cls(profile.torch_threads, profile.torch_threads)
        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        return cls(decode=max(1, cores - 1), prefill=cores)


@contextlib.contextmanager
def prefill_threads(plan: ThreadPlan | None) -> Iterator[None]:
    """Run the enclosed prefill on the plan's prefill threads, then go back to decode's."""
    if plan is None or plan.prefill == plan.decode:
        yield
        return
    torch.set_num_threads(plan.prefill)
    try:
        yield
    finally:
        torch.set_num_threads(plan.decode)


def load_model(model_dir: str | Path, profile: Profile) -> PreTrainedModel:
    """Load the weights onto the profile's device in its dtype, ready for inference."""
    hf_logging.disable_progress_bar()  # a progress bar per load is noise in a service log
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        dtype=DTYPES[profile.dtype],
        attn_implementation=profile.attn_implementation,
    )
    model.to(torch.device(profile.device))  # type: ignore[arg-type]
    model.eval()
    return model


def generation_eos_ids(model: PreTrainedModel) -> frozenset[int]:
    """The end-of-sequence ids the model's generation config declares (int or list)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, list) else [eos])


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    token_counts: torch.Tensor | None,
) -> int:
    """Pick the next token from one row of logits under `params`."""
    logits = logits.float()
    if token_counts is not None:
        logits = apply_penalties(logits, token_counts, params)
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k > 0:
        logits = keep_top_k(logits, params.top_k)
    if params.top_p < 1.0:
        logits = keep_top_p(logits, params.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """OpenAI's presence and frequency penalties over the tokens generated so far."""
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)


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
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class _TokenClock:
    """A `generate` streamer that only timestamps each new token (no text, no thread)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ids: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.ids.extend(int(v) for v in value.reshape(-1))

    def end(self) -> None:
        pass


@torch.inference_mode()
def measure_generate(
    model: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int
) -> tuple[float, list[float], list[int]]:
    """Greedy `model.generate` with a per-token timestamp: (start, token times, token ids)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
    clock = _TokenClock()
    start = time.perf_counter()
    model.generate(  # type: ignore[operator]
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens, streamer=clock, pad_token_id=min(generation_eos_ids(model), default=0),
    )
    return start, clock.times, clock.ids
