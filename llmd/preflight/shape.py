"""Preflight: will this model fit with this profile? Arithmetic you can read, plus one measurement.

The plan reads the model's shape from `config.json` and the safetensors headers (never a
tensor), adds up what the profile will hold — weights, the KV cache of the running set and of
the prefix cache, the prefill workspace, the decode logits, CUDA overheads and the headroom —
and compares the total with the memory there is. When it does not fit, the same arithmetic
finds the fixes: the largest `max_context` and `max_running` that fit, a smaller prefix cache,
4-bit weights, or the card size the plan needs as it stands.

Importing this module never imports torch; only measuring free CUDA memory does, lazily.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import psutil
from msgspec.structs import replace

from llmd.config import Profile, load_profile, parse_size
from llmd.errors import ConfigError, DeviceUnavailable
from llmd.units import GiB, MiB, bytes_text, count_text, short_bytes_text

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# bitsandbytes NF4 stores 4 bits per weight plus one absmax per block of 64 weights: a float32
# (4.5 bits per weight), or with double quantization an 8-bit absmax per block plus a float32
# constant per 256 blocks (4 + 8/64 + 32/16384 ≈ 4.127 bits per weight).
NF4_BLOCKSIZE = 64
NF4_NESTED_BLOCKSIZE = 256
NF4_BITS = 4 + 32 / NF4_BLOCKSIZE
NF4_DOUBLE_QUANT_BITS = 4 + 8 / NF4_BLOCKSIZE + 32 / (NF4_BLOCKSIZE * NF4_NESTED_BLOCKSIZE)

# What the CUDA context (kernel images, driver state) and the cuBLAS workspace take on a
# recent driver: typically 300-500 MiB. Counted only against a total given with
# --gpu-memory; free memory measured in this process already excludes our context.
CUDA_CONTEXT_BYTES = 500 * MiB
# reduce-overhead keeps CUDA graphs whose intermediates live in a private pool that the
# eager allocator cannot reuse: a fixed allowance for the graphs' static buffers plus, at
# worst, a copy of the largest step's intermediates (bounded by the prefill workspace).
CUDA_GRAPH_POOL_BYTES = 256 * MiB
# Decode logits are float32: the logits, the probabilities, and top-p's sorted copy.
LOGIT_BYTES = 4
LOGIT_COPIES = 3

# Shorter contexts than this are not worth suggesting; suggestions are multiples of the step.
MIN_USEFUL_CONTEXT = 512
CONTEXT_STEP = 256
# The shipped profile suggested when 16-bit weights are what does not fit on a GPU.
FOUR_BIT_PROFILE = "12gb-4bit"
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


# --- the model's shape -----------------------------------------------------------------------


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
    heads = _positive(config, "num_attention_heads", source)
    return ModelShape(
        layers=_positive(config, "num_hidden_layers", source),
        hidden_size=hidden,
        intermediate_size=_positive(config, "intermediate_size", source),
        vocab_size=_positive(config, "vocab_size", source),
        heads=heads,
        kv_heads=_positive(config, "num_key_value_heads", source, default=heads),
        head_dim=_positive(config, "head_dim", source, default=hidden // heads),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=_positive(config, "max_position_embeddings", source, default=0) or None,
    )


def _positive(config: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    """An integer field that must be positive; a missing or null one takes `default` if given."""
    value = config.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{source}: `{key}` is {value!r}, expected a positive integer; "
                          f"llmd plans decoder-only (Llama-family) configs", param=key)
    return value


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


# --- the arithmetic --------------------------------------------------------------------------


def effective_context(shape: ModelShape, profile: Profile) -> int:
    """Tokens per request: the profile's `max_context`, capped by the model's position limit."""
    limit = shape.max_position_embeddings or profile.max_context
    return min(profile.max_context, limit)


def nf4_bits(profile: Profile) -> float:
    """Bits per quantized weight, quantization constants included."""
    return NF4_DOUBLE_QUANT_BITS if profile.double_quant else NF4_BITS


def weight_bytes(shape: ModelShape, profile: Profile) -> int:
    """All weights in the compute dtype; with nf4 the decoder's linear weights at `nf4_bits`."""
    dtype_bytes = DTYPE_BYTES[profile.dtype]
    if profile.quantization == "none":
        return shape.params * dtype_bytes
    unquantized = shape.params - shape.linear_params
    return math.ceil(shape.linear_params * nf4_bits(profile) / 8) + unquantized * dtype_bytes


