"""vLLM's DELTA outputs become llmd's events, one per token, through llmd's own finish rule
(a typed fake of vLLM's RequestOutput; no vLLM needed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llmd.engine.detokenizer import OutputText
from llmd.engine.types import FinishReason, SamplingParams, TokenEvent
from llmd.engine.vllm.deltas import token_events
from tests.helpers.fake_vllm import EOS, FakeCompletion, FakeOutput, FakeTokenizer, ids, output


async def stream(*deltas: FakeOutput) -> AsyncIterator[FakeOutput]:
    for delta in deltas:
        yield delta


def run(deltas: list[FakeOutput], params: SamplingParams) -> tuple[list[TokenEvent], int]:
    aborted = 0

    async def abort() -> None:
        nonlocal aborted
        aborted += 1

    async def collect() -> list[TokenEvent]:
        text = OutputText(FakeTokenizer(), [2, 3], params.stop)
        events = token_events(stream(*deltas), text, params, frozenset({EOS}), abort)
        return [event async for event in events]

    return asyncio.run(collect()), aborted


def test_a_bunched_delta_still_makes_one_event_per_token_and_ends_at_vllms_eos() -> None:
    deltas = [output("hel", cached=16), output("lo"), output("", "stop", eos=True)]
    events, aborted = run(deltas, SamplingParams(max_tokens=32))
    assert [e.text for e in events] == ["h", "e", "l", "l", "o", ""]
    assert [e.completion_tokens for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[0].cached_tokens == 16 and all(e.cached_tokens is None for e in events[1:])
    assert events[-1].finish_reason is FinishReason.STOP and aborted == 0


def test_a_stop_string_ends_the_reply_in_llmd_and_aborts_vllms_request() -> None:
    deltas = [FakeOutput([FakeCompletion(ids("abcx"))]), FakeOutput([FakeCompletion(ids("yz"))])]
    events, aborted = run(deltas, SamplingParams(max_tokens=32, stop=("cx",)))
    assert "".join(e.text for e in events) == "ab" and events[-1].finish_reason is FinishReason.STOP
    assert aborted == 1 and len(events) == 4  # the tokens after the stop are never read


def test_the_length_limit_is_llmds_and_an_end_without_the_id_flushes_what_was_held() -> None:
    length, _ = run([FakeOutput([FakeCompletion(ids("abcd"), "length")], finished=True)],
                    SamplingParams(max_tokens=4))
    assert length[-1].finish_reason is FinishReason.LENGTH and "".join(e.text for e in length) == "abcd"
    held, _ = run([output("abc"), output("", "stop")],
                  SamplingParams(max_tokens=8, stop=("cd",)))  # "c" waits: it may start the stop string
    assert "".join(e.text for e in held) == "abc" and held[-1].finish_reason is FinishReason.STOP


def test_an_abort_by_vllm_or_a_stream_cut_short_ends_in_an_error() -> None:
    aborted, _ = run([output("ab"), output("", "abort")],
                     SamplingParams(max_tokens=8))
    assert aborted[-1].error == "the vLLM engine ended the request (abort)"
    assert aborted[-1].finish_reason is None
    cut, _ = run([FakeOutput([FakeCompletion(ids("ab"))])], SamplingParams(max_tokens=8))
    assert cut[-1].error == "the vLLM engine's stream ended before the request did"
