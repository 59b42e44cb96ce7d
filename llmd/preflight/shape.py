"""The model's shape, read from `config.json` and the safetensors headers (never a tensor).

`read_model_shape` gives a `ModelShape`: the dimensions the memory plan needs and the
parameter counts, exact from the checkpoint's headers when it is there, else from the config's
arithmetic. `attention_heads` and `context_limit` are the one source of a decoder's head counts
and of the context a request may use, for a `config.json` dict and a loaded model's config alike.

The rest of preflight: `plan` (the arithmetic, the verdict and the fixes), `hardware` (the
memory there is, and the profile `auto` picks) and `render` (the plan as text).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

import msgspec
from msgspec.structs import replace

from llmd.config import Profile
from llmd.errors import ConfigError
from llmd.units import MiB

# A model's config: a `config.json` dict, or a transformers config (read by attribute, so its
# `attribute_map` aliases such as GPT-2's `n_head` hold).
ModelConfig: TypeAlias = Mapping[str, Any] | object

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# A safetensors header lists names, dtypes and shapes; a larger one means a corrupt file.
MAX_SAFETENSORS_HEADER = 100 * MiB

_LAYER_TENSOR = re.compile(r"(?:^|\.)layers\.\d+\.")


class ModelShape(msgspec.Struct, frozen=True):
    """What the plan needs to know about a model: its dimensions and parameter counts.

    `linear_params` are the weights of the nn.Linear layers inside the decoder blocks
    (attention q/k/v/o, MLP gate/up/down): the ones bitsandbytes quantizes. Embeddings,
    lm_head (0 when tied to the embeddings), norms and biases stay in the compute dtype.
    """

    layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    heads: int
    kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    linear_params: int = 0
    embedding_params: int = 0
    lm_head_params: int = 0
    other_params: int = 0
    largest_linear_params: int = 0
    counted_from: str = "config.json arithmetic"

    @property
    def params(self) -> int:
        """All parameters, counting tied embeddings once (as `model.parameters()` does)."""
        return self.linear_params + self.embedding_params + self.lm_head_params + self.other_params

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Keys and values of one token across all layers: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]


class ParamCounts(NamedTuple):
    """Parameter counts by what happens to them under 4-bit quantization."""

    linear: int
    embedding: int
    lm_head: int
    other: int
    largest_linear: int


def shape_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
    """The shape of a Llama/Qwen2/Mistral-family model, parameters counted from its config alone.

    Other architectures get their dimensions from here too, but need the checkpoint's
    safetensors headers (see `read_model_shape`) for exact parameter counts.
    """
    shape = _dimensions(_text_config(config), source)
    return _with_counts(shape, _config_counts(shape, config), "config.json arithmetic")


def read_model_shape(model: str | Path) -> ModelShape:
    """The shape of the model in a directory (or the local HF cache), counted from its checkpoint.

    Parameters are counted exactly from the safetensors headers when the checkpoint is there
    (`model.safetensors`, or the shards `model.safetensors.index.json` names); with only a
    `config.json`, from the config's arithmetic.
    """
    directory = model_directory(model)
    config_path = directory / "config.json"
    shape = shape_from_config(_read_json(config_path, "config.json"), str(config_path))
    files = checkpoint_files(directory)
    if not files:
        return shape
    tensors = {name: dims for path in files for name, dims in read_safetensors_header(path).items()}
    return _with_counts(shape, _tensor_counts(tensors, shape.tie_word_embeddings), "safetensors headers")


def model_directory(model: str | Path) -> Path:
    """A model directory as given, or the snapshot of a model id in the local HF cache."""
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True))
    except (ImportError, OSError, ValueError) as exc:
        raise ConfigError(f"model `{model}`: not a directory, and not in the local Hugging Face "
                          f"cache ({exc}); pass a model directory with --model") from exc


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files transformers would load from `directory` ([] when none are there)."""
    index_path = directory / "model.safetensors.index.json"
    if not index_path.is_file():
        single = directory / "model.safetensors"
        return [single] if single.is_file() else []
    weight_map = _read_json(index_path, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{index_path}: no `weight_map`; the index file is damaged")
    shards = [directory / name for name in sorted(set(weight_map.values()))]
    missing = [path.name for path in shards if not path.is_file()]
    if len(missing) == len(shards):
        return []
    if missing:
        raise ConfigError(f"{directory}: shards missing: {', '.join(missing)}; the download is incomplete")
    return shards


def read_safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from a safetensors file's header; the tensors are never read.

    The format starts with the header's length (8 bytes, little-endian), then the header:
    JSON mapping each tensor name to its dtype, shape and byte offsets.
    """
    try:
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if not 2 <= length <= MAX_SAFETENSORS_HEADER:
                raise ConfigError(f"{path}: not a safetensors file (header length {length})")
            header = json.loads(file.read(length))
        return {name: tuple(info["shape"]) for name, info in header.items() if name != "__metadata__"}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{path}: damaged safetensors header: {exc}") from exc


class AttentionHeads(NamedTuple):
    """A decoder's attention: query heads, key/value heads (fewer under GQA), and one head's width."""

    heads: int
    kv_heads: int
    head_dim: int


def attention_heads(config: ModelConfig, source: str = "model config") -> AttentionHeads:
    """The head counts of a decoder's config, a null or missing field taking the usual default.

    `config` is the language model's own config: a `config.json` dict (a composite model's
    `text_config`), or a loaded model's `model.config.get_text_config(decoder=True)`. Without
    `num_key_value_heads` every query head has its own; without `head_dim` a head is
    hidden_size // heads wide. A field that is there but not a positive integer is a ConfigError.
    """
    heads = _positive(config, "num_attention_heads", source)
    kv_heads = _positive(config, "num_key_value_heads", source, default=heads)
    return AttentionHeads(heads, kv_heads, _head_dim(config, heads, source))


def context_limit(max_position_embeddings: int | None, profile: Profile) -> int:
    """Tokens per request: the profile's `max_context`, capped by the model's position limit.

    A limit of None (or 0) means the model states none, and the profile's figure stands.
    """
    return min(profile.max_context, int(max_position_embeddings or profile.max_context))


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`, or a ConfigError naming the path and what it should be."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no {what} here; is this a Hugging Face model directory?") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: the {what} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the {what} should be a JSON object")
    return document


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a composite (vision + text) config, else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) and "hidden_size" in text else config


def _dimensions(config: Mapping[str, Any], source: str) -> ModelShape:
    """The dimensions a plan needs; parameter counts are filled in afterwards."""
    hidden = _positive(config, "hidden_size", source)
    _positive(config, "num_attention_heads", source)  # checked early: errors name fields in config order
    layers = _positive(config, "num_hidden_layers", source)
    intermediate = _positive(config, "intermediate_size", source)
    vocab = _positive(config, "vocab_size", source)
    attention = attention_heads(config, source)
    return ModelShape(
        layers=layers, hidden_size=hidden, intermediate_size=intermediate, vocab_size=vocab,
        heads=attention.heads, kv_heads=attention.kv_heads, head_dim=attention.head_dim,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=_positive(config, "max_position_embeddings", source, default=0) or None,
    )


def _positive(config: ModelConfig, key: str, source: str, default: int | None = None) -> int:
    """An integer field that must be positive; a missing or null one takes `default` if given."""
    value = _field(config, key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{source}: `{key}` is {value!r}, expected a positive integer; "
                          f"llmd plans decoder-only (Llama-family) configs", param=key)
    return value


def _head_dim(config: ModelConfig, heads: int, source: str) -> int:
    """`head_dim`, or hidden_size // heads when the config leaves it out (most Llama-family configs)."""
    if _field(config, "head_dim") is None:
        return _positive(config, "hidden_size", source) // heads
    return _positive(config, "head_dim", source)