def prefill_tokens(profile: Profile) -> int:
    """Prompt tokens in the largest forward pass.

    That is `max_step_tokens` (a burst of newcomers prefilled together while nobody decodes),
    never less than one `prefill_chunk_tokens` chunk.
    """
    return max(profile.prefill_chunk_tokens, profile.max_step_tokens)


def workspace_bytes(shape: ModelShape, profile: Profile) -> int:
    """Peak activations of the largest prefill step, P = `prefill_tokens` tokens, in one layer
    (layers run one after another, so their activations do not add up).

    P * (4*hidden + (heads + 2*kv_heads)*head_dim + 3*intermediate) * dtype bytes: the
    residual stream, its normed copy, the attention output and the MLP output (4*hidden); the
    q, k and v projections; the MLP's gate, up and their product (3*intermediate). SDPA's
    fused kernels never hold the P * context score matrix, so it is not counted. With nf4,
    bitsandbytes dequantizes a whole weight for a multi-token matmul, so the largest linear
    weight in the compute dtype is added.
    """
    dtype_bytes = DTYPE_BYTES[profile.dtype]
    per_token = (4 * shape.hidden_size + (shape.heads + 2 * shape.kv_heads) * shape.head_dim
                 + 3 * shape.intermediate_size)
    dequantized = shape.largest_linear_params if profile.quantization == "nf4" else 0
    return (prefill_tokens(profile) * per_token + dequantized) * dtype_bytes


def logits_bytes(shape: ModelShape, running: int) -> int:
    """Decode logits for the running batch: running * vocab * float32 (4 bytes) * 3 copies.

    Only the last position's logits are computed (logits_to_keep=1), so the prompt length
    does not appear.
    """
    return running * shape.vocab_size * LOGIT_BYTES * LOGIT_COPIES


class PlanItem(msgspec.Struct, frozen=True):
    """One line of the plan: what holds memory, how much, and why that much."""

    name: str
    bytes: int
    note: str


def plan_items(shape: ModelShape, profile: Profile, counts_cuda_context: bool) -> tuple[PlanItem, ...]:
    """Everything the profile will hold for this model, in bytes."""
    items = [_weights_item(shape, profile), *_kv_items(shape, profile), _workspace_item(shape, profile),
             _logits_item(shape, profile)]
    if profile.device == "cuda":
        items += _cuda_items(shape, profile, counts_cuda_context)
    items.append(PlanItem("headroom", profile.headroom_bytes, f"memory_headroom {profile.memory_headroom}"))
    return tuple(items)


def _weights_item(shape: ModelShape, profile: Profile) -> PlanItem:
    if profile.quantization == "none":
        note = f"{profile.dtype}, {count_text(shape.params)} params"
    else:
        quantized = "nf4 + double quant" if profile.double_quant else "nf4"
        note = (f"{quantized} ({nf4_bits(profile):.2f} bits) for {count_text(shape.linear_params)} linear "
                f"params, {profile.dtype} for {count_text(shape.params - shape.linear_params)}")
    return PlanItem("weights", weight_bytes(shape, profile), note)


def _kv_items(shape: ModelShape, profile: Profile) -> list[PlanItem]:
    """The running set's reservation (every request at full context) and the prefix cache."""
    per_token, context = shape.kv_bytes_per_token(profile.dtype), effective_context(shape, profile)
    running = profile.max_running
    return [
        PlanItem("kv cache", per_token * context * running,
                 f"{short_bytes_text(per_token)}/token × {context} tokens × {running} running"),
        PlanItem("prefix cache", per_token * profile.prefix_cache_tokens,
                 f"{short_bytes_text(per_token)}/token × {profile.prefix_cache_tokens} tokens kept "
                 "for reuse"),
    ]


