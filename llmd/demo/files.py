"""The demo model's files: the Hugging Face configs, the tokenizer files, and the manifest.

Every JSON file is written with a fixed key order and layout, so equal builds give equal bytes.
The manifest (`llmd_demo.json`) records the cycle and marks a directory as complete.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from llmd.demo.sizes import DemoModelSize
from llmd.demo.text import DEMO_TEXT
from llmd.demo.tokenizer import (
    BOS_TOKEN,
    BOS_TOKEN_ID,
    CHAT_TEMPLATE,
    END_OF_TEXT_TOKEN,
    END_OF_TEXT_TOKEN_ID,
    EOS_TOKEN_IDS,
    EOT_TOKEN,
)

MAX_POSITION_EMBEDDINGS = 4096
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-5
MANIFEST_FILE = "llmd_demo.json"

DEMO_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    MANIFEST_FILE,
)


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write JSON with a fixed key order and layout, so equal documents give equal bytes."""
    path.write_text(json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")


def model_config(size: DemoModelSize, vocab_size: int) -> dict[str, Any]:
    """The config.json of a LlamaForCausalLM of this size."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads,
        "head_dim": size.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": END_OF_TEXT_TOKEN_ID,
        "dtype": "float32",
    }


def generation_config() -> dict[str, Any]:
    """The generation_config.json: stop at the end of a turn or of the text."""
    return {
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": END_OF_TEXT_TOKEN_ID,
    }


def tokenizer_config() -> dict[str, Any]:
    """The tokenizer_config.json; the chat template lives beside it in chat_template.jinja."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOT_TOKEN,
        "pad_token": END_OF_TEXT_TOKEN,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }


def write_tokenizer(directory: Path, tokenizer: Tokenizer) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja."""
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", "utf-8")
    write_json(directory / "tokenizer_config.json", tokenizer_config())
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, "utf-8")


def manifest(size_name: str, seed: int, cycle: Sequence[int]) -> dict[str, Any]:
    """What was built, for `read_demo_cycle` and for spotting a complete directory."""
    return {"size": size_name, "seed": seed, "cycle_ids": list(cycle), "text": DEMO_TEXT}


def is_complete_demo_model(directory: Path) -> bool:
    """True if `directory` holds every file a finished `build_demo_model` writes."""
    return all((directory / name).is_file() for name in DEMO_FILES)


def read_demo_cycle(directory: Path) -> list[int]:
    """The token ids greedy decoding walks, as recorded by `build_demo_model`."""
    recorded = json.loads((directory / MANIFEST_FILE).read_text("utf-8"))
    return [int(token_id) for token_id in recorded["cycle_ids"]]
