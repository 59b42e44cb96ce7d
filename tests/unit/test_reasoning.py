"""Splitting thinking from the answer: markers dropped, possible marker starts held, any cut alike."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmd.api.reasoning import Channel, ReasoningSplitter
from llmd.engine.tool_format import ReasoningMarkers

MARKERS = ReasoningMarkers()
Pieces = list[tuple[Channel, str]]


def split(chunks: Sequence[str], in_reasoning: bool = False) -> tuple[str, str]:
    """(reasoning, content) joined, checking every feed's pieces are non-empty and merged."""
    splitter = ReasoningSplitter(MARKERS, in_reasoning)
    joined = {Channel.REASONING: "", Channel.CONTENT: ""}
    for pieces in [*(splitter.feed(chunk) for chunk in chunks), splitter.finish()]:
        assert all(text for _, text in pieces)
        assert all(a[0] is not b[0] for a, b in itertools.pairwise(pieces))
        for channel, text in pieces:
            joined[channel] += text
    return joined[Channel.REASONING], joined[Channel.CONTENT]


def cuttings(text: str) -> Iterator[list[str]]:
    yield [text]
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    yield list(text)


def split_every_way(text: str, in_reasoning: bool = False) -> tuple[str, str]:
    whole = split([text], in_reasoning)
    for chunks in cuttings(text):
        assert split(chunks, in_reasoning) == whole, chunks
    return whole


@pytest.mark.parametrize(("text", "in_reasoning", "reasoning", "content"), [
    ("<think>\nLet me see.\n</think>\n\nThe answer is 4.", False, "\nLet me see.\n", "The answer is 4."),
    ("  \n<think>hmm</think>ok", False, "hmm", "ok"),
    ("Let me see.\n</think>\n\nFour.", True, "Let me see.\n", "Four."),
    ("<think>\nLet me see.</think>Four.", True, "\nLet me see.", "Four."),  # the opening repeated
    ("Just an answer, no thinking.\n", False, "", "Just an answer, no thinking.\n"),
    ("Answer first <think>not thinking</think> still the answer", False, "",
     "Answer first <think>not thinking</think> still the answer"),
    ("<think>a</think>b</think>c<think>d", False, "a", "b</think>c<think>d"),
    ("<think>a < b, </thin> x</think>\n", False, "a < b, </thin> x", ""),
    ("<think>cut off mid-thought </thi", False, "cut off mid-thought </thi", ""),
    ("cut off mid-thought", True, "cut off mid-thought", ""),
    (" <thi", False, "", " <thi"),
    (" \n ", False, "", " \n "),
    ("", False, "", ""),
])
def test_split(text: str, in_reasoning: bool, reasoning: str, content: str) -> None:
    assert split_every_way(text, in_reasoning) == (reasoning, content)


def test_a_possible_marker_waits_for_the_next_piece() -> None:
    splitter = ReasoningSplitter(MARKERS, in_reasoning=False)
    assert splitter.feed(" <thi") == []
    assert splitter.feed("nk>Hm") == [(Channel.REASONING, "Hm")]
    assert splitter.feed("m </") == [(Channel.REASONING, "m ")]
    assert splitter.feed("think>\n") == []
    assert splitter.feed("\nYes.") == [(Channel.CONTENT, "Yes.")]
    assert splitter.finish() == []


def test_one_feed_gives_one_piece_per_channel_run() -> None:
    splitter = ReasoningSplitter(MARKERS, in_reasoning=True)
    assert splitter.feed("a b c</think> d e") == [(Channel.REASONING, "a b c"), (Channel.CONTENT, "d e")]


def test_other_markers() -> None:
    splitter = ReasoningSplitter(ReasoningMarkers("[THINK]", "[/THINK]"), in_reasoning=False)
    pieces = splitter.feed("[THINK]x[/THINK]y") + splitter.finish()
    assert pieces == [(Channel.REASONING, "x"), (Channel.CONTENT, "y")]


WORDS = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "think>", " ", "\n", "a", "b>"])


@settings(max_examples=200, deadline=None)
@given(words=st.lists(WORDS, max_size=14), cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=8),
       in_reasoning=st.booleans())
def test_any_cutting_gives_the_same_channels(words: list[str], cuts: list[int], in_reasoning: bool) -> None:
    text = "".join(words)
    bounds = [0, *sorted(cut % (len(text) + 1) for cut in cuts), len(text)]
    chunks = [text[start:end] for start, end in itertools.pairwise(bounds)]
    reasoning, content = split(chunks, in_reasoning)
    assert (reasoning, content) == split([text], in_reasoning)
    assert len(reasoning) + len(content) <= len(text)
    if "<think>" not in text and "</think>" not in text and not in_reasoning:
        assert (reasoning, content) == ("", text)
