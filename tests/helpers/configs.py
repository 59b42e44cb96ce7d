"""Model and profile configurations for tests.

Published Hugging Face `config.json` contents of real models, for planning without their
weights, a 4-bit profile that runs on the CPU, and the shipped CPU profiles with eager steps.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from llmd.config import PROFILES_DIR, Profile, load_profile

LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}

LLAMA_3_1_70B: dict[str, Any] = LLAMA_3_1_8B | {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}

QWEN2_5_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}


def nf4_cpu_profile(tmp_path: Path) -> Path:
    """The 12gb-4bit profile's choices, on the CPU (bitsandbytes runs there, slowly)."""
    path = tmp_path / "4bit-cpu.yaml"
    path.write_text(
        "device: cpu\ndtype: bfloat16\nquantization: nf4\ndouble_quant: true\n"
        "max_context: 512\nmax_running: 2\n"
    )
    return path


def eager_profile(name: str = "cpu", **changes: Any) -> Profile:
    """A shipped profile with both decode steps eager, and `changes`.

    The shipped CPU profiles compile their steps at load (a minute of max-autotune on two cores);
    a test that is not about the compiled steps loads its model in seconds this way, and the
    tests of the compiled steps ask for them."""
    return replace(load_profile(name), lone_step="eager", batch_step="eager", **changes)


def eager_profile_file(directory: Path, name: str = "cpu") -> Path:
    """`eager_profile(name)` as a profile file, for a daemon or a command line: the shipped file
    with its `lone_step` and `batch_step` lines set to eager."""
    text = (PROFILES_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    for key in ("lone_step", "batch_step"):
        text, count = re.subn(rf"(?m)^{key}: .*$", f"{key}: eager", text)
        assert count == 1, f"{name}.yaml has no single `{key}` line"
    path = directory / f"{name}-eager.yaml"
    path.write_text(text, encoding="utf-8")
    return path
