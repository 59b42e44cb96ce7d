"""Token bytes for logprobs, pure: GPT-2's byte alphabet reversed, and a stand-in tokenizer per layout."""

from __future__ import annotations

from dataclasses import dataclass

from llmd.engine.token_bytes import ALPHABET, LOGPROB_FLOOR, TokenBytes
from llmd.engine.types import RawScores


def test_the_byte_level_alphabet_is_a_bijection_onto_the_256_bytes() -> None:
    assert sorted(ALPHABET.values()) == list(range(256))
    assert ALPHABET["A"] == ord("A") and ALPHABET["\u0120"] == ord(" ") and ALPHABET["\u010a"] == ord("\n")


@dataclass
class Added:
    content: str


class StandIn:
    """The two tokenizer calls `TokenBytes` makes, over a fixed vocabulary (no backend: not byte-level)."""

    def __init__(self, vocab: list[str], added: dict[int, str]) -> None:
        self.vocab = vocab
        self.added_tokens_decoder = {token_id: Added(text) for token_id, text in added.items()}

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self.vocab[token_id] if token_id < len(self.vocab) else None


def test_sentencepiece_pieces_spaces_byte_fallback_and_added_tokens() -> None:
    pieces = TokenBytes(StandIn(["\u2581hello", "<0xE4>", "<0xBD>", "<0xA0>", "<s>"], {4: "<s>"}))
    assert pieces.piece(0) == (" hello", b" hello")
    assert b"".join(pieces.raw(k) for k in (1, 2, 3)).decode() == "你"
    assert pieces.piece(1) == ("\ufffd", b"\xe4")  # a part of a character alone
    assert pieces.piece(4) == ("<s>", b"<s>") and pieces.raw(99) == b""


def test_non_finite_logprobs_become_openais_floor() -> None:
    pieces = TokenBytes(StandIn(["a", "b"], {}))
    entry = pieces.token_logprobs(RawScores(0, float("-inf"), (1, 0), (-0.1, float("nan"))))
    assert entry.chosen.logprob == LOGPROB_FLOOR and entry.top[1].logprob == LOGPROB_FLOOR
    assert entry.top[0].text == "b" and entry.top[0].raw == b"b" and entry.top[0].logprob == -0.1
