"""vLLM's DELTA outputs become llmd's events, one per token, through llmd's own finish rule
(a typed fake of vLLM's RequestOutput; no vLLM needed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from llmd.engine.detokenizer import OutputText
from llmd.engine.types import FinishReason, SamplingParams, TokenEvent
from llmd.engine.vllm.deltas import token_events

EOS = 1
LETTERS = {EOS: "", **{i: chr(ord("a") + i - 2) for i in range(2, 28)}}  # 2 -> "a", 3 -> "b", ...


class Letters:
    """A decoder: each id is one letter (EOS is empty)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(LETTERS[i] for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) - ord("a") + 2 for c in text]


@dataclass
class Completion:
    token_ids: Sequence[int]
    finish_reason: str | None = None


@dataclass
class Output:
    outputs: Sequence[Completion]
    finished: bool = False
    num_cached_tokens: int | None = None


async def stream(*deltas: Output) -> AsyncIterator[Output]:
    for delta in deltas:
        yield delta


def run(deltas: list[Output], params: SamplingParams) -> tuple[list[TokenEvent], int]:
    aborted = 0

    async def abort() -> None:
        nonlocal aborted
        aborted += 1

    async def collect() -> list[TokenEvent]:
        output = OutputText(Letters(), [2, 3], params.stop)
        events = token_events(stream(*deltas), output, params, frozenset({EOS}), abort)
        return [event async for event in events]

    return asyncio.run(collect()), aborted


def test_a_bunched_delta_still_makes_one_event_per_token_and_ends_at_vllms_eos() -> None:
    deltas = [Output([Completion(ids("hel"))], num_cached_tokens=16), Output([Completion(ids("lo"))]),
              Output([Completion([EOS], "stop")], finished=True)]
    events, aborted = run(deltas, SamplingParams(max_tokens=32))
    assert [e.text for e in events] == ["h", "e", "l", "l", "o", ""]
    assert [e.completion_tokens for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[0].cached_tokens == 16 and all(e.cached_tokens is None for e in events[1:])
    assert events[-1].finish_reason is FinishReason.STOP and aborted == 0


def test_a_stop_string_ends_the_reply_in_llmd_and_aborts_vllms_request() -> None:
    deltas = [Output([Completion(ids("abcx"))]), Output([Completion(ids("yz"))])]
    events, aborted = run(deltas, SamplingParams(max_tokens=32, stop=("cx",)))
    assert "".join(e.text for e in events) == "ab" and events[-1].finish_reason is FinishReason.STOP
    assert aborted == 1 and len(events) == 4  # the tokens after the stop are never read


def test_the_length_limit_is_llmds_and_an_end_without_the_id_flushes_what_was_held() -> None:
    length, _ = run([Output([Completion(ids("abcd"), "length")], finished=True)],
                    SamplingParams(max_tokens=4))
    assert length[-1].finish_reason is FinishReason.LENGTH and "".join(e.text for e in length) == "abcd"
    held, _ = run([Output([Completion(ids("abc"))]), Output([Completion([], "stop")], finished=True)],
                  SamplingParams(max_tokens=8, stop=("cd",)))  # "c" waits: it may start the stop string
    assert "".join(e.text for e in held) == "abc" and held[-1].finish_reason is FinishReason.STOP


def test_an_abort_by_vllm_or_a_stream_cut_short_ends_in_an_error() -> None:
    aborted, _ = run([Output([Completion(ids("ab"))]), Output([Completion([], "abort")], finished=True)],
                     SamplingParams(max_tokens=8))
    assert aborted[-1].error == "the vLLM engine ended the request (abort)"
    assert aborted[-1].finish_reason is None
    cut, _ = run([Output([Completion(ids("ab"))])], SamplingParams(max_tokens=8))
    assert cut[-1].error == "the vLLM engine's stream ended before the request did"
