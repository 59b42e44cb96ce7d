"""Model and profile configurations for tests.

Published Hugging Face `config.json` contents of real models, for planning without their
weights, and a 4-bit profile that runs on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
