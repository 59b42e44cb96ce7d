"""The only code that runs the model: load, prefill, one decode step, and the engine's step.

Called from exactly one thread (the worker). Each running request keeps its own KV cache
(in the decode batch) and sampling state (`SequenceState`) here, keyed by request id, until
`release`. The batch, the prefix cache, sampling and the fast paths' probes are their own
modules; the runner sequences them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from llmd.config import Profile
from llmd.engine.model.abandon import AbandonedPrefills
from llmd.engine.model.attention import PrefillInput
from llmd.engine.model.batch import DecodeBatch
from llmd.engine.model.dynamic_batch import DynamicDecodeBatch
from llmd.engine.model.loader import DTYPES, generation_eos_ids, load_model, model_context_limit
from llmd.engine.model.prefill import prefill_chunk, prefill_padded, prefill_scored
from llmd.engine.model.prefix_cache import PrefixCache
from llmd.engine.model.probes import prove_fast_paths
from llmd.engine.model.request_cache import Layers, new_cache, shared_cache
from llmd.engine.model.sampling import Sampler, token_or_raise, usable_rows
from llmd.engine.model.sequences import Sequences
from llmd.engine.model.static_batch import StaticDecodeBatch, UnsupportedCache
from llmd.engine.model.threads import IntraOpThreads, ThreadPlan
from llmd.engine.types import Request, Sampled, StepResult

log = logging.getLogger("llmd.engine")


class ModelRunner(AbandonedPrefills):
    """Owns the model; turns prompts and previous tokens into next tokens (and keeps what an
    aborted prefill computed: `AbandonedPrefills`)."""

    def __init__(self, model_dir: str | Path, profile: Profile, sampler: Sampler | None = None) -> None:
        self.sampler = sampler  # None: `sample`, looked up when called
        self.threads = ThreadPlan.for_profile(profile)
        self._use_threads = IntraOpThreads(self.threads).use_for
        self.profile = profile
        self.device = torch.device(profile.device)
        self.model, self.load_report = load_model(model_dir, profile)
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos_token_ids = generation_eos_ids(self.model)
        self.context_limit = model_context_limit(self.model, profile)
        self.sequences = Sequences(self.vocab_size, self.device)
        self._batch: DecodeBatch = open_batch(self.model, profile, self.context_limit)
        self._prefilling: dict[str, DynamicCache] = {}
        self.prefix_cache = PrefixCache(profile.prefix_cache_tokens, profile.prefix_min_match)
        fast = prove_fast_paths(self, self._batch, self.model, profile)
        self.fast_paths = fast  # what proved itself at load, and why the rest did not
        self._fused = fast.fused_batch  # decode and prefill in one forward pass (`step`)
        self.prefix_cache = PrefixCache(profile.prefix_cache_tokens, profile.prefix_min_match)

    @property
    def batch(self) -> DecodeBatch:
        """The running requests' decode batch (for inspection; the runner alone edits it)."""
        return self._batch

    @property
    def fused(self) -> bool:
        """Whether a step's decode rows and prompt chunks share one forward pass."""
        return self._fused is not None

    @torch.inference_mode()
    def prefill(self, request: Request, upto: int | None = None) -> Sampled | None:
        """Run prompt tokens [request.prefilled, upto) into the request's own KV cache.

        `upto` defaults to the whole prompt. The chunk that completes the prompt samples
        the first new token, moves the cache into the decode batch and returns the token
        (or why there is none); an earlier chunk returns None.
        """
        stop = len(request.prompt_ids) if upto is None else upto
        cache, top = self._own_cache(request), request.params.prompt_logprobs
        self._use_threads(stop - request.prefilled)
        if top is None:
            last = prefill_chunk(self.model, cache, request.prompt_ids, request.prefilled, stop)
        else:  # its logprobs asked: every position's logits, the first token's None
            last, scores = prefill_scored(self.model, cache, request.prompt_ids, request.prefilled, stop, top)
            self.sequences.prompt_scores(request.request_id).extend(scores)
        request.prefilled = stop
        if not request.prefill_done:
            return None
        del self._prefilling[request.request_id]
        return self._start_decoding(request, cache, last)

    def prefill_many(self, chunks: list[tuple[Request, int]]) -> list[Sampled | None]:
        """Prefill several requests' chunks; returns each one's first token or None.

        Whole prompts with nothing cached yet go through the model together, left-padded into
        one batch: a burst of newcomers costs one forward pass instead of one each. Anything
        else (a split prompt, a reused prefix) runs on its own.
        """
        fresh = [r for r, stop in chunks
                 if r.prefilled == 0 and stop == len(r.prompt_ids) and r.params.prompt_logprobs is None]
        together = self._prefill_together(fresh) if len(fresh) > 1 else {}
        return [
            together[request.request_id] if request.request_id in together else self.prefill(request, stop)
            for request, stop in chunks
        ]

    @torch.inference_mode()
    def _prefill_together(self, requests: list[Request]) -> dict[str, Sampled]:
        prompts = [request.prompt_ids for request in requests]
        self._use_threads(sum(len(prompt) for prompt in prompts))
        burst = prefill_padded(self.model, self.device, prompts)
        tokens: dict[str, Sampled] = {}
        for row, request in enumerate(requests):
            own, logits = burst.row(row, len(request.prompt_ids))
            self._prefilling.pop(request.request_id, None)
            request.prefilled = len(request.prompt_ids)
            tokens[request.request_id] = self._start_decoding(request, own, logits)
        return tokens

    def _start_decoding(self, request: Request, cache: DynamicCache, logits: torch.Tensor) -> Sampled:
        """A fully prefilled request: sample token one, then remember its prompt and join the batch.

        A request whose first token fails does neither: its cache may hold what broke its logits.
        Its followers (more choices of the prompt) are forked from the same cache and logits.
        """
        usable = usable_rows(logits.unsqueeze(0))[0]
        token = self._begin(request, cache, logits, usable)
        forked = list(request.followers) if isinstance(token, int) else []
        if isinstance(token, int):
            self.prefix_cache.store(request.prompt_ids, cache)
            for follower in forked:
                follower.prefilled = len(follower.prompt_ids)
                twin = shared_cache(self.model.config, cache)
                self.sequences.result.forked.append((follower, self._begin(follower, twin, logits, usable)))
        self.sequences.prompt_scored(request, forked)
        return token

    def _begin(self, request: Request, cache: DynamicCache, logits: torch.Tensor, usable: bool) -> Sampled:
        """Sample a prefilled request's first token; it joins the batch unless that failed."""
        token = self.sequences.begin(request, logits, usable, self.sampler, self.eos_token_ids)
        if isinstance(token, int):
            self._batch.join(request.request_id, cache)
        return token

    def reuse_prefix(self, request: Request) -> DynamicCache:
        """Start the request's cache, seeded with the longest cached prefix of its prompt.

        Moves `request.prefilled` past the reused tokens; the worker calls this on admission,
        before the scheduler plans the request's prefill chunks.
        """
        if request.request_id not in self._prefilling:
            cache = self._own_cache(request)
            if request.params.prompt_logprobs is None:  # a scored prompt computes every position
                request.prefilled = request.cached_tokens = self.prefix_cache.seed(request.prompt_ids, cache)
        return self._prefilling[request.request_id]

    def _own_cache(self, request: Request) -> DynamicCache:
        """The request's prefill cache; a new empty one when `reuse_prefix` did not start one."""
        cache = self._prefilling.get(request.request_id)
        if cache is None:
            cache = self._prefilling[request.request_id] = new_cache(self.model.config)
        return cache

    def first_token(self, request: Request) -> int:
        """Prefill the whole (rest of the) prompt at once and return the first new token.

        Raises `EngineFailure` when it cannot be sampled (outside the worker's step, where a
        failed row is not isolated from anything).
        """
        token = self.prefill(request)
        assert token is not None
        return token_or_raise(token)

    def step(self, decode: list[Request], chunks: list[tuple[Request, int]]) -> StepResult:
        """One engine step: a token for each of `decode`, then the prefill of `chunks`.

        The result holds `decode`'s tokens and, per chunk, the first token or None (as
        `prefill_many`), with followers forked and logprobs asked; a row whose token could not be
        sampled gives a `RowFailure` and the others are unaffected. A scored prompt (its logprobs
        asked) is prefilled on its own, after the rest.
        With `fused`, both halves go through the model as one pass: a step that prefilled a
        64-token chunk next to 7 decoding streams cost 25-27 ms as two passes on the small demo
        model, most of it the fixed cost of a pass (a 1-token prefill alone takes 8 ms).
        """
        result = self.sequences.start_step()
        plain = [chunk for chunk in chunks if chunk[0].params.prompt_logprobs is None]
        if self._fused is None or not (decode and plain):
            result.tokens, firsts = self._decode(decode), self.prefill_many(plain)
        else:
            result.tokens, firsts = self._fused_step(self._fused, decode, plain)
        done = dict(zip((request.request_id for request, _ in plain), firsts, strict=True))
        result.firsts = [done.get(request.request_id) if request.request_id in done
                         else self.prefill(request, stop) for request, stop in chunks]
        return result

    @torch.inference_mode()
    def _fused_step(
        self, batch: StaticDecodeBatch, requests: list[Request], chunks: list[tuple[Request, int]]
    ) -> tuple[list[Sampled], list[Sampled | None]]:
        rows = self._running(requests)
        inputs = [PrefillInput(request.prompt_ids[request.prefilled : stop], request.prefilled,
                               self._own_cache(request)) for request, stop in chunks]
        self._use_threads(batch.rows + sum(len(chunk.token_ids) for chunk in inputs))
        logits, chunk_logits = batch.step_with_prefill(*self.sequences.inputs(rows), inputs)
        tokens = self.sequences.accept_rows(rows, requests, logits, self.sampler)
        firsts: list[Sampled | None] = []
        for (request, stop), last in zip(chunks, chunk_logits, strict=True):
            request.prefilled = stop
            if not request.prefill_done:
                firsts.append(None)
                continue
            cache = self._prefilling.pop(request.request_id)
            firsts.append(self._start_decoding(request, cache, last))
        return tokens, firsts

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
        rows = self._running(requests)
        self._use_threads(self._batch.rows)  # compiled: every slot, so one thread count per graph
        logits = self._batch.step(*self.sequences.inputs(rows))
        return self.sequences.accept_rows(rows, requests, logits, self.sampler)

    def _running(self, requests: list[Request]) -> list[str]:
        """The batch's rows; `requests` must be exactly the running set."""
        rows = self._batch.request_ids
        assert sorted(r.request_id for r in requests) == sorted(rows), "decode set != running batch"
        return rows

    def warm_up_decode(self) -> float:
        """Compile and run the static decode step before serving; its seconds (0 when dynamic)."""
        if self._batch.warm_up_rows:
            self._use_threads(self._batch.warm_up_rows)
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

    def kv_tensors(self, request_id: str) -> Layers:
        """A decoding request's keys and values per layer, without padding ([] if it is not decoding).

        Views into the running batch, valid until the next step: for inspection (`llmd check`).
        """
        return self._batch.row_views(request_id) or []

    def release(self, request_id: str, *, failed: bool = False) -> None:
        """Free the KV cache and sampling state of a finished, aborted or `failed` request.

        A failed request's keys and values may be non-finite: its slot is zeroed, not left stale.
        """
        self._prefilling.pop(request_id, None)
        if self.sequences.drop(request_id):
            self._batch.leave(request_id, scrub=failed)

    @property
    def active_sequences(self) -> int:
        """How many requests hold a KV cache right now (decoding or mid-prefill)."""
        return len(self.sequences) + len(self._prefilling)

    def gpu_memory(self) -> tuple[int, int] | None:
        """(reserved, total) bytes of the CUDA allocator; host-side counters, no device sync."""
        if self.device.type != "cuda":
            return None
        total = torch.cuda.get_device_properties(self.device).total_memory
        return torch.cuda.memory_reserved(self.device), total


def out_of_memory(exc: BaseException) -> bool:
    """Whether a failed step ran out of device memory."""
    return isinstance(exc, torch.OutOfMemoryError)


def open_batch(model: PreTrainedModel, profile: Profile, capacity: int) -> DecodeBatch:
    """The profile's decode batch; an eager static cache falls back to the dynamic one when the
    model has layers it cannot hold (only compile needs it, and compile refuses)."""
    device = torch.device(profile.device)
    if profile.kv_cache == "dynamic":
        return DynamicDecodeBatch(model, device)
    try:
        return StaticDecodeBatch(model, profile.max_running, capacity, DTYPES[profile.dtype], profile.compile)
    except UnsupportedCache as exc:
        if profile.compile != "none":
            raise
        log.warning("%s; decoding with the dynamic cache instead", exc)
        return DynamicDecodeBatch(model, device)