def _workspace_item(shape: ModelShape, profile: Profile) -> PlanItem:
    note = f"{prefill_tokens(profile)}-token prefill step"
    if profile.quantization == "nf4":
        note += f" + one dequantized weight ({count_text(shape.largest_linear_params)} params)"
    return PlanItem("prefill workspace", workspace_bytes(shape, profile), note)


def _logits_item(shape: ModelShape, profile: Profile) -> PlanItem:
    return PlanItem("decode logits", logits_bytes(shape, profile.max_running),
                    f"float32 × {LOGIT_COPIES} copies × {profile.max_running} running × "
                    f"{shape.vocab_size} vocab")


def _cuda_items(shape: ModelShape, profile: Profile, counts_cuda_context: bool) -> list[PlanItem]:
    items = []
    if counts_cuda_context:
        items.append(PlanItem("cuda context", CUDA_CONTEXT_BYTES,
                              "driver context + cuBLAS workspace, part of a --gpu-memory total"))
    if profile.compile == "reduce-overhead":
        # Only the decode step is captured: its private pool holds one step's activations,
        # at most the float32 attention scores of every running row over the whole capacity.
        context = effective_context(shape, profile)
        scores = profile.max_running * shape.heads * context * 4
        items.append(PlanItem("cuda graph pool", CUDA_GRAPH_POOL_BYTES + scores,
                              f"reduce-overhead decode step: {short_bytes_text(CUDA_GRAPH_POOL_BYTES)} + "
                              f"float32 scores over {context} tokens × {profile.max_running} running"))
    return items


# --- the plan and its verdict ----------------------------------------------------------------


class MemoryBudget(msgspec.Struct, frozen=True):
    """The memory the plan may use and where that figure comes from.

    `counts_cuda_context` is set for a card's total given with --gpu-memory: the CUDA context
    still has to come out of it. Free memory measured in this process already excludes it.
    """

    bytes: int
    source: str
    counts_cuda_context: bool = False


class FourBitOption(msgspec.Struct, frozen=True):
    """The same model with NF4 weights: how to ask for it and what that plan needs."""

    change: str
    weights: int
    needed: int
    fits: bool


class Fixes(msgspec.Struct, frozen=True):
    """Changes that each make the plan fit on their own (None: no such value fits)."""

    max_context: int | None
    max_running: int | None
    prefix_cache_tokens: int | None
    four_bit: FourBitOption | None
    memory_needed: int


class MemoryPlan(msgspec.Struct, frozen=True):
    """The plan for one model and profile against one budget, with fixes when it does not fit."""

    model: str
    profile: Profile
    shape: ModelShape
    context: int
    items: tuple[PlanItem, ...]
    budget: MemoryBudget
    requests_at_context: int
    fixes: Fixes | None

    @property
    def needed(self) -> int:
        """Bytes the plan needs in all."""
        return sum(item.bytes for item in self.items)

    @property
    def fits(self) -> bool:
        """True when everything fits in the budget."""
        return self.needed <= self.budget.bytes

    @property
    def weight_bytes(self) -> int:
        """The weights line: what loading should measure on the device."""
        return next(item.bytes for item in self.items if item.name == "weights")


def memory_plan(
    shape: ModelShape, profile: Profile, budget: MemoryBudget, model: str = "model"
) -> MemoryPlan:
    """The plan, pure arithmetic: items, total, verdict, how many requests fit, and fixes if needed."""
    items = plan_items(shape, profile, budget.counts_cuda_context)
    needed = sum(item.bytes for item in items)
    return MemoryPlan(
        model=model, profile=profile, shape=shape, context=effective_context(shape, profile),
        items=items, budget=budget, requests_at_context=_requests_at_context(shape, profile, budget),
        fixes=None if needed <= budget.bytes else _fixes(shape, profile, budget, needed),
    )


