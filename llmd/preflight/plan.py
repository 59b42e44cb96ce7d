"""The memory plan: what a profile will hold for a model, whether it fits, and what would.

The plan adds up what the profile will hold — weights, the KV cache of the running set and of
the prefix cache, the prefill workspace, the decode logits, CUDA overheads and the headroom —
and compares the total with the budget. When it does not fit, the same arithmetic finds the
fixes: the largest `max_context` and `max_running` that fit, a smaller prefix cache, 4-bit
weights, or the card size the plan needs as it stands. All of it is pure arithmetic over a
`ModelShape` (shape.py) and a `MemoryBudget` (hardware.py); `plan_for_model` reads the one,
measures the other and plans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import msgspec
from msgspec.structs import replace

from llmd.config import Profile, load_profile
from llmd.errors import ConfigError
from llmd.preflight.hardware import MemoryBudget, gpu_memory_budget, measure_budget
from llmd.preflight.shape import DTYPE_BYTES, ModelShape, context_limit, read_model_shape
from llmd.units import MiB, count_text, short_bytes_text

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


class PlanItem(msgspec.Struct, frozen=True):
    """One line of the plan: what holds memory, how much, and why that much."""

    name: str
    bytes: int
    note: str


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
    # Why the profile's `lone_step: max-autotune` is planned (and served) as `compiled`, if it is
    dropped_copy: str | None = None

    @property
    def needed(self) -> int:
        """Bytes the plan needs in all (loading's peak when that is more than serving holds)."""
        return needed_bytes(self.items, self.shape, self.profile)

    @property
    def load_peak(self) -> int:
        """What loading holds at its peak when it differs from the weights served (int8); else 0."""
        return load_peak_bytes(self.shape, self.profile)

    @property
    def fits(self) -> bool:
        """True when everything fits in the budget."""
        return self.needed <= self.budget.bytes

    @property
    def weight_bytes(self) -> int:
        """The weights line: what loading should measure on the device."""
        return next(item.bytes for item in self.items if item.name == "weights")


def plan_for_model(model: str | Path, profile: Profile, gpu_memory: str | None = None,
                   label: str | None = None) -> MemoryPlan:
    """Read the model's shape, measure (or take --gpu-memory), and plan. Loads no weights."""
    if gpu_memory is not None and profile.device != "cuda":
        raise ConfigError(f"--gpu-memory plans a CUDA profile, but profile `{profile.name}` runs on "
                          f"the {profile.device}, which is planned against available RAM", param="gpu_memory")
    shape = read_model_shape(model)
    budget = gpu_memory_budget(gpu_memory) if gpu_memory is not None else measure_budget(profile)
    return memory_plan(shape, profile, budget, label or Path(model).name)


def memory_plan(
    shape: ModelShape, profile: Profile, budget: MemoryBudget, model: str = "model"
) -> MemoryPlan:
    """The plan, pure arithmetic: items, total, verdict, how many requests fit, and fixes if needed.

    `lone_step: max-autotune`'s copy of the weights is a speed-up, not something the requests
    need: when the plan with it does not fit, the profile is planned with `lone_step: compiled`
    (the same graph on the one copy of the weights) and the plan says so (`dropped_copy`); the
    plan's `profile` is what to load."""
    items = plan_items(shape, profile, budget.counts_cuda_context)
    needed = needed_bytes(items, shape, profile)
    dropped = None
    if needed > budget.bytes and profile.lone_step == "max-autotune":
        copy = short_bytes_text(lone_step_copy_bytes(shape, profile))
        dropped = f"lone_step: max-autotune planned as compiled: its GEMM template copy ({copy}) does not fit"
        profile = replace(profile, lone_step="compiled")
        items = plan_items(shape, profile, budget.counts_cuda_context)
        needed = needed_bytes(items, shape, profile)
    return MemoryPlan(
        model=model, profile=profile, shape=shape, context=effective_context(shape, profile),
        items=items, budget=budget, requests_at_context=_requests_at_context(shape, profile, budget),
        fixes=None if needed <= budget.bytes else _fixes(shape, profile, budget, needed),
        dropped_copy=dropped,
    )


def effective_context(shape: ModelShape, profile: Profile) -> int:
    """Tokens per request: the profile's `max_context`, capped by the model's position limit."""
    return context_limit(shape.max_position_embeddings, profile)


def nf4_bits(profile: Profile) -> float:
    """Bits per quantized weight, quantization constants included."""
    return NF4_DOUBLE_QUANT_BITS if profile.double_quant else NF4_BITS


def weight_bytes(shape: ModelShape, profile: Profile) -> int:
    """All weights in the compute dtype; with nf4 the decoder's linear weights at `nf4_bits`; with
    int8 those and the output head at a byte each (`matmul_params`), plus a scale per output row."""
    dtype_bytes = DTYPE_BYTES[profile.dtype]
    if profile.quantization == "none":
        return shape.params * dtype_bytes
    if profile.quantization == "int8":
        return matmul_params(shape) + (int8_rows(shape) + int8_kept_params(shape)) * dtype_bytes
    unquantized = shape.params - shape.linear_params
    return math.ceil(shape.linear_params * nf4_bits(profile) / 8) + unquantized * dtype_bytes


def matmul_params(shape: ModelShape) -> int:
    """The decode step's matmul weights: the decoder's linear layers and the output head (a tied
    one counted again: int8 and the GEMM template each hold it as their own copy)."""
    head = shape.embedding_params if shape.tie_word_embeddings else shape.lm_head_params
    return shape.linear_params + head


def int8_kept_params(shape: ModelShape) -> int:
    """Weights int8 leaves in the compute dtype: the embedding (a tied one too), norms, biases."""
    return shape.params - shape.linear_params - shape.lm_head_params


def int8_rows(shape: ModelShape) -> int:
    """Output rows (one scale each) of the int8 layers: per decoder layer q, k, v, o, gate, up and
    down, and the output head's vocabulary rows."""
    attention = (shape.heads + 2 * shape.kv_heads) * shape.head_dim + shape.hidden_size
    per_layer = attention + 2 * shape.intermediate_size + shape.hidden_size
    return shape.layers * per_layer + shape.vocab_size


def lone_step_copy_bytes(shape: ModelShape, profile: Profile) -> int:
    """The `lone step weights` line of `lone_step: max-autotune`: inductor's GEMM template packs
    its own copy of each matmul's weight where it outruns torch's kernel; planned as if it won
    everywhere: the decoder's linear layers and the output head (a tied one too), as the weights
    line holds them (int8: a byte each and the scales)."""
    if profile.quantization == "int8":
        return matmul_params(shape) + int8_rows(shape) * DTYPE_BYTES[profile.dtype]
    return matmul_params(shape) * DTYPE_BYTES[profile.dtype]


def load_peak_bytes(shape: ModelShape, profile: Profile) -> int:
    """int8: the weights are loaded in the compute dtype and quantized a layer at a time, before the
    KV cache or any workspace exists, so loading peaks at the compute-dtype weights plus the headroom.
    0 for every other profile, whose loaded weights are the weights served."""
    if profile.quantization != "int8":
        return 0
    return shape.params * DTYPE_BYTES[profile.dtype] + profile.headroom_bytes


def needed_bytes(items: tuple[PlanItem, ...], shape: ModelShape, profile: Profile) -> int:
    """What the plan needs: everything served at once, or loading's peak when that is more."""
    return max(sum(item.bytes for item in items), load_peak_bytes(shape, profile))


def prefill_tokens(profile: Profile) -> int:
    """Prompt tokens in the largest forward pass.

    That is `max_step_tokens` (a burst of newcomers prefilled together while nobody decodes),
    never less than one `prefill_chunk_tokens` chunk. A lone prompt's pieces
    (`lone_prefill_tokens`) are never larger: the config refuses it.
    """
    return max(profile.prefill_chunk_tokens, profile.max_step_tokens)


def workspace_bytes(shape: ModelShape, profile: Profile) -> int:
    """Peak activations of the largest prefill step, P = `prefill_tokens` tokens, in one layer
    (layers run one after another, so their activations do not add up).

    P * (4*hidden + (heads + 2*kv_heads)*head_dim + 3*intermediate) * dtype bytes: the
    residual stream, its normed copy, the attention output and the MLP output (4*hidden); the
    q, k and v projections; the MLP's gate, up and their product (3*intermediate). SDPA's
    fused kernels never hold the P * context score matrix, so it is not counted. With nf4,
    bitsandbytes dequantizes a whole weight for a multi-token matmul (and int8 does for a
    prefill's many rows), so the largest linear weight in the compute dtype is added.
    """
    dtype_bytes = DTYPE_BYTES[profile.dtype]
    per_token = (4 * shape.hidden_size + (shape.heads + 2 * shape.kv_heads) * shape.head_dim
                 + 3 * shape.intermediate_size)
    dequantized = shape.largest_linear_params if profile.quantization in ("nf4", "int8") else 0
    return (prefill_tokens(profile) * per_token + dequantized) * dtype_bytes


def logits_bytes(shape: ModelShape, running: int) -> int:
    """Decode logits for the running batch: running * vocab * float32 (4 bytes) * 3 copies.

    Only the last position's logits are computed (logits_to_keep=1), so the prompt length
    does not appear.
    """
    return running * shape.vocab_size * LOGIT_BYTES * LOGIT_COPIES


def plan_items(shape: ModelShape, profile: Profile, counts_cuda_context: bool) -> tuple[PlanItem, ...]:
    """Everything the profile will hold for this model, in bytes."""
    items = [_weights_item(shape, profile), *_kv_items(shape, profile), _workspace_item(shape, profile),
             _logits_item(shape, profile)]
    if profile.device == "cuda":
        items += _cuda_items(shape, profile, counts_cuda_context)
    if profile.lone_step == "max-autotune":
        items.append(PlanItem("lone step weights", lone_step_copy_bytes(shape, profile),
                              f"max-autotune: a GEMM template copy of {count_text(matmul_params(shape))} "
                              "linear params, at most"))
    items.append(PlanItem("headroom", profile.headroom_bytes, f"memory_headroom {profile.memory_headroom}"))
    return tuple(items)


def _weights_item(shape: ModelShape, profile: Profile) -> PlanItem:
    if profile.quantization == "none":
        note = f"{profile.dtype}, {count_text(shape.params)} params"
    elif profile.quantization == "int8":
        copy = " (the tied head as its own copy)" if shape.tie_word_embeddings else ""
        note = (f"int8 + a {profile.dtype} scale per row for {count_text(matmul_params(shape))} linear "
                f"params{copy}, {profile.dtype} for {count_text(int8_kept_params(shape))}")
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
    if profile.quantization in ("nf4", "int8"):
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


def _fits(shape: ModelShape, profile: Profile, budget: MemoryBudget) -> bool:
    items = plan_items(shape, profile, budget.counts_cuda_context)
    return needed_bytes(items, shape, profile) <= budget.bytes


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
    total = needed_bytes(plan_items(shape, four_bit, budget.counts_cuda_context), shape, four_bit)
    return FourBitOption(change, weight_bytes(shape, four_bit), total, total <= budget.bytes)
