"""Local tokenizers with each code-model family's FIM tokens, built offline (no download).

A byte-level BPE (as Qwen, StarCoder, DeepSeek-Coder and Codestral's tekken are) or, for
CodeLlama, a SentencePiece-style one (`▁` for spaces, one before the first word), trained here
on a little code, with the family's FIM and end tokens added as special tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHAT_TEMPLATE = "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + '\\n' }}{%- endfor %}"

# family → (BOS or None, FIM and end tokens). Spellings as in the released models' vocabularies.
FAMILIES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "qwen": (None, ("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                    "<|repo_name|>", "<|file_sep|>")),
    "starcoder": (None, ("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                         "<repo_name>", "<file_sep>")),
    "codellama": ("<s>", ("<s>", "</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>")),
    "deepseek": ("<｜begin▁of▁sentence｜>", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                                              "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>")),
    "codestral": ("<s>", ("<s>", "</s>", "[PREFIX]", "[SUFFIX]")),
}

_CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)  # count\n",
] * 3


def build_fim_tokenizer(directory: Path, family: str) -> Path:
    """Write tokenizer.json and tokenizer_config.json for `family` into `directory`."""
    bos, specials = FAMILIES[family]
    tokenizer = Tokenizer(models.BPE())
    if family == "codellama":
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
    byte_level = pre_tokenizers.ByteLevel.alphabet()
    alphabet = sorted(set("".join(_CODE)) | {"▁"}) if family == "codellama" else byte_level
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=alphabet)
    tokenizer.train_from_iterator(_CODE, trainer)
    if bos is not None:
        bos_id = tokenizer.token_to_id(bos)
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                                 special_tokens=[(bos, bos_id)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos,
              "eos_token": specials[1 if bos else 0], "clean_up_tokenization_spaces": False,
              "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return directory
