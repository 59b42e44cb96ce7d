"""The decode batch of `kv_cache: static`: fixed slots and columns, so a compiled step never recompiles.

Keys and values live in transformers' `StaticCache`, allocated once per layer as
[slots, kv_heads, capacity, head_dim]. Every decode step writes one column, the same for every
slot: the layers' `cumulative_length`, mirrored here as `column`. A running request owns one slot
and its tokens sit there left-padded, ending just before that column; `mask` ([slots, capacity])
marks the columns each slot attends to. Compiled, the model always sees input_ids and
position_ids of [slots, 1] and a mask of [slots, capacity], whoever is running. Eager, it sees
a window of views instead: the slots up to the last one in use and the columns the longest
running request needs, so a step costs what the running requests need, not the capacity.

A request joins a free slot after its own (eager, any-length) prefill by copying its keys and
values in; it leaves by zeroing its mask row. A newcomer longer than the column moves everyone
right first; when the column reaches capacity, everyone moves left by the smallest left padding.
Free slots still run: they feed token 0 and attend at least to the column they write, so no
attention row is ever fully masked (softmax over nothing is NaN, and 0 x NaN in the value
product would leak it through the padding of whoever takes the slot next). Only running
requests' logits leave `step`, so nothing is sampled for a free slot.

Eager, `step_with_prefill` also takes newcomers' prompt chunks into the same forward pass (the
fused step): all tokens go through the model as one packed sequence and `fused_attention` keeps
attention per request. An eager step, decode-only or fused, of a model that `DirectDecoder` can
run (Llama-family layers, checked by the runner at load) goes through it instead of transformers'
forward, with its attention from `Window.attend` or `FusedLayout.attend` (attention.py); a
decode-only step goes through a compiled graph instead (lone_step.py) when the profile asks for
it and the graph passed its probe: `LoneStep` for one running request, `BatchStep` for more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer

from llmd.engine.model.attention import (
    DECODE_ATTENTION,
    FUSED_ATTENTION,
    FusedLayout,
    LayerTensors,
    PrefillInput,
    Segment,
    Window,
    attention_implementation,
)
from llmd.engine.model.layer_walk import DirectDecoder, import_inductor
from llmd.engine.model.lone_step import BatchStep, CompiledStep, LoneStep
from llmd.preflight.shape import attention_heads


class UnsupportedCache(ValueError):
    """The model has cache layers (sliding window, ...) that the static batch cannot hold."""


Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class StaticDecodeBatch:
    """Preallocated KV cache for `slots` requests of up to `capacity` tokens, one column per step."""

    def __init__(
        self, model: PreTrainedModel, slots: int, capacity: int, dtype: torch.dtype, compile_mode: str
    ) -> None:
        self.model = model
        self.slots = slots
        self.capacity = capacity
        self.compile_mode = compile_mode
        device = model.device
        with torch.inference_mode():  # like every tensor the model makes; edited only in inference mode
            self.cache = _allocate(model, slots, capacity, dtype)
        # The layers' own tensors, filled and moved in place only: compiled code holds their addresses.
        self.layers = [LayerTensors.of(layer) for layer in self.cache.layers]
        self._cache_layers: list[Any] = list(self.cache.layers)  # transformers' StaticLayers
        # plain tensors: `leave` zeroes a mask row outside inference mode
        self.mask = torch.zeros((slots, capacity), dtype=torch.bool, device=device)
        self.input_ids = torch.zeros((slots, 1), dtype=torch.long, device=device)
        self.position_ids = torch.zeros((slots, 1), dtype=torch.long, device=device)
        # On the CPU a step writes its inputs through numpy views of the same memory: building a
        # tensor of each list and copying it costs ~25 us a step once a graph has run (its weights
        # have pushed Python's own data out of the caches).
        self._host_inputs = ((self.input_ids.numpy(), self.position_ids.numpy())
                             if device.type == "cpu" else None)
        self.column = 0
        self.owners: list[str | None] = [None] * slots
        self.lengths = [0] * slots  # tokens in each slot's cache; 0 while free
        self.compile_seconds = 0.0
        self.compactions = 0
        # transformers' sdpa, with grouped-query heads packed even when compiled (`decode_attention`)
        self._attention = DECODE_ATTENTION if model.config._attn_implementation == "sdpa" else None
        self._step: Step = self._forward
        # Eager decode steps without transformers' module machinery, once the runner has
        # checked that it agrees with transformers' forward on this model (`compare_direct`).
        self.direct: DirectDecoder | None = None
        # A lone running request's eager step as one compiled graph, once proven (`probe_lone`).
        self.lone: LoneStep | None = None
        # Likewise the eager step of two or more rows (`probe_batch`).
        self.batched: BatchStep | None = None
        if compile_mode != "none":
            import_inductor()
            self._step = torch.compile(self._forward, mode=compile_mode, fullgraph=True, dynamic=False)

    @property
    def request_ids(self) -> list[str]:
        """The running requests, in slot order (the order `step` returns their logits in)."""
        return [owner for owner in self.owners if owner is not None]

    def join(self, request_id: str, cache: DynamicCache) -> None:
        """Copy a prefilled request's keys and values into a free slot, ending at the column."""
        length = cache.get_seq_length()
        if length >= self.capacity:
            raise ValueError(f"a {length}-token prompt leaves no room in a {self.capacity}-token cache")
        slot = self.owners.index(None)  # the scheduler runs at most `slots` requests
        if not self.request_ids:
            self._set_column(length)  # nothing to keep: start the columns afresh
        elif length > self.column:
            self._shift(length - self.column)
        start = self.column - length
        theirs: list[Any] = list(cache.layers)
        for mine, prefilled in zip(self.layers, theirs, strict=True):
            mine.keys[slot, :, start : self.column].copy_(prefilled.keys[0])
            mine.values[slot, :, start : self.column].copy_(prefilled.values[0])
        self.mask[slot].zero_()
        self.mask[slot, start : self.column] = True
        self.owners[slot], self.lengths[slot] = request_id, length

    def leave(self, request_id: str, *, scrub: bool = False) -> None:
        """Free the request's slot; its stale keys stay, masked, until the next owner's copy.

        `scrub` zeroes them instead, for a request that failed: masked columns get weight 0,
        but 0 * NaN is NaN, so a non-finite key or value left behind would poison the slot's
        next owner.
        """
        if request_id not in self.owners:
            return  # its join failed
        slot = self.owners.index(request_id)
        self.owners[slot], self.lengths[slot] = None, 0
        self.mask[slot].zero_()
        if scrub:
            self._zero_slot(slot)

    @torch.inference_mode()
    def _zero_slot(self, slot: int) -> None:
        for layer in self.layers:
            layer.keys[slot].zero_()
            layer.values[slot].zero_()

    def row_views(self, request_id: str) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """One request's keys and values without padding: views into the batch, valid until a step."""
        if request_id not in self.owners:
            return None
        slot = self.owners.index(request_id)
        start = self.column - self.lengths[slot]
        return [
            (layer.keys[slot : slot + 1, :, start : self.column],
             layer.values[slot : slot + 1, :, start : self.column])
            for layer in self.layers
        ]

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One token for every running request (in `request_ids` order); returns their logits."""
        slots, ids, where = self._slot_inputs(tokens, positions, self.slots)
        if self._host_inputs is not None:
            self._host_inputs[0][:, 0] = ids
            self._host_inputs[1][:, 0] = where
        else:
            self.input_ids.copy_(torch.tensor(ids).view(-1, 1))
            self.position_ids.copy_(torch.tensor(where).view(-1, 1))
        logits = self._run()
        for slot in slots:
            self.lengths[slot] += 1
        if slots and slots[-1] == len(slots) - 1 and self.compile_mode != "reduce-overhead":
            return logits[: len(slots), -1]  # the first slots: a view, not a gather (CUDA graphs
            # write their outputs again on the next replay, so theirs are gathered)
        return logits[slots, -1]

    @torch.inference_mode()
    def step_with_prefill(
        self, tokens: list[int], positions: list[int], chunks: list[PrefillInput]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`step` and the prefill of `chunks` in one forward pass (eager only).

        The decode rows and every chunk's tokens go through the model as one packed sequence,
        so each weight is read once for the whole step; attention stays per request (see
        `fused_attention`). Returns the running requests' logits, as `step` does, and each
        chunk's last-token logits. The chunks' caches grow by their tokens; joining the batch
        is the caller's move, as after a separate prefill.
        """
        assert self.compile_mode == "none", "the fused step runs eager"
        rows = self.rows
        slots, ids, where = self._slot_inputs(tokens, positions, rows)
        device = self.mask.device
        segments, offset = [], rows
        for chunk in chunks:
            ids += chunk.token_ids
            where += range(chunk.start, chunk.start + len(chunk.token_ids))
            segments.append(Segment.of(chunk, offset, device))
            offset += len(chunk.token_ids)
        self.mask[:, self.column] = True
        start = self.column - max(self.lengths)
        window = self.mask[:rows, start : self.column + 1]
        layout = FusedLayout(self.layers, self.column, rows, start, window[:, None, None, :], segments)
        keep = torch.tensor(slots + [s.offset + s.length - 1 for s in segments], device=device)
        input_ids, position_ids = torch.tensor([ids], device=device), torch.tensor([where], device=device)
        if self.direct is not None:
            logits = self.direct.forward(input_ids, position_ids, layout.attend, keep)[0]
        else:
            with attention_implementation(self.model.config, FUSED_ATTENTION):
                logits = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                                    logits_to_keep=keep, llmd_fused=layout).logits[0]
        self._set_column(self.column + 1)
        for slot in slots:
            self.lengths[slot] += 1
        return logits[: len(slots)], list(logits[len(slots) :])

    def _slot_inputs(
        self, tokens: list[int], positions: list[int], width: int
    ) -> tuple[list[int], list[int], list[int]]:
        """(running slots, token per slot, position per slot) for the first `width` slots, free
        ones fed token 0; compacts first when the column has reached capacity."""
        if self.column == self.capacity:
            self._compact()
        slots = [slot for slot, owner in enumerate(self.owners) if owner is not None]
        ids, where = [0] * width, [0] * width
        for slot, token, position in zip(slots, tokens, positions, strict=True):
            ids[slot], where[slot] = token, position
        return slots, ids, where

    @torch.inference_mode()
    def warm_up(self, steps: int = 3) -> float:
        """Compile (if asked) and run the step on free slots; returns the seconds it took.

        Three runs: the first compiles, CUDA graphs (`reduce-overhead`) record on a later one.
        """
        assert not self.request_ids, "warm up before serving"
        started = time.perf_counter()
        for _ in range(steps):
            self._run()
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        self.mask.zero_()
        self._set_column(0)
        self.compile_seconds = time.perf_counter() - started
        return self.compile_seconds

    @property
    def warm_up_rows(self) -> int:
        """Rows `warm_up` runs, for the thread count: every slot, as a compiled step does."""
        return self.slots

    @property
    def rows(self) -> int:
        """Slots the next step runs: all of them when compiled; up to the last one in use when eager."""
        if self.compile_mode != "none":
            return self.slots
        used = [slot for slot, owner in enumerate(self.owners) if owner is not None]
        return used[-1] + 1 if used else 1

    def _run(self) -> torch.Tensor:
        """The forward pass at the column; moves the column on by one.

        Compiled, it runs every slot over the whole capacity (fixed shapes). Eager, it runs
        a window: the slots up to the last one in use, and the columns from the longest
        running request's first token to the column. Attention over columns nobody uses is
        not free: on the small demo model a batch-8 step took 10 ms at 256 columns and 29 ms
        at 4096.
        """
        self.mask[:, self.column] = True
        if self.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        ids, positions, mask = self.input_ids, self.position_ids, self.mask
        windowed = self.compile_mode == "none"
        if windowed:
            rows, start = self.rows, self.column - max(self.lengths)
            if self.direct is not None:
                return self._run_direct(self.direct, rows, start)
            ids, positions, mask = ids[:rows], positions[:rows], mask[:rows, start : self.column + 1]
            self._open_window(rows, start)
        try:
            with attention_implementation(self.model.config, self._attention):
                logits = self._step(ids, positions, mask)
        except BaseException:
            if windowed:
                self._close_window()
            self._set_column(self.column)  # layers that ran have moved on; put them back
            raise
        if windowed:
            self._close_window()
            self._set_column(self.column + 1)  # the layers counted from the window's start
        else:
            self.column += 1  # the compiled step moved the layers' own column
        return logits

    def _run_direct(self, direct: DirectDecoder, rows: int, start: int) -> torch.Tensor:
        """The eager step through `DirectDecoder`: the same window, no transformers forward.

        The mask is left out when every row attends to the whole window, as transformers does
        (decided from the lengths, on the host). The layers' own column is not kept up to date
        here: `_open_window` sets it whenever transformers' forward runs on the batch.
        """
        logits = self._run_compiled(rows, start)
        if logits is None:
            padded = any(self.lengths[slot] != self.column - start for slot in range(rows))
            mask = self.mask[:rows, None, None, start : self.column + 1] if padded else None
            window = Window(self.layers, self.column, rows, start, mask)
            logits = direct.forward(self.input_ids[:rows], self.position_ids[:rows], window.attend)
        self.column += 1
        return logits

    def _run_compiled(self, rows: int, start: int) -> torch.Tensor | None:
        """The first `rows` slots' step through the compiled `LoneStep` (one row) or `BatchStep`
        over columns [start, column]; None: not run (none proven, or a shape it does not take)."""
        step = self.lone if rows == 1 else self.batched
        if step is None:
            return None
        end = self.column + 1
        keys = [_window(layer.keys, rows, start, end) for layer in self.layers]
        values = [_window(layer.values, rows, start, end) for layer in self.layers]
        mask = None if rows == 1 else self.mask[:rows, start:end]  # a lone row attends to all of it
        return step.run(keys, values, self.input_ids[:rows], self.position_ids[:rows], mask)

    @torch.inference_mode()
    def compare_direct(
        self, direct: DirectDecoder, tokens: list[int], positions: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step at the same column through transformers' forward, then through `direct`:
        both sets of logits. Both write the same keys and values; the batch ends one step on."""
        saved = self.direct, self.lone, self.batched
        try:
            self.direct = self.lone = self.batched = None
            expected = self._step_again(tokens, positions)
            self.direct = direct
            return expected, self.step(tokens, positions)
        finally:
            self.direct, self.lone, self.batched = saved

    @torch.inference_mode()
    def compare_compiled(self, step: CompiledStep, tokens: list[int], positions: list[int]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the running requests through the eager direct walk, then through `step`
        (a `LoneStep` for one running request in slot 0, a `BatchStep` for more): both logits.
        The batch ends one step on."""
        assert self.direct is not None and self.request_ids
        saved = self.lone, self.batched
        try:
            self.lone = self.batched = None
            expected = self._step_again(tokens, positions)
            if isinstance(step, LoneStep):
                self.lone = step
            else:
                assert isinstance(step, BatchStep)
                self.batched = step
            return expected, self.step(tokens, positions)
        finally:
            self.lone, self.batched = saved

    def _step_again(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """`step`'s logits, with the column and lengths put back as they were: the next step
        writes the same column again."""
        column, lengths = self.column, list(self.lengths)
        logits = self.step(tokens, positions)
        self._set_column(column)
        self.lengths = lengths
        return logits

    def _open_window(self, rows: int, start: int) -> None:
        """Point transformers' cache layers at views of rows [0, rows), columns [start, column]."""
        for tensors, layer in zip(self.layers, self._cache_layers, strict=True):
            layer.keys = tensors.keys[:rows, :, start : self.column + 1]
            layer.values = tensors.values[:rows, :, start : self.column + 1]
            layer.max_cache_len = self.column + 1 - start
            tensors.column.fill_(self.column - start)

    def _close_window(self) -> None:
        """Back to the whole tensors."""
        for tensors, layer in zip(self.layers, self._cache_layers, strict=True):
            layer.keys, layer.values, layer.max_cache_len = tensors.keys, tensors.values, self.capacity

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor
                 ) -> torch.Tensor:
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                         cache=self.cache, use_cache=True)
        return out.logits  # type: ignore[no-any-return]

    def _compact(self) -> None:
        """Move every slot left by the smallest left padding among running requests."""
        longest = max(self.lengths)
        if longest >= self.capacity:
            raise RuntimeError(f"a request outgrew the {self.capacity}-token KV cache")
        self._shift(longest - self.column)
        self.compactions += 1

    def _shift(self, delta: int) -> None:
        """Move every slot's columns [0, column) by `delta` (right if positive), in place."""
        keep = self.column if delta > 0 else self.column + delta
        source, target = (0, delta) if delta > 0 else (-delta, 0)
        for layer in self.layers:
            for tensor in (layer.keys, layer.values):
                _move_columns(tensor, 2, source, target, keep)
        _move_columns(self.mask, 1, source, target, keep)
        if delta > 0:
            self.mask[:, :delta] = False  # what moved right leaves no one attending to the gap
        self._set_column(self.column + delta)

    def _set_column(self, column: int) -> None:
        self.column = column
        for layer in self.layers:
            layer.column.fill_(column)