def _field(config: ModelConfig, key: str) -> Any:
    """A config field: a dict's key, or a transformers config's attribute; None when absent."""
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def _config_counts(shape: ModelShape, config: Mapping[str, Any]) -> ParamCounts:
    """Parameters of a Llama-family model: per layer q, k, v, o and gate/up/down, two RMSNorms."""
    hidden, q_width = shape.hidden_size, shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    attention = 2 * hidden * q_width + 2 * hidden * kv_width
    mlp = 3 * hidden * shape.intermediate_size
    embedding = shape.vocab_size * hidden
    return ParamCounts(
        linear=shape.layers * (attention + mlp),
        embedding=embedding,
        lm_head=0 if shape.tie_word_embeddings else embedding,
        other=shape.layers * (2 * hidden + _bias_params(shape, config)) + hidden,
        largest_linear=hidden * max(shape.intermediate_size, q_width),
    )


def _bias_params(shape: ModelShape, config: Mapping[str, Any]) -> int:
    """Bias vectors per decoder layer: Qwen2 has q/k/v biases; Llama's flags add o and the MLP's."""
    text = _text_config(config)
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    if text.get("model_type") == "qwen2":
        return qkv
    attention = qkv + shape.hidden_size if text.get("attention_bias") else 0
    mlp = 2 * shape.intermediate_size + shape.hidden_size if text.get("mlp_bias") else 0
    return attention + mlp


def _tensor_counts(tensors: Mapping[str, tuple[int, ...]], tied: bool) -> ParamCounts:
    """Exact counts from tensor names and shapes: 2-D `.weight`s inside `layers.N.` are linear."""
    totals = {"linear": 0, "embedding": 0, "lm_head": 0, "other": 0}
    largest_linear = 0
    for name, dims in tensors.items():
        role, count = _tensor_role(name, dims), math.prod(dims)
        totals[role] += count
        largest_linear = max(largest_linear, count if role == "linear" else 0)
    if tied:
        totals["lm_head"] = 0  # tied: the same storage as the embeddings
    return ParamCounts(**totals, largest_linear=largest_linear)


def _tensor_role(name: str, dims: tuple[int, ...]) -> str:
    """Which count a checkpoint tensor belongs to."""
    if "embed_tokens" in name:
        return "embedding"
    if name.startswith("lm_head.") or ".lm_head." in name:
        return "lm_head"
    if _LAYER_TENSOR.search(name) and name.endswith(".weight") and len(dims) == 2:
        return "linear"
    return "other"


def _with_counts(shape: ModelShape, counts: ParamCounts, source: str) -> ModelShape:
    return replace(
        shape, linear_params=counts.linear, embedding_params=counts.embedding,
        lm_head_params=counts.lm_head, other_params=counts.other,
        largest_linear_params=counts.largest_linear, counted_from=source,
    )

