"""Incremental detokenization and stop strings, on a byte-level fake tokenizer."""

from __future__ import annotations

import random

import pytest

from llmd.engine.detokenizer import IncrementalDetokenizer, OutputText, StopMatcher

TEXTS = [
    "안녕하세요, 세계!",
    "emoji 👋🏽 and 🧑‍💻 together",
    "combining: e\u0301 and n\u0303 — 中文字符 と 日本語",
    "plain ascii only",
]


class ByteTokens:
    """Each token is a short run of raw bytes, like a byte-level BPE."""

    def __init__(self) -> None:
        self.table: list[bytes] = []

    def encode(self, text: str, rng: random.Random) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            size = rng.randint(1, 3)
            self.table.append(data[i : i + size])
            ids.append(len(self.table) - 1)
            i += size
        return ids

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.table[i] for i in ids).decode("utf-8", errors="replace")


def stream(tokens: ByteTokens, ids: list[int], stops: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    output = OutputText(tokens, [], stops)
    chunks: list[str] = []
    for token in ids:
        text, stopped = output.push(token)
        chunks.append(text)
        if stopped:
            return chunks, True
    chunks.append(output.finish())
    return chunks, False


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("seed", range(5))
def test_chunks_join_to_the_full_decode_without_replacement_chars(text: str, seed: int) -> None:
    tokens = ByteTokens()
    ids = tokens.encode(text, random.Random(seed))
    chunks, _ = stream(tokens, ids)
    assert "".join(chunks) == text == tokens.decode(ids)
    assert all("\ufffd" not in chunk for chunk in chunks)


def test_multibyte_characters_really_split_across_tokens() -> None:
    tokens = ByteTokens()
    ids = tokens.encode("안녕하세요", random.Random(0))
    assert any("\ufffd" in tokens.decode([i]) for i in ids)


@pytest.mark.parametrize("cut", [1, 2])
def test_ending_inside_a_character_flushes_what_the_full_decode_shows(cut: int) -> None:
    tokens = ByteTokens()
    tokens.table = [b"ok ", "한".encode()[:cut]]
    chunks, _ = stream(tokens, [0, 1])
    assert "".join(chunks) == tokens.decode([0, 1]) == "ok \ufffd"
    assert chunks[0] == "ok "


def test_each_token_decodes_a_short_window_not_the_whole_sequence() -> None:
    tokens = ByteTokens()
    ids = tokens.encode("abcdefghij" * 50, random.Random(1))
    seen: list[int] = []

    class Counting:
        def decode(self, window: list[int]) -> str:
            seen.append(len(window))
            return tokens.decode(window)

    detokenizer = IncrementalDetokenizer(Counting(), [])
    for token in ids:
        detokenizer.push(token)
    assert max(seen) <= 4


def test_prompt_context_is_not_repeated_in_the_output() -> None:
    tokens = ByteTokens()
    prompt = tokens.encode("the prompt ", random.Random(2))
    answer = tokens.encode("and the answer", random.Random(3))
    output = OutputText(tokens, prompt, ())
    text = "".join(output.push(t)[0] for t in answer) + output.finish()
    assert text == "and the answer"


@pytest.mark.parametrize("seed", range(8))
def test_stop_string_found_across_chunk_boundaries_and_not_emitted(seed: int) -> None:
    tokens = ByteTokens()
    ids = tokens.encode("Hello 세계 END trailing", random.Random(seed))
    chunks, stopped = stream(tokens, ids, stops=("END",))
    assert stopped
    assert "".join(chunks) == "Hello 세계 "


def test_earliest_of_several_stops_wins() -> None:
    matcher = StopMatcher(("xyz", "b"))
    assert matcher.feed("aaxy") == ("aa", False)
    assert matcher.feed("zb") == ("", True)


def test_held_back_prefix_is_released_when_it_does_not_complete() -> None:
    matcher = StopMatcher(("STOP",))
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("OP?") == ("", True)
    matcher = StopMatcher(("STOP",))
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("AR") == ("STAR", False)
    assert matcher.feed("S") == ("", False)
    assert matcher.flush() == "S"


def test_no_stops_passes_text_straight_through() -> None:
    matcher = StopMatcher(())
    assert matcher.feed("anything") == ("anything", False)
