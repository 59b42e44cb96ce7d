"""The model's tokenizer: chat template to prompt ids, ids to text, end-of-sequence ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from llmd.errors import InvalidRequest


class ChatTokenizer:
    """One tokenizer instance. Not shared across threads: each thread loads its own."""

    def __init__(self, model_dir: str | Path) -> None:
        self._tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(model_dir))
        if not self._tokenizer.chat_template:
            raise InvalidRequest(f"{model_dir}: the tokenizer has no chat template")
        self._backend = getattr(self._tokenizer, "backend_tokenizer", None)
        eos = self._tokenizer.eos_token_id
        self.eos_token_ids = frozenset() if eos is None else frozenset([int(eos)])

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Render messages with the chat template (generation prompt added) into ids."""
        text = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens skipped; the Rust decoder directly when available."""
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=True))
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