def _window(tensor: torch.Tensor, rows: int, start: int, end: int) -> torch.Tensor:
    """`tensor[:rows, :, start:end]` of a cache tensor [slots, heads, columns, dim] in one call (a
    third of the time of slicing it, 16 views a step on the small demo model)."""
    shape = tensor.shape
    return tensor.as_strided((rows, shape[1], end - start, shape[3]), tensor.stride(),
                             tensor.storage_offset() + start * tensor.stride(2))


def _move_columns(tensor: torch.Tensor, dim: int, source: int, target: int, width: int) -> None:
    """Copy `width` columns of `tensor` from `source` to `target` along `dim` (ranges may overlap)."""
    if width > 0:
        tensor.narrow(dim, target, width).copy_(tensor.narrow(dim, source, width).clone())


def _allocate(model: PreTrainedModel, slots: int, capacity: int, dtype: torch.dtype) -> StaticCache:
    """A StaticCache of full-attention layers, allocated now (not lazily at the first step)."""
    config: Any = model.config.get_text_config(decoder=True)
    cache = StaticCache(config=config, max_cache_len=capacity)
    odd = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not StaticLayer})
    if odd:
        raise UnsupportedCache(f"kv_cache: static handles full-attention layers only, this model "
                               f"also has {', '.join(odd)}; use kv_cache: dynamic")
    _, kv_heads, head_dim = attention_heads(config)
    cache.early_initialization(slots, kv_heads, head_dim, dtype, model.device)
    return cache