def _fits(shape: ModelShape, profile: Profile, budget: MemoryBudget) -> bool:
    return sum(item.bytes for item in plan_items(shape, profile, budget.counts_cuda_context)) <= budget.bytes


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest value in [low, high] for which `fits` holds, if `fits` only turns False upwards."""
    if high < low or not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def _requests_at_context(shape: ModelShape, profile: Profile, budget: MemoryBudget) -> int:
    """How many requests at full context the budget holds next to everything else."""
    per_request = shape.kv_bytes_per_token(profile.dtype) * effective_context(shape, profile)
    upper = budget.bytes // max(per_request, 1) + 1
    most = _largest(lambda n: _fits(shape, replace(profile, max_running=n), budget), 0, upper)
    return most or 0


def _fixes(shape: ModelShape, profile: Profile, budget: MemoryBudget, needed: int) -> Fixes:
    """Each change that makes the plan fit on its own, found by re-planning with the same arithmetic."""
    cuda_context = CUDA_CONTEXT_BYTES if profile.device == "cuda" and not budget.counts_cuda_context else 0
    return Fixes(
        max_context=_fitting_context(shape, profile, budget),
        max_running=_largest(lambda n: _fits(shape, replace(profile, max_running=n), budget),
                             1, profile.max_running - 1),
        prefix_cache_tokens=_fitting_prefix_cache(shape, profile, budget),
        four_bit=_four_bit_option(shape, profile, budget, needed),
        memory_needed=needed + cuda_context,
    )


def _fitting_context(shape: ModelShape, profile: Profile, budget: MemoryBudget) -> int | None:
    """The largest shorter `max_context` (a multiple of CONTEXT_STEP, at least useful) that fits."""
    def fits(steps: int) -> bool:
        return _fits(shape, replace(profile, max_context=steps * CONTEXT_STEP), budget)

    shortest = math.ceil(max(MIN_USEFUL_CONTEXT, profile.prefill_chunk_tokens) / CONTEXT_STEP)
    steps = _largest(fits, shortest, (effective_context(shape, profile) - 1) // CONTEXT_STEP)
    return None if steps is None else steps * CONTEXT_STEP


def _fitting_prefix_cache(shape: ModelShape, profile: Profile, budget: MemoryBudget) -> int | None:
    """The largest smaller `prefix_cache_tokens` (a multiple of CONTEXT_STEP, maybe 0) that fits."""
    def fits(steps: int) -> bool:
        return _fits(shape, replace(profile, prefix_cache_tokens=steps * CONTEXT_STEP), budget)

    if profile.prefix_cache_tokens == 0:
        return None
    steps = _largest(fits, 0, (profile.prefix_cache_tokens - 1) // CONTEXT_STEP)
    return None if steps is None else steps * CONTEXT_STEP


def _four_bit_option(
    shape: ModelShape, profile: Profile, budget: MemoryBudget, needed: int
) -> FourBitOption | None:
    """16-bit weights: on CUDA the shipped 4-bit profile; on a CPU the same profile with nf4.

    Offered only where the weights are a real share of the plan (a tenth or more), not for a
    small model whose KV cache or headroom is what does not fit.
    """
    if profile.quantization != "none" or weight_bytes(shape, profile) * 10 < needed:
        return None
    if profile.device == "cuda":
        change, four_bit = f"--profile {FOUR_BIT_PROFILE}", load_profile(FOUR_BIT_PROFILE)
    else:
        change, four_bit = "quantization: nf4", replace(profile, quantization="nf4", double_quant=True)
    total = sum(item.bytes for item in plan_items(shape, four_bit, budget.counts_cuda_context))
    return FourBitOption(change, weight_bytes(shape, four_bit), total, total <= budget.bytes)


# --- measuring, and the whole check ----------------------------------------------------------


def gpu_memory_budget(size: str) -> MemoryBudget:
    """Plan against a card of `size` (`12GiB`, `24GB`) from any machine, CUDA or not."""
    try:
        total = parse_size(size)
    except ValueError as exc:
        raise ConfigError(f"--gpu-memory: {exc}", param="gpu_memory") from exc
    return MemoryBudget(total, f"--gpu-memory {size}", counts_cuda_context=True)


# --- profile auto --------------------------------------------------------------------------

AUTO_24GB_MIN = 22 * GiB  # a "24 GB" card reports ~23.6 GiB; leave room for driver differences
AUTO_12GB_MIN = 10 * GiB
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


class HardwareFacts(NamedTuple):
    """What `--profile auto` looks at."""

    cuda_total_bytes: int | None  # the current CUDA device's memory, None without CUDA
    cuda_name: str | None
    cpu_bf16: bool  # the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX)


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device (imports torch only here)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def detect_hardware() -> HardwareFacts:
    """CUDA device memory (if torch sees one) and the CPU's bfloat16 support, from /proc/cpuinfo."""
    total = name = None
    if cuda_available():
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        total, name = int(props.total_memory), str(props.name)
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        flags = []
    return HardwareFacts(total, name, any(flag in flags for flag in CPU_BF16_FLAGS))


