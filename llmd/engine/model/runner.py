"""The only code that runs the model: load, prefill, one decode step, sampling.

Called from exactly one thread (the worker). Each running request keeps its own KV
cache and sampling state here, keyed by request id, until `release`.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch
from transformers import DynamicCache, PreTrainedModel

from llmd.config import Profile
from llmd.engine.model import layer_walk as direct
from llmd.engine.model.loader import DTYPES, load_model, logits_differ
from llmd.engine.model.static_batch import PrefillInput, StaticDecodeBatch, UnsupportedCache
from llmd.engine.types import Request, SamplingParams
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


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A row of a step that gave no token, and why: its request ends, the step's others go on."""

    message: str


Sampled = int | RowFailure  # one row's outcome of a step


@dataclass(slots=True)
class SequenceState:
    """The per-request sampling state the runner keeps between steps."""

    generator: torch.Generator | None
    token_counts: torch.Tensor | None
    last_token: int
    position: int


class DecodeBatch:
    """The running requests' KV caches stacked along the batch dimension, left-padded.

    Every row ends at the same column, so one forward pass appends one token to all of
    them; `mask` marks real tokens (1) and left padding (0). A request joins after its own
    prefill and leaves by dropping its row; columns that are padding in every row go too.
    """

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None

    def join(self, request_id: str, cache: DynamicCache) -> None:
        """Add a prefilled request's cache as the last row."""
        length = cache.get_seq_length()
        mask = torch.ones((1, length), dtype=torch.long, device=_layers(cache)[0].keys.device)
        if self.cache is None or self.mask is None:
            self.cache, self.mask = cache, mask
        else:
            width = max(length, self.mask.shape[1])
            for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
                mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
                mine.values = torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)])
            self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
            sync_lengths(self.cache)
        self.request_ids.append(request_id)

    def leave(self, request_id: str, *, scrub: bool = False) -> None:
        """Drop a request's row and any column left as padding in every row (`scrub`: nothing
        of the row stays behind anyway)."""
        row = self.request_ids.index(request_id)
        del self.request_ids[row]
        if not self.request_ids:
            self.cache = self.mask = None
            return
        assert self.cache is not None and self.mask is not None
        keep = [i for i in range(self.mask.shape[0]) if i != row]
        self.mask = self.mask[keep]
        first = int(self.mask.any(dim=0).nonzero()[0])
        self.mask = self.mask[:, first:]
        for layer in _layers(self.cache):
            layer.keys = layer.keys[keep, :, first:]
            layer.values = layer.values[keep, :, first:]
        sync_lengths(self.cache)

    def row_views(self, request_id: str) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """One row's keys and values without its padding: views into the batch, valid until a step."""
        if request_id not in self.request_ids or self.cache is None or self.mask is None:
            return None
        row = self.request_ids.index(request_id)
        start = int(self.mask[row].nonzero()[0])
        return [
            (layer.keys[row : row + 1, :, start:], layer.values[row : row + 1, :, start:])
            for layer in _layers(self.cache)
        ]

    def step_mask(self) -> torch.Tensor | None:
        """The attention mask for the next token: None while no row is padded."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        return self.mask if len(self.request_ids) > 1 and not bool(self.mask.all()) else None


def _layers(cache: DynamicCache) -> list[Any]:
    """The cache's per-layer key/value holders (plain DynamicLayers for full attention)."""
    return list(cache.layers)


