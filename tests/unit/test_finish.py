"""The finish decision for one new token (EOS, stop string, length), on a fake decoder."""

from __future__ import annotations

from llmd.engine.detokenizer import OutputText
from llmd.engine.finish import TokenText, next_text
from llmd.engine.types import FinishReason

EOS = 0
TEXT = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!"}


class LetterDecoder:
    """Each id is a fixed piece of text; the end-of-sequence id decodes to nothing."""

    def decode(self, ids: list[int]) -> str:
        return "".join(TEXT.get(i, "") for i in ids)


def run(tokens: list[int], max_tokens: int, stops: tuple[str, ...] = ()) -> list[TokenText]:
    output = OutputText(LetterDecoder(), [], stops)
    steps = []
    for generated, token in enumerate(tokens, start=1):
        steps.append(next_text(output, token, generated, max_tokens, frozenset([EOS])))
        if steps[-1].finish_reason is not None:
            break
    return steps


def text_of(steps: list[TokenText]) -> str:
    return "".join(step.text for step in steps)


def test_a_token_that_ends_nothing_has_no_finish_reason() -> None:
    steps = run([1, 2], max_tokens=10)
    assert [s.finish_reason for s in steps] == [None, None] and text_of(steps) == "Hello"


def test_end_of_sequence_is_stop_and_flushes_what_was_held() -> None:
    steps = run([1, 2, EOS, 3], max_tokens=10, stops=("lo!",))  # "lo" held: it may start "lo!"
    assert steps[-1].finish_reason is FinishReason.STOP and len(steps) == 3
    assert text_of(steps) == "Hello"


def test_a_stop_string_is_stop_and_is_cut_with_what_follows() -> None:
    steps = run([1, 2, 3, 4, 5], max_tokens=10, stops=("o w",))
    assert steps[-1].finish_reason is FinishReason.STOP and len(steps) == 3
    assert text_of(steps) == "Hell"


def test_the_last_allowed_token_is_length_and_flushes() -> None:
    steps = run([1, 2, 3, 4, 5], max_tokens=2, stops=("lo!",))
    assert [s.finish_reason for s in steps] == [None, FinishReason.LENGTH]
    assert text_of(steps) == "Hello"


def test_eos_wins_over_length_on_the_last_token() -> None:
    steps = run([1, EOS], max_tokens=2)
    assert steps[-1].finish_reason is FinishReason.STOP
