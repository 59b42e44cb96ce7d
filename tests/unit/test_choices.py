"""A request's choices read side by side (llmd/api/choices.py): collecting, ranking."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from llmd.api.choices import Generated, collect, collect_all
from llmd.api.completions import TextOptions, kept
from llmd.api.logprobs import Scored
from llmd.engine.types import FinishReason, Logprob, SamplingParams, TokenEvent, TokenLogprobs
from tests.helpers.fake_engine import FakeStream, fake_logprobs


def stream(pieces: Sequence[str], logprobs: int | None = None) -> FakeStream:
    return FakeStream(pieces, 16, params=SamplingParams(max_tokens=16, logprobs=logprobs))


def test_collect_keeps_logprobs_only_when_asked() -> None:
    plain = asyncio.run(collect(stream(["Hel", "lo"], logprobs=0), logprobs=False))
    assert (plain.text, plain.finish_reason, plain.scored) == ("Hello", "stop", None)
    scored = asyncio.run(collect(stream(["Hel", "", "lo"], logprobs=2), logprobs=True))
    assert scored.scored is not None and [s.offset for s in scored.scored] == [0, 3, 3]
    assert [s.token for s in scored.scored] == ["Hel", "\ufffd", "lo"]
    assert scored.sampled_logprob == -0.25 - 0.5 - 0.75


def test_collect_all_reads_every_stream() -> None:
    results = asyncio.run(collect_all([stream("ab"), stream("c")], logprobs=False))
    assert [r.text for r in results] == ["ab", "c"]


def test_generated_takes_the_prompt_logprobs_and_the_finish() -> None:
    generated = Generated(scored=[])
    prompt = (fake_logprobs("w", 0, 0), fake_logprobs("x", 0, 0))
    generated.add(TokenEvent("a", 1, prompt_logprobs=prompt, logprobs=fake_logprobs("a", 0, 0)))
    generated.add(TokenEvent("", 2, FinishReason.LENGTH))  # an EOS-like end: no logprobs
    assert generated.prompt == prompt and generated.finish_reason == "length"
    assert generated.scored is not None and len(generated.scored) == 1


def scored_choice(text: str, *logprobs: float) -> Generated:
    def one(logprob: float) -> Scored:
        return Scored(0, text, TokenLogprobs(Logprob(1, text, text.encode(), logprob)))

    return Generated([text], scored=[one(lp) for lp in logprobs])


def test_best_of_keeps_the_n_whose_sampled_logprobs_sum_highest() -> None:
    choices = [scored_choice("a", -1.0, -1.0), scored_choice("b", -0.5), scored_choice("c", -0.2, -0.2)]
    assert [c.text for c in kept(choices, TextOptions(n=2, best_of=3))] == ["c", "b"]
    assert [c.text for c in kept(choices, TextOptions(n=3, best_of=3))] == ["a", "b", "c"]  # none dropped
    tie = [scored_choice("x", -1.0), scored_choice("y", -1.0)]
    assert [c.text for c in kept(tie, TextOptions(n=1, best_of=2))] == ["x"]  # a tie keeps the first
