"""The engine's logprobs in OpenAI's chat shape and the legacy completions shape (llmd/api/logprobs.py)."""

from __future__ import annotations

import math

import msgspec

from llmd.api.logprobs import (
    LOGPROB_FLOOR,
    Scored,
    chat_logprobs,
    completion_logprobs,
    floored,
    prompt_scored,
    shifted,
    token_logprob,
    top_dict,
)
from llmd.engine.types import Logprob, TokenLogprobs

EURO_HEAD = Logprob(1, "\ufffd", b"\xe2\x82", -0.5)  # the first two bytes of "€"
HELLO = Logprob(2, "Hello", b"Hello", -0.25)
HI = Logprob(3, "Hi", b"Hi", -1.5)


def position(chosen: Logprob, *top: Logprob) -> TokenLogprobs:
    return TokenLogprobs(chosen, top)


def test_chat_logprobs_have_openais_shape_and_raw_bytes() -> None:
    wire = msgspec.to_builtins(chat_logprobs([position(HELLO, HELLO, HI), position(EURO_HEAD)]))
    assert wire == {"content": [
        {"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"), "top_logprobs": [
            {"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello")},
            {"token": "Hi", "logprob": -1.5, "bytes": list(b"Hi")}]},
        {"token": "\ufffd", "logprob": -0.5, "bytes": [0xE2, 0x82], "top_logprobs": []},
    ], "refusal": None}


def test_an_impossible_token_gets_openais_floor_not_null() -> None:
    assert floored(-math.inf) == floored(math.nan) == LOGPROB_FLOOR and floored(-3.0) == -3.0
    wire = msgspec.json.encode(chat_logprobs([position(Logprob(4, "x", b"x", -math.inf))]))
    assert b"-9999.0" in wire and b"null," not in wire


def test_the_legacy_top_dict_holds_the_sampled_token_too() -> None:
    assert top_dict(position(HI, HELLO)) == {"Hello": -0.25, "Hi": -1.5}  # logprobs + 1 entries
    assert top_dict(position(HELLO, HELLO, HI)) == {"Hello": -0.25, "Hi": -1.5}
    assert top_dict(position(HELLO)) == {"Hello": -0.25}  # logprobs: 0


def test_two_tokens_of_one_text_keep_the_likelier() -> None:
    other_half = Logprob(9, "\ufffd", b"\xe2\x84", -2.0)
    assert top_dict(position(other_half, EURO_HEAD, other_half)) == {"\ufffd": -0.5}


def test_legacy_logprobs_are_parallel_lists() -> None:
    scored = [Scored(0, "Hello", position(HELLO, HELLO)), Scored(5, "Hi", position(HI))]
    wire = msgspec.to_builtins(completion_logprobs(scored))
    assert wire == {"text_offset": [0, 5], "token_logprobs": [-0.25, -1.5], "tokens": ["Hello", "Hi"],
                    "top_logprobs": [{"Hello": -0.25}, {"Hi": -1.5}]}
    assert list(wire) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]  # OpenAI's order


FIRST = TokenLogprobs(Logprob(7, "Hello", b"Hello", None))  # a prompt's first token: nothing predicts it


def test_an_echoed_prompt_starts_with_a_token_that_has_no_logprob() -> None:
    positions = (FIRST, position(Logprob(5, " world", b" world", -2.0)),
                 position(Logprob(6, "!", b"!", -0.1)))
    scored = prompt_scored("Hello world!", positions)
    legacy = completion_logprobs(scored)
    assert legacy.tokens == ["Hello", " world", "!"] and legacy.text_offset == [0, 5, 11]
    assert legacy.token_logprobs == [None, -2.0, -0.1] and legacy.top_logprobs[0] is None
    assert scored[0].logprob == 0.0


def test_a_prompt_whose_tokens_do_not_spell_it_still_has_bounded_offsets() -> None:
    positions = (FIRST, position(Logprob(5, "<|special|>", b"", -2.0)))
    scored = prompt_scored("ab", positions)
    assert [s.token for s in scored] == ["Hello", "<|special|>"] and [s.offset for s in scored] == [0, 0]
    assert prompt_scored("ab", ()) == []
    assert completion_logprobs([Scored(0, "x", position(HI))]).top_logprobs == [{"Hi": -1.5}]
    assert top_dict(FIRST) is None and token_logprob(FIRST).logprob == LOGPROB_FLOOR


def test_generated_tokens_follow_the_echo_in_offsets() -> None:
    scored = [Scored(0, "Hi", position(HI)), Scored(2, "!", position(HI))]
    assert [s.offset for s in shifted(scored, 12)] == [12, 14] and shifted(scored, 0) == scored


def test_prompt_offsets_follow_the_bytes_control_tokens_take_none_and_split_characters_share_one() -> None:
    bos = TokenLogprobs(Logprob(0, "<s>", b"<s>", None))
    head, tail = b"\xe2\x82", b"\xac"  # "€" in two tokens
    pieces = [bos, position(Logprob(1, "\ufffd", head, -1.0)), position(Logprob(2, "\ufffd", tail, -1.0)),
              position(Logprob(3, "!", b"!", -1.0))]
    assert [s.offset for s in prompt_scored("€!", pieces)] == [0, 0, 0, 1]

