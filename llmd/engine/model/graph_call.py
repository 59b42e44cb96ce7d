"""A compiled step's graph called as inductor built it: no dynamo frame, guards or AOT wrapper.

Calling a `torch.compile`d function goes through dynamo's frame (its cache lookup, the guards
`skip_guard_eval_unsafe` still evaluates, the bytecode that flattens the arguments) and
AOTAutograd's runtime wrapper before inductor's graph runs: on the small demo model (bfloat16,
2-core Xeon, in the runner) 0.2 ms of a 2.6 ms lone step, and the `set_stance` around it another
0.04 ms. After a graph has streamed the weights through the caches every Python op runs several
times slower than it does in a loop of its own, so the way in costs more than it would seem.

`GraphCall` calls the graph itself. It is learnt from two calls of the step through dynamo at two
window lengths (`CompiledStep.check`, at load): `watched` records what inductor's graph received
on each (the graph, and its flat inputs), and `learn` says where each flat input comes from: one
of the step's own tensors (found by identity), the window's length (an int equal to it both
times), or a constant (the same object, or an equal value, both times: a buffer, a stride dynamo
made a symbol). Anything else and there is no direct call. The step keeps one only when, on the
same inputs, it gives dynamo's logits and cache writes bit for bit. At run it checks each
tensor's dtype and strides against the recorded ones (a few us) and declines on any difference,
leaving the call to dynamo, whose guards then decide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Graph = Callable[[list[Any]], Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Seen:
    """One call of a step through dynamo: its own tensors (tokens, positions, each layer's keys
    and values, then a batch's mask), its window's length and rows, and what inductor's graph
    received."""

    tensors: list[torch.Tensor]
    window: int
    rows: int
    graph: Graph
    flat: list[Any]

    @classmethod
    def of(cls, tensors: list[torch.Tensor], graph: Graph, flat: list[Any]) -> Seen:
        return cls(tensors, tensors[2].shape[2], tensors[0].shape[0], graph, flat)


@dataclass(frozen=True, slots=True)
class GraphCall:
    """The graph, and per flat input where it comes from: an index into the step's tensors, then
    the window's length, the rows, then the constants."""

    graph: Graph
    picks: tuple[int, ...]
    constants: tuple[Any, ...]
    layouts: tuple[tuple[torch.dtype, tuple[int, ...]], ...]  # each step tensor's dtype and strides
    output: int  # which of the graph's outputs are the logits

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor | None:
        """The logits for the step's own tensors (as `Seen.tensors`; the window is the third
        dimension of the first layer's keys, the rows the tokens' first); None when a tensor is
        laid out otherwise than learnt (nothing ran)."""
        for tensor, (dtype, stride) in zip(tensors, self.layouts, strict=True):
            if tensor.dtype != dtype or tensor.stride() != stride:
                return None
        return self.graph(_flat(tensors, self.picks, self.constants))[self.output]


@contextlib.contextmanager
def watched() -> Iterator[list[tuple[Graph, list[Any]]]]:
    """Record every call of an inductor graph (`CompiledFxGraph`) made inside: the graph and a
    copy of its flat inputs."""
    from torch._inductor.output_code import CompiledFxGraph

    seen: list[tuple[Graph, list[Any]]] = []
    call = CompiledFxGraph.__call__

    def recording(graph: Any, inputs: list[Any]) -> Any:
        seen.append((graph, list(inputs)))
        return call(graph, inputs)

    CompiledFxGraph.__call__ = recording  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        CompiledFxGraph.__call__ = call  # type: ignore[method-assign]


def learn(first: Seen, second: Seen) -> tuple[Graph, tuple[int, ...], tuple[Any, ...]] | str:
    """Where each of the graph's flat inputs comes from, from two calls at different windows
    (and, for a step of more than one row count, different rows); a string says why it cannot
    be told."""
    if first.graph is not second.graph or len(first.flat) != len(second.flat):
        return "the two calls ran different graphs"
    if first.window == second.window:
        return "the two calls had one window length"
    window, rows, constant = len(first.tensors), len(first.tensors) + 1, len(first.tensors) + 2
    picks: list[int] = []
    constants: list[Any] = []
    for at, (a, b) in enumerate(zip(first.flat, second.flat, strict=True)):
        if isinstance(a, torch.Tensor):
            own = _index(first.tensors, a)
            if own is not None and own == _index(second.tensors, b):
                picks.append(own)
                continue
            if a is b:
                picks.append(constant + len(constants))
                constants.append(a)
                continue
            return f"the graph's input {at} is a tensor the step did not pass"
        follows = [isinstance(a, int) and (a, b) == (first.window, second.window),
                   isinstance(a, int) and (a, b) == (first.rows, second.rows)]
        if all(follows):
            return f"the graph's input {at} ({a!r}, then {b!r}) may be the window or the rows"
        if any(follows):
            picks.append(window if follows[0] else rows)
        elif type(a) is type(b) and a == b:
            picks.append(constant + len(constants))
            constants.append(a)
        else:
            return f"the graph's input {at} ({a!r}, then {b!r}) follows neither the window nor a constant"
    return first.graph, tuple(picks), tuple(constants)


def proven(learnt: tuple[Graph, tuple[int, ...], tuple[Any, ...]], seen: Seen, logits: torch.Tensor,
           written: list[torch.Tensor]) -> GraphCall | str:
    """The call, once it gives `logits` and writes `written` (each cache tensor's last column
    after dynamo's run) again from the same inputs, those columns changed first (so a call that
    writes nothing cannot pass); else why not. Leaves the columns as it wrote them."""
    graph, picks, constants = learnt
    caches = seen.tensors[2:][: len(written)]  # not a batch's mask
    for cache, column in zip(caches, written, strict=True):
        cache[:, :, -1].copy_(column + 1)
    outputs = graph(_flat(seen.tensors, picks, constants))
    matches = [at for at, out in enumerate(outputs)
               if isinstance(out, torch.Tensor) and out.shape == logits.shape and torch.equal(out, logits)]
    if not matches:
        return "the graph called directly gave other logits than through dynamo"
    if not all(torch.equal(cache[:, :, -1], column) for cache, column in zip(caches, written, strict=True)):
        return "the graph called directly wrote other keys or values than through dynamo"
    layouts = tuple((tensor.dtype, tuple(tensor.stride())) for tensor in seen.tensors)
    return GraphCall(graph, picks, constants, layouts, matches[0])


def _flat(tensors: list[torch.Tensor], picks: tuple[int, ...], constants: tuple[Any, ...]) -> list[Any]:
    """The graph's flat inputs: from the step's tensors, the window and rows they have (as
    `Seen.of` reads them), and the constants, as `picks` says."""
    sources = [*tensors, tensors[2].shape[2], tensors[0].shape[0], *constants]
    return [sources[pick] for pick in picks]


def _index(tensors: list[torch.Tensor], tensor: Any) -> int | None:
    return next((at for at, own in enumerate(tensors) if own is tensor), None)
