"""Token bytes of real tokenizers: each token's bytes, joined, are the text's UTF-8 (Korean, CJK, emoji)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from llmd.engine.token_bytes import TokenBytes, uses_byte_level

TEXT = "Hello, 안녕하세요 世界 🙂 ok"


def test_the_demo_tokenizers_token_bytes_join_into_the_text(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    pieces = TokenBytes(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert uses_byte_level(tokenizer)
    assert b"".join(pieces.raw(token) for token in ids) == TEXT.encode()
    assert any("\ufffd" in pieces.piece(token)[0] for token in ids)  # some token holds part of a character
    bos = tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert pieces.piece(bos) == ("<|begin_of_text|>", b"<|begin_of_text|>")