def choose_profile(facts: HardwareFacts) -> tuple[str, str]:
    """The shipped profile for this hardware, and why, in words for the log."""
    if facts.cuda_total_bytes is not None:
        card = f"{facts.cuda_name or 'CUDA device'} with {bytes_text(facts.cuda_total_bytes)}"
        if facts.cuda_total_bytes >= AUTO_24GB_MIN:
            return "24gb-bf16-compile", (f"{card} (≥ {bytes_text(AUTO_24GB_MIN)}): 16-bit weights, "
                                         "compiled decode")
        if facts.cuda_total_bytes >= AUTO_12GB_MIN:
            above, below = bytes_text(AUTO_12GB_MIN), bytes_text(AUTO_24GB_MIN)
            return "12gb-4bit", f"{card} (≥ {above}, < {below}): 4-bit weights"
        return "12gb-4bit", (f"{card}, below {bytes_text(AUTO_12GB_MIN)}: the smallest GPU profile; the "
                             "memory plan will say whether it fits and what to lower")
    if facts.cpu_bf16:
        return "cpu-bf16", "no CUDA device; the CPU has native bfloat16 (AVX512-BF16/AMX)"
    return "cpu", "no CUDA device, and the CPU has no native bfloat16: float32"


def measure_budget(profile: Profile) -> MemoryBudget:
    """Memory free for the model now: available RAM, or free memory on the CUDA device."""
    if profile.device == "cpu":
        return MemoryBudget(psutil.virtual_memory().available, "available RAM now")
    free, total = _cuda_free_memory(profile)
    return MemoryBudget(free, f"measured free now, of {bytes_text(total)} on the card")


def _cuda_free_memory(profile: Profile) -> tuple[int, int]:
    """(free, total) bytes on the current CUDA device; refuses when there is no usable CUDA."""
    if not cuda_available():
        raise DeviceUnavailable(
            f"profile `{profile.name}` runs on CUDA, but CUDA is not available here (no GPU visible, "
            "or the driver is not ready: does nvidia-smi work?). Plan from any machine with "
            "`llmd check --gpu-memory 24GiB`, or run on the CPU with `--profile cpu`")
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)


def plan_for_model(model: str | Path, profile: Profile, gpu_memory: str | None = None,
                   label: str | None = None) -> MemoryPlan:
    """Read the model's shape, measure (or take --gpu-memory), and plan. Loads no weights."""
    if gpu_memory is not None and profile.device != "cuda":
        raise ConfigError(f"--gpu-memory plans a CUDA profile, but profile `{profile.name}` runs on "
                          f"the {profile.device}, which is planned against available RAM", param="gpu_memory")
    shape = read_model_shape(model)
    budget = gpu_memory_budget(gpu_memory) if gpu_memory is not None else measure_budget(profile)
    return memory_plan(shape, profile, budget, label or Path(model).name)


