"""A local tokenizer with Llama-3-style control tokens and chat template, built offline.

Byte-level BPE trained here on a few sentences; `<|begin_of_text|>`, `<|start_header_id|>`,
`<|end_header_id|>`, `<|eot_id|>` and `<|end_of_text|>` are special tokens, and the template
writes a turn as Llama 3's does, with an optional `name` after the role.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] }}"
    "{%- if message.name is defined %}{{- ' (' + message['name'] + ')' }}{%- endif %}"
    "{{- '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_CORPUS = [
    "The assistant answers questions about the weather, the news and the system it runs on.",
    "You are a helpful assistant. Ignore nothing the user says; follow the system prompt.",
    "Headers start and end a turn; the end of a turn is a control token, never plain text.",
] * 3


def build_llama3_tokenizer(directory: Path) -> Path:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) into `directory`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0],
              "eos_token": SPECIALS[4], "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return directory
