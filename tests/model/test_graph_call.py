"""Calling a compiled step's graph without dynamo: where each flat input comes from, and the proof."""

from __future__ import annotations

from typing import Any

import torch

from llmd.engine.model.graph_call import GraphCall, Seen, learn, proven


def step_tensors(window: int, rows: int = 1) -> list[torch.Tensor]:
    """Tokens, positions, then one layer's keys and values: windows of [rows, 2, 8, 4] caches."""
    caches = [torch.zeros(rows, 2, 8, 4) for _ in range(2)]
    return [torch.full((rows, 1), 3), torch.full((rows, 1), 5), *(cache[:, :, :window] for cache in caches)]


class Graph:
    """A stand-in for inductor's graph of a step over flat inputs (ids, window, buffer, stride,
    keys, values): writes each cache window's last column, returns (the window's keys, logits)."""

    def __init__(self, writes: bool = True) -> None:
        self.writes = writes
        self.calls: list[list[Any]] = []

    def __call__(self, flat: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(flat)
        ids, window, buffer, _stride, keys, values = flat
        if self.writes:
            keys[:, :, -1].fill_(float(ids) + window)
            values[:, :, -1].fill_(2.0 * window)
        return keys.clone(), buffer * window + ids


BUFFER = torch.arange(3.0)


def seen_at(graph: Graph, window: int, rows: int = 1) -> Seen:
    tensors = step_tensors(window, rows)
    flat = [tensors[0], window, BUFFER, 64, tensors[2], tensors[3]]
    return Seen.of(tensors, graph, flat)


def test_each_flat_input_is_told_as_a_step_tensor_the_window_or_a_constant() -> None:
    graph = Graph()
    learnt = learn(seen_at(graph, 2), seen_at(graph, 7))
    assert not isinstance(learnt, str)
    _, picks, constants = learnt
    # the step's tensors are 0-3, the window 4, the rows 5, then the constants in order of appearance
    assert picks == (0, 4, 6, 7, 2, 3) and constants[0] is BUFFER and constants[1] == 64
    # a batch's rows, told apart from the window and from a constant of the same value
    first, second = seen_at(graph, 2, rows=2), seen_at(graph, 7, rows=3)
    first.flat[3], second.flat[3] = 2, 3
    first.flat.append(2)
    second.flat.append(2)
    learnt = learn(first, second)
    assert not isinstance(learnt, str) and learnt[1] == (0, 4, 6, 5, 2, 3, 7)
    assert learnt[2] == (BUFFER, 2)
    # where the window and the rows move alike, an int that follows both cannot be told
    assert "may be the window or the rows" in str(learn(seen_at(graph, 2, rows=2), seen_at(graph, 7, rows=7)))


def test_inputs_that_follow_neither_the_window_nor_a_constant_leave_no_direct_call() -> None:
    graph = Graph()
    first, second = seen_at(graph, 2), seen_at(graph, 7)
    assert learn(first, seen_at(Graph(), 7)) == "the two calls ran different graphs"
    assert learn(first, seen_at(graph, 2)) == "the two calls had one window length"
    moving = Seen.of(second.tensors, graph, [*second.flat[:3], 65, *second.flat[4:]])
    assert "input 3 (64, then 65)" in str(learn(first, moving))
    fresh = Seen.of(second.tensors, graph, [*second.flat[:2], BUFFER.clone(), *second.flat[3:]])
    assert learn(first, fresh) == "the graph's input 2 is a tensor the step did not pass"


def test_a_proven_call_gives_dynamos_logits_and_writes_and_declines_other_layouts() -> None:
    graph = Graph()
    first, second = seen_at(graph, 2), seen_at(graph, 7)
    learnt = learn(first, second)
    assert not isinstance(learnt, str)
    # what dynamo's run of the second call gave: the logits, each cache's last column written
    _, logits = graph(second.flat)
    written = [cache[:, :, -1].clone() for cache in second.tensors[2:]]
    call = proven(learnt, second, logits, written)
    assert isinstance(call, GraphCall) and call.output == 1
    torch.testing.assert_close(call(step_tensors(5)), BUFFER * 5 + torch.tensor([[3]]), rtol=0, atol=0)
    other = step_tensors(5)
    assert call([*other[:2], other[2].double(), other[3]]) is None  # another dtype
    assert call([*other[:2], other[2].transpose(2, 3), other[3]]) is None  # other strides
    assert len(graph.calls) == 3  # dynamo's, the proof's, one call: nothing for the declined


def test_a_call_that_writes_nothing_or_other_logits_is_refused() -> None:
    lazy = Graph(writes=False)
    first, second = seen_at(lazy, 2), seen_at(lazy, 7)
    learnt = learn(first, second)
    assert not isinstance(learnt, str)
    _, logits = lazy(second.flat)
    written = [torch.full((1, 2, 4), 9.0), torch.full((1, 2, 4), 14.0)]  # what dynamo wrote
    assert "other keys or values" in str(proven(learnt, second, logits, written))
    assert "other logits" in str(proven(learnt, second, logits + 1, written))