# --- rendering -------------------------------------------------------------------------------


def render_plan(plan: MemoryPlan) -> str:
    """The plan as a plain-text table: one line per item, the total, the budget and the verdict."""
    rows = [*plan.items, PlanItem("total", plan.needed, ""),
            PlanItem("available", plan.budget.bytes, plan.budget.source)]
    width = max(len(bytes_text(item.bytes)) for item in rows)
    table = [f"  {item.name:<18}{bytes_text(item.bytes):>{width}}  {item.note}".rstrip() for item in rows]
    return "\n".join([*_header_lines(plan), "", *table, "", *_verdict_lines(plan)])


def _header_lines(plan: MemoryPlan) -> list[str]:
    shape, profile = plan.shape, plan.profile
    context = f"{plan.context} tokens per request, {profile.max_running} running"
    if plan.context < profile.max_context:
        context += (f" (profile max_context {profile.max_context} is capped by the model's "
                    f"max_position_embeddings {shape.max_position_embeddings})")
    return [
        f"memory plan: {plan.model} with profile {profile.name} ({_profile_summary(profile)})",
        f"  model     {count_text(shape.params)} params (from {shape.counted_from}), {shape.layers} layers, "
        f"hidden {shape.hidden_size}, {shape.heads} heads, {shape.kv_heads} kv heads × {shape.head_dim}",
        f"  context   {context}",
    ]


def _profile_summary(profile: Profile) -> str:
    parts: list[str] = [profile.device, profile.dtype]
    if profile.quantization == "nf4":
        parts.append("nf4 + double quant" if profile.double_quant else "nf4")
    parts.append(f"{profile.kv_cache} kv cache")
    if profile.compile != "none":
        parts.append(f"compile {profile.compile}")
    return ", ".join(parts)


def _verdict_lines(plan: MemoryPlan) -> list[str]:
    room = (f"room for {plan.requests_at_context} requests at {plan.context} tokens "
            f"(max_running is {plan.profile.max_running})")
    if plan.fixes is None:
        return [room, f"FITS: {bytes_text(plan.budget.bytes - plan.needed)} to spare"]
    short = bytes_text(plan.needed - plan.budget.bytes)
    return [room, f"DOES NOT FIT: {short} short. Each of these fixes it on its own, "
                  "unless it says otherwise:", *_fix_lines(plan, plan.fixes)]


def _fix_lines(plan: MemoryPlan, fixes: Fixes) -> list[str]:
    profile, lines = plan.profile, []
    if fixes.max_context is not None:
        note = f"keeps max_running {profile.max_running}"
        lines.append(_fix_line(f"max_context: {fixes.max_context}", note))
    if fixes.max_running is not None:
        lines.append(_fix_line(f"max_running: {fixes.max_running}", f"keeps max_context {plan.context}"))
    if fixes.prefix_cache_tokens is not None:
        note = "0 turns prefix reuse off" if fixes.prefix_cache_tokens == 0 else "a smaller prefix cache"
        lines.append(_fix_line(f"prefix_cache_tokens: {fixes.prefix_cache_tokens}", note))
    if fixes.four_bit is not None:
        lines.append(_four_bit_line(plan, fixes.four_bit))
    where = "a card with" if profile.device == "cuda" else "a machine with"
    lines.append(_fix_line(f"{where} at least {math.ceil(fixes.memory_needed / GiB)} GiB",
                           f"this plan needs {bytes_text(fixes.memory_needed)} in all"))
    return lines


def _four_bit_line(plan: MemoryPlan, option: FourBitOption) -> str:
    verdict = "fits" if option.fits else "does not fit either"
    weights = bytes_text(plan.weight_bytes)
    return _fix_line(option.change, f"NF4 weights {bytes_text(option.weights)} instead of {weights}; "
                                    f"needs {bytes_text(option.needed)} in all: {verdict}")


def _fix_line(change: str, note: str) -> str:
    return f"  {change:<28} {note}"


