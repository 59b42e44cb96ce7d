"""The finish decision for one new token (EOS, stop ids and strings, min_tokens, length); fake decoder."""

from __future__ import annotations

import pytest

from llmd.engine.detokenizer import OutputText
from llmd.engine.finish import TokenText, next_text
from llmd.engine.types import FinishReason, SamplingParams
from llmd.errors import InvalidRequest

EOS = 0
TEXT = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 6: "<end>"}


class LetterDecoder:
    """Each id is a fixed piece of text; the end-of-sequence id decodes to nothing."""

    def decode(self, ids: list[int]) -> str:
        return "".join(TEXT.get(i, "") for i in ids)


def run(tokens: list[int], max_tokens: int, stops: tuple[str, ...] = (),
        **options: object) -> list[TokenText]:
    output = OutputText(LetterDecoder(), [], stops)
    params = SamplingParams(max_tokens=max_tokens, stop=stops, **options)  # type: ignore[arg-type]
    steps = []
    for generated, token in enumerate(tokens, start=1):
        steps.append(next_text(output, token, generated, params, frozenset([EOS])))
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


def test_a_stop_token_id_is_stop_and_its_text_is_not_sent() -> None:
    steps = run([1, 2, 6, 3], max_tokens=10, stop_token_ids=(6,))
    assert steps[-1].finish_reason is FinishReason.STOP and len(steps) == 3
    assert text_of(steps) == "Hello"


def test_ignore_eos_lets_eos_pass_but_stop_ids_still_stop() -> None:
    passed = run([1, EOS, 2], max_tokens=3, ignore_eos=True)
    assert [s.finish_reason for s in passed] == [None, None, FinishReason.LENGTH]
    stopped = run([1, EOS, 6, 2], max_tokens=10, ignore_eos=True, stop_token_ids=(6,))
    assert stopped[-1].finish_reason is FinishReason.STOP and len(stopped) == 3


def test_min_tokens_holds_eos_stop_ids_and_stop_strings_until_reached() -> None:
    held = run([EOS, 6, 1, 2, EOS], max_tokens=10, stop_token_ids=(6,), min_tokens=4)
    assert [s.finish_reason for s in held] == [None, None, None, None, FinishReason.STOP]
    strings = run([1, 2, 3, 1, 2, 4], max_tokens=10, stops=("lo",), min_tokens=2)
    assert strings[-1].finish_reason is FinishReason.STOP and len(strings) == 5  # the second "lo"
    assert text_of(strings) == "Hello worHel"  # nothing held back while it could not stop


def test_min_tokens_above_max_tokens_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(max_tokens=3, min_tokens=4)
    assert err.value.param == "min_tokens"


def test_only_an_id_that_ends_the_request_is_marked_by_id() -> None:
    assert [s.by_id for s in run([1, 2, EOS], max_tokens=10)] == [False, False, True]
    assert [s.by_id for s in run([1, 6], max_tokens=10, stop_token_ids=(6,))] == [False, True]
    assert not any(s.by_id for s in run([1, 2, 3], max_tokens=10, stops=("o w",)))  # a stop string
    assert not any(s.by_id for s in run([1, EOS], max_tokens=2, ignore_eos=True))  # EOS passed as text
    assert not any(s.by_id for s in run([EOS, 1], max_tokens=2, min_tokens=2))  # held until min_tokens
