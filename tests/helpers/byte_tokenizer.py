"""A tokenizer of single bytes, built offline in milliseconds, and llguidance's view of it: grammar
tests feed text byte by byte, with the special and added tokens a test names."""

from __future__ import annotations

from collections.abc import Sequence

from llguidance import LLTokenizer
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

END = "<end>"  # the end token the view stops at


def byte_tokenizer(special: Sequence[str] = (), added: Sequence[str] = ()) -> tuple[Tokenizer, LLTokenizer]:
    """Every byte a token, then `END` and `special` as special tokens and `added` as plain added
    ones; with llguidance's view of it (ending at `END`)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in (END, *special)])
    tokenizer.add_tokens([AddedToken(token, special=False) for token in added])
    return tokenizer, LLTokenizer(tokenizer.to_str(), eos_token=tokenizer.token_to_id(END))