def _fill(cache: DynamicCache, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Make an empty cache hold these per-layer keys and values (the tensors themselves)."""
    for layer, (keys, values) in zip(_layers(cache), layers, strict=True):
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    sync_lengths(cache)


def new_cache(config: Any) -> DynamicCache:
    """An empty per-request cache whose sliding-window layers keep every token.

    transformers' sliding-window layers drop keys older than the window as they go. The
    decode batch pads, stacks and trims caches by columns, and the prefix cache stores whole
    prompts, so every layer must hold the same columns: these layers record the whole past
    and still give attention only the window (and the mask sizes say so).
    """
    cache = DynamicCache(config=config)
    for layer in _layers(cache):
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()
    return cache


def sync_lengths(cache: DynamicCache) -> None:
    """Tell sliding-window layers how many columns they hold after we edited their tensors."""
    for layer in _layers(cache):
        if hasattr(layer, "cumulative_length") and getattr(layer, "is_initialized", False):
            layer.cumulative_length = int(layer.keys.shape[-2])


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad dimension 2 (cache) or 1 (mask) on the left up to `width`."""
    dim = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


@dataclass(slots=True)
class PrefixEntry:
    """A finished prompt's token ids and its per-layer keys and values (batch of one)."""

    token_ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class PrefixCache:
    """Recent prompts' KV caches, so a request sharing a prefix skips recomputing it.

    Bounded by a total token count, least recently used first out. The stored tensors are
    the ones the prompt's prefill produced; DynamicCache replaces (never edits) its tensors
    as it grows, so keeping references costs no copy.
    """

    def __init__(self, max_tokens: int, min_match: int) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def store(self, token_ids: list[int], cache: DynamicCache) -> None:
        """Remember a completed prompt's cache, evicting the oldest beyond the budget."""
        self.store_layers(token_ids, [(layer.keys, layer.values) for layer in _layers(cache)])

    def store_layers(self, token_ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Remember per-layer keys and values covering `token_ids`."""
        if self.max_tokens < len(token_ids) or layers[0][0].shape[2] != len(token_ids):
            return
        key = tuple(token_ids)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = PrefixEntry(list(token_ids), layers)
        self._tokens += len(token_ids)
        while self._tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self._tokens -= len(evicted.token_ids)

    def seed(self, prompt_ids: list[int], cache: DynamicCache) -> int:
        """Fill `cache` with the longest stored prefix of `prompt_ids`; returns its length.

        At least the prompt's last token is always left to compute, for its logits.
        """
        best, length = None, 0
        for entry in self._entries.values():
            shared = shared_prefix_length(entry.token_ids, prompt_ids)
            if shared > length:
                best, length = entry, shared
        length = min(length, len(prompt_ids) - 1)
        if best is None or length < self.min_match:
            return 0
        self._entries.move_to_end(tuple(best.token_ids))
        _fill(cache, [(keys[:, :, :length], values[:, :, :length]) for keys, values in best.layers])
        self.hits += 1
        self.reused_tokens += length
        return length


def shared_prefix_length(first: list[int], second: list[int]) -> int:
    """How many leading token ids the two lists have in common."""
    pairs = enumerate(zip(first, second, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(first), len(second)))


class ModelRunner:
    """Owns the model; turns prompts and previous tokens into next tokens."""

    def __init__(self, model_dir: str | Path, profile: Profile, sampler: Sampler | None = None) -> None:
        self.sampler = sampler  # None: `sample`, looked up when called
        self.threads = ThreadPlan.for_profile(profile)
        self._threads_in_use = 0
        self.profile = profile
        self.device = torch.device(profile.device)
        self.model, self.load_report = load_model(model_dir, profile)
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos_token_ids = generation_eos_ids(self.model)
        self.context_limit = context_limit(self.model, profile)
        self._sequences: dict[str, SequenceState] = {}
        self._batch = self._decode_batch(profile)
        self._prefilling: dict[str, DynamicCache] = {}
        self.prefix_cache = PrefixCache(profile.prefix_cache_tokens, profile.prefix_min_match)
        # Why decode steps run through transformers' forward; None: through DirectDecoder.
        self.direct_problem: str | None = "it needs kv_cache: static, compile: none and SDPA attention"
        self.fused = False  # decode and prefill in one forward pass (`step`)
        if self._fusable():
            self.direct_problem = self._probe_direct()
            if self.direct_problem is not None and direct.unsupported_reason(self.model) is None:
                log.warning("decode steps run through transformers' forward: the direct step "
                            "failed its probe (%s)", self.direct_problem)
            problem = self._probe_fused()  # through DirectDecoder when that passed
            self.fused = problem is None
            if problem is not None:
                log.warning("decode and prefill run as separate passes: the fused step failed its "
                            "probe (%s)", problem)
            self.prefix_cache = PrefixCache(profile.prefix_cache_tokens, profile.prefix_min_match)

    def _decode_batch(self, profile: Profile) -> DecodeBatch | StaticDecodeBatch:
        """The profile's decode batch; an eager static cache falls back to the dynamic one when
        the model has layers it cannot hold (only compile needs it, and compile refuses)."""
        if profile.kv_cache == "dynamic":
            return DecodeBatch()
        try:
            return StaticDecodeBatch(self.model, profile.max_running, self.context_limit,
                                     DTYPES[profile.dtype], profile.compile)
        except UnsupportedCache as exc:
            if profile.compile != "none":
                raise
            log.warning("%s; decoding with the dynamic cache instead", exc)
            return DecodeBatch()

    @torch.inference_mode()
    def prefill(self, request: Request, upto: int | None = None) -> Sampled | None:
        """Run prompt tokens [request.prefilled, upto) into the request's own KV cache.

        `upto` defaults to the whole prompt. The chunk that completes the prompt samples
        the first new token, moves the cache into the decode batch and returns the token
        (or why there is none); an earlier chunk returns None.
        """
        stop = len(request.prompt_ids) if upto is None else upto
        cache = self._prefilling.get(request.request_id)
        if cache is None:  # no reuse_prefix() first: compute the whole prompt
            cache = self._prefilling[request.request_id] = new_cache(self.model.config)
        chunk = request.prompt_ids[request.prefilled : stop]
        ids = torch.tensor([chunk], dtype=torch.long, device=self.device)
        positions = torch.arange(request.prefilled, stop, device=self.device).unsqueeze(0)
        self._use_threads(stop - request.prefilled)
        out = self.model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        request.prefilled = stop
        if not request.prefill_done:
            return None
        del self._prefilling[request.request_id]
        return self._start_decoding(request, cache, out.logits[0, -1])

    def prefill_many(self, chunks: list[tuple[Request, int]]) -> list[Sampled | None]:
        """Prefill several requests' chunks; returns each one's first token or None.

        Whole prompts with nothing cached yet go through the model together, left-padded into
        one batch: a burst of newcomers costs one forward pass instead of one each. Anything
        else (a split prompt, a reused prefix) runs on its own.
        """
        fresh = [
            request for request, stop in chunks
            if request.prefilled == 0 and stop == len(request.prompt_ids)
        ]
        together = self._prefill_together(fresh) if len(fresh) > 1 else {}
        return [
            together[request.request_id] if request.request_id in together else self.prefill(request, stop)
            for request, stop in chunks
        ]

    @torch.inference_mode()
    def _prefill_together(self, requests: list[Request]) -> dict[str, Sampled]:
        width = max(len(request.prompt_ids) for request in requests)
        ids = torch.zeros((len(requests), width), dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        positions = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            length = len(request.prompt_ids)
            ids[row, width - length :] = torch.tensor(request.prompt_ids)
            mask[row, width - length :] = 1
            positions[row, width - length :] = torch.arange(length)
        cache = new_cache(self.model.config)
        self._use_threads(int(mask.sum()))
        out = self.model(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device), cache=cache, use_cache=True, logits_to_keep=1,
        )
        tokens: dict[str, Sampled] = {}
        for row, request in enumerate(requests):
            start = width - len(request.prompt_ids)
            own = new_cache(self.model.config)
            # copies: a view would keep the whole padded batch alive in the prefix cache
            rows = (slice(row, row + 1), slice(None), slice(start, None))
            _fill(own, [(layer.keys[rows].clone(), layer.values[rows].clone()) for layer in _layers(cache)])
            self._prefilling.pop(request.request_id, None)
            request.prefilled = len(request.prompt_ids)
            tokens[request.request_id] = self._start_decoding(request, own, out.logits[row, -1])
        return tokens

    def _start_decoding(self, request: Request, cache: DynamicCache, logits: torch.Tensor) -> Sampled:
        """A fully prefilled request: sample token one, then remember its prompt and join the batch.

        A request whose first token fails does neither: its cache may hold what broke its logits.
        """
        state = SequenceState(
            generator=self._generator(request.params),
            token_counts=self._token_counts(request.params),
            last_token=-1,
            position=len(request.prompt_ids),
        )
        token = self._accept(state, request.params, logits, usable_rows(logits.unsqueeze(0))[0])
        if isinstance(token, int):
            self.prefix_cache.store(request.prompt_ids, cache)
            self._sequences[request.request_id] = state
            self._batch.join(request.request_id, cache)
        return token

    def reuse_prefix(self, request: Request) -> DynamicCache:
        """Start the request's cache, seeded with the longest cached prefix of its prompt.

        Moves `request.prefilled` past the reused tokens; the worker calls this on admission,
        before the scheduler plans the request's prefill chunks.
        """
        cache = self._prefilling.get(request.request_id)
        if cache is None:
            cache = self._prefilling[request.request_id] = new_cache(self.model.config)
            request.prefilled = self.prefix_cache.seed(request.prompt_ids, cache)
        return cache

    def first_token(self, request: Request) -> int:
        """Prefill the whole (rest of the) prompt at once and return the first new token.

        Raises `EngineFailure` when it cannot be sampled (outside the worker's step, where a
        failed row is not isolated from anything).
        """
        token = self.prefill(request)
        assert token is not None
        return token_or_raise(token)

    def step(
        self, decode: list[Request], chunks: list[tuple[Request, int]]
    ) -> tuple[list[Sampled], list[Sampled | None]]:
        """One engine step: a token for each of `decode`, then the prefill of `chunks`.

        Returns `decode`'s tokens and, per chunk, the first token or None (as `prefill_many`);
        a row whose token could not be sampled gives a `RowFailure` and the others are unaffected.
        With `fused`, both halves go through the model as one pass: a step that prefilled a
        64-token chunk next to 7 decoding streams cost 25-27 ms as two passes on the small demo
        model, most of it the fixed cost of a pass (a 1-token prefill alone takes 8 ms).
        """
        if not (self.fused and decode and chunks):
            return self._decode(decode), self.prefill_many(chunks)
        return self._fused_step(decode, chunks)

    @torch.inference_mode()
    def _fused_step(
        self, requests: list[Request], chunks: list[tuple[Request, int]]
    ) -> tuple[list[Sampled], list[Sampled | None]]:
        batch = self._batch
        assert isinstance(batch, StaticDecodeBatch)
        rows = batch.request_ids
        assert sorted(r.request_id for r in requests) == sorted(rows), "decode set != running batch"
        states = [self._sequences[request_id] for request_id in rows]
        inputs = []
        for request, stop in chunks:
            cache = self._prefilling.get(request.request_id)
            if cache is None:
                cache = self._prefilling[request.request_id] = new_cache(self.model.config)
            chunk = request.prompt_ids[request.prefilled : stop]
            inputs.append(PrefillInput(chunk, request.prefilled, cache))
        self._use_threads(batch.rows + sum(len(chunk.token_ids) for chunk in inputs))
        logits, chunk_logits = batch.step_with_prefill(
            [s.last_token for s in states], [s.position for s in states], inputs
        )
        tokens = self._accept_rows(rows, states, requests, logits)
        firsts: list[Sampled | None] = []
        for (request, stop), last in zip(chunks, chunk_logits, strict=True):
            request.prefilled = stop
            if not request.prefill_done:
                firsts.append(None)
                continue
            cache = self._prefilling.pop(request.request_id)
            firsts.append(self._start_decoding(request, cache, last))
        return tokens, firsts

    def _fusable(self) -> bool:
        """An eager static batch and SDPA attention: what the fused step is written for."""
        return (isinstance(self._batch, StaticDecodeBatch) and self.profile.compile == "none"
                and self.model.config._attn_implementation == "sdpa")

    def _probe_fused(self) -> str | None:
        """Run one fused step on probe prompts against plain forward passes; None when they agree."""
        vocab = self.vocab_size
        first = Request("probe-decoding", [(3 + i) % vocab for i in range(6)], SamplingParams(max_tokens=4))
        other = Request("probe-joining", [(11 + 2 * i) % vocab for i in range(5)],
                        SamplingParams(max_tokens=4))
        try:
            token = self.first_token(first)
            assert isinstance(self._batch, StaticDecodeBatch)
            fresh = new_cache(self.model.config)
            decoded, joined = self._batch.step_with_prefill(
                [token], [len(first.prompt_ids)], [PrefillInput(other.prompt_ids, 0, fresh)]
            )
            with torch.inference_mode():
                expected = [
                    self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0, -1]
                    for ids in ([*first.prompt_ids, token], other.prompt_ids)
                ]
            problems = [logits_differ(want.float(), got.float()) for want, got in
                        zip(expected, [decoded[0], joined[0]], strict=True)]
            return next((problem for problem in problems if problem is not None), None)
        except Exception as exc:  # a model whose attention needs more than the fused step does
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.release(first.request_id)

    def _probe_direct(self) -> str | None:
        """Switch the static batch's decode steps to `DirectDecoder` if it gives the logits
        transformers' forward gives, alone and beside a shorter request; else why not."""
        try:
            decoder = direct.DirectDecoder(self.model)
        except ValueError as exc:
            return str(exc)
        batch = self._batch
        assert isinstance(batch, StaticDecodeBatch)
        vocab = self.vocab_size
        probes = [Request(f"probe-direct-{n}", [(5 + 3 * i + n) % vocab for i in range(9 - 4 * n)],
                          SamplingParams(max_tokens=4)) for n in range(2)]
        try:
            problem = None
            for probe in probes:  # the first alone, then beside the second, shorter one: a padded row
                self.first_token(probe)
                problem = problem or self._compare_direct(batch, decoder)
        except Exception as exc:  # a model whose layers need more than the direct step does
            problem = f"{type(exc).__name__}: {exc}"
        finally:
            for probe in probes:
                self.release(probe.request_id)
        if problem is None:
            batch.direct = decoder
        return problem

    def _compare_direct(self, batch: StaticDecodeBatch, decoder: direct.DirectDecoder) -> str | None:
        """One step of the running requests both ways; None when the logits agree."""
        states = [self._sequences[request_id] for request_id in batch.request_ids]
        expected, got = batch.compare_direct(decoder, [s.last_token for s in states],
                                             [s.position for s in states])
        for state in states:
            state.position += 1
        return logits_differ(expected.float(), got.float())

    def decode(self, requests: list[Request]) -> list[int]:
        """One batched forward pass over every prefilled request: one new token each.

        `requests` must be exactly the requests prefilled earlier and not yet released.
        Raises `EngineFailure` when a row's token cannot be sampled (`step` isolates it instead).
        """
        return [token_or_raise(token) for token in self._decode(requests)]

    @torch.inference_mode()
    def _decode(self, requests: list[Request]) -> list[Sampled]:
        if not requests:
            return []
        rows = self._batch.request_ids
        assert sorted(r.request_id for r in requests) == sorted(rows), "decode set != running batch"
        states = [self._sequences[request_id] for request_id in rows]
        if isinstance(self._batch, StaticDecodeBatch):
            self._use_threads(self._batch.rows)  # compiled: every slot, so one thread count per graph
            logits = self._batch.step([s.last_token for s in states], [s.position for s in states])
        else:
            logits = self._dynamic_step(self._batch, states)
        return self._accept_rows(rows, states, requests, logits)

    def _accept_rows(
        self, rows: list[str], states: list[SequenceState], requests: list[Request], logits: torch.Tensor
    ) -> list[Sampled]:
        """Sample each batch row's next token; returned in `requests` order."""
        by_id = {request.request_id: request for request in requests}
        usable = usable_rows(logits)
        tokens: dict[str, Sampled] = {}
        for row, (request_id, state) in enumerate(zip(rows, states, strict=True)):
            state.position += 1
            tokens[request_id] = self._accept(state, by_id[request_id].params, logits[row], usable[row])
        return [tokens[request.request_id] for request in requests]

    def _dynamic_step(self, batch: DecodeBatch, states: list[SequenceState]) -> torch.Tensor:
        """One forward pass over the growing, left-padded batch; the next-token logits per row."""
        ids = torch.tensor([[s.last_token] for s in states], dtype=torch.long, device=self.device)
        positions = torch.tensor([[s.position] for s in states], dtype=torch.long, device=self.device)
        mask = batch.step_mask()
        self._use_threads(len(states))
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                         cache=batch.cache, use_cache=True)
        return out.logits[:, -1]  # type: ignore[no-any-return]

    def warm_up_decode(self) -> float:
        """Compile and run the static decode step before serving; its seconds (0 when dynamic)."""
        if not isinstance(self._batch, StaticDecodeBatch):
            return 0.0
        self._use_threads(self._batch.slots)
        return self._batch.warm_up()

    def retire(self, request: Request) -> None:
        """Release a finished request, keeping its whole exchange for prefix reuse.

        A chat that grows by a turn re-sends this prompt plus the reply: the cache holds
        every token but the last sampled one, which was never fed back.
        """
        views = self._batch.row_views(request.request_id)
        if views is not None:  # copied: the batch's tensors move on with the next step
            layers = [(keys.clone(), values.clone()) for keys, values in views]
            self.prefix_cache.store_layers(request.prompt_ids + request.output_ids[:-1], layers)
        self.release(request.request_id)

    def kv_tensors(self, request_id: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A decoding request's keys and values per layer, without padding ([] if it is not decoding).

        Views into the running batch, valid until the next step: for inspection (`llmd check`).
        """
        return self._batch.row_views(request_id) or []

    def release(self, request_id: str, *, failed: bool = False) -> None:
        """Free the KV cache and sampling state of a finished, aborted or `failed` request.

        A failed request's keys and values may be non-finite: its slot is zeroed, not left stale.
        """
        self._prefilling.pop(request_id, None)
        if self._sequences.pop(request_id, None) is not None:
            self._batch.leave(request_id, scrub=failed)

    @property
    def active_sequences(self) -> int:
        """How many requests hold a KV cache right now (decoding or mid-prefill)."""
        return len(self._sequences) + len(self._prefilling)

    def _use_threads(self, rows: int) -> None:
        """Switch torch's intra-op thread count for a pass over `rows` positions."""
        wanted = self.threads.for_rows(rows) if self.threads is not None else 0
        if wanted and wanted != self._threads_in_use:
            torch.set_num_threads(wanted)
            self._threads_in_use = wanted

    def _accept(self, state: SequenceState, params: SamplingParams, logits: torch.Tensor,
                usable: bool) -> Sampled:
        """Sample one row and advance its state; a row that cannot be sampled fails alone."""
        if not usable:
            return RowFailure("the model's logits for this request are not finite")
        try:
            token = (self.sampler or sample)(logits, params, state.generator, state.token_counts)
        except Exception as exc:  # one request's sampling must not end the step's other rows
            log.exception("sampling one request failed")
            return RowFailure(f"{type(exc).__name__} while sampling: {exc}")
        if state.token_counts is not None:
            state.token_counts[token] += 1
        state.last_token = token
        return token

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        return torch.Generator(device=self.device).manual_seed(generator_seed(seed))

    def _token_counts(self, params: SamplingParams) -> torch.Tensor | None:
        if not params.penalized:
            return None
        return torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """Intra-op threads for CPU inference: one stream's decode apart from everything else.

    With plain nn.Linear a lone stream's decode leaves one physical core to the event loop
    and the client: a thread team that fills every core stalls at its barrier whenever the
    HTTP side runs, and one thread decodes one row of a small model as fast as two (C=1
    over HTTP 0.96-0.98x of in-process with one thread, 0.89x with two). With `onednn_linear`
    two threads do a one-row GEMM twice as fast as one, which outweighs the stalls: C=1 over
    HTTP 98 tok/s on every core against 69 on one (small demo model, float32, 2 cores), so
    then every core decodes. Prefill and batched decode are compute-bound and always take
    every core (C=8 over HTTP 257 tok/s with two threads for the batch, 209 with one).
    """

    lone_decode: int
    compute: int

    @classmethod
    def for_profile(cls, profile: Profile) -> ThreadPlan | None:
        """None off the CPU; the profile's `torch_threads` pins both numbers when set."""
        if profile.device != "cpu":
            return None
        if profile.torch_threads:
            return cls(profile.torch_threads, profile.torch_threads)
        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        lone = cores if profile.onednn_linear else max(1, cores - 1)
        return cls(lone_decode=lone, compute=cores)

    def for_rows(self, rows: int) -> int:
        """Threads for a forward pass over `rows` new positions (a prompt, or a batch)."""
        return self.lone_decode if rows == 1 else self.compute


def context_limit(model: PreTrainedModel, profile: Profile) -> int:
    """The profile's max context, capped by the model's position limit."""
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    return min(profile.max_context, int(limit or profile.max_context))


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
    """Pick the next token from one row of (usable, see `usable_rows`) logits under `params`."""
    logits = logits.float().clamp(-LOGIT_BOUND, LOGIT_BOUND)
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
    """Per row of a (rows, vocab) tensor: can a token be sampled from it? No NaN, no +inf, and
    some finite logit (-inf is how a model masks a token out): exactly when the row's max is
    finite, as max propagates NaN. One reduction and one device sync for all rows (8 x 32k on
    the CPU: 82 us, a sixth of their greedy argmaxes; elementwise isfinite checks took 4 ms)."""
    return [bool(ok) for ok in torch.isfinite(logits.amax(dim=-1)).tolist()]


def token_or_raise(token: Sampled) -> int:
    """The token, or the row's failure raised as an `EngineFailure`."""
    if isinstance(token, RowFailure):
        raise EngineFailure(f"generation failed: {token.message}")
    return token


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
    drop_sorted[0] = False  # also when top_p rounds to 0 in float32 (below ~7e-46)
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class _TokenClock:
    """A `generate` streamer that only timestamps each step's new tokens (no text, no thread)."""

    def __init__(self, rows: int) -> None:
        self.times: list[float] = []
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        for row, token in zip(self.ids, value.reshape(-1).tolist(), strict=True):
            row.append(int(token))

    def end(self) -> None:
        pass


@torch.inference_mode()
def measure_generate(
    model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int
) -> tuple[float, list[float], list[list[int]]]:
    """Greedy batched `model.generate`, left-padded: (start, step times, token ids per row)."""
    pad = min(generation_eos_ids(model), default=0)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    clock = _TokenClock(len(prompts))
    start = time.perf_counter()
    model.generate(  # type: ignore[operator]
        ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens, streamer=clock, pad_token_id=pad,
    )
    return start, clock.times, clock.ids
