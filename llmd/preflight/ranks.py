"""The memory plan of one GPU of a parallel deployment (issue 18's `engine: vllm`): pure arithmetic.

Under tensor parallelism (TP) each GPU of a pipeline stage holds a 1/TP slice of every sharded
tensor: the q/o projections and the MLP, the vocabulary-parallel embedding and output head. Key
and value heads are sharded too while there are at least TP of them; with fewer, each GPU holds
one whole head (vLLM replicates them), so TP beyond the KV heads stops shrinking the KV cache.
Norms are replicated. Pipeline parallelism (PP) gives each stage a run of layers (vLLM's split:
even shares, the remainder to the stages before the last), the embedding to the first stage and
the final norm and output head to the last (a tied head is then a copy of its own). Data
parallelism (DP) repeats the whole TP x PP group: it adds GPUs, not memory per GPU.

`rank_plan` checks what vLLM would refuse later, after minutes of starting processes: heads not
divisible by TP, KV heads neither divisible by TP nor dividing it, fewer layers than stages, more
GPUs than the machines have, and a GPU that cannot hold its weights and one full-length sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from llmd.config import Parallel, Profile, parse_size
from llmd.errors import ConfigError
from llmd.preflight.plan import CUDA_CONTEXT_BYTES, effective_context, workspace_bytes
from llmd.preflight.shape import DTYPE_BYTES, ModelShape, read_model_shape
from llmd.units import short_bytes_text

# KV-cache element types vLLM offers beside the compute dtype ("auto").
KV_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# vLLM pads the vocabulary of its parallel embedding and head to a multiple of this per shard group.
VOCAB_PADDING = 64


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One GPU of pipeline stage `stage` (every TP rank and DP replica of it holds the same)."""

    stage: int
    layers: int
    weight_bytes: int
    kv_heads: int  # key/value heads this GPU holds per layer
    kv_bytes_per_token: int
    kv_cache_bytes: int  # what is left for the KV cache (negative: the weights alone do not fit)

    @property
    def tokens(self) -> int:
        """Tokens of KV cache this GPU holds (0 when nothing is left)."""
        return max(0, self.kv_cache_bytes) // max(1, self.kv_bytes_per_token)


@dataclass(frozen=True, slots=True)
class RankPlan:
    """The plan per GPU, what would make vLLM refuse (with fixes), and what only warrants a warning."""

    model: str
    shape: ModelShape
    parallel: Parallel
    gpu_bytes: int
    gpus_per_node: int
    overhead_bytes: int
    stages: tuple[StagePlan, ...]
    context: int
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.refusals

    @property
    def weight_bytes(self) -> int:
        """Weights on the fullest GPU."""
        return max(stage.weight_bytes for stage in self.stages)


def stage_layers(layers: int, pipeline: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them: even shares, then the remainder one each to
    the stages before the last (which also runs the output head), from the second-to-last back."""
    shares = [layers // pipeline] * pipeline
    for index in range(layers % pipeline):
        shares[-2 - index] += 1
    return shares


def kv_heads_per_gpu(kv_heads: int, tensor: int) -> int:
    """Key/value heads one GPU holds: its share, or one whole (replicated) head when TP exceeds them."""
    return max(1, kv_heads // tensor)


def padded_vocab(vocab_size: int, tensor: int) -> int:
    """The vocabulary rows of a parallel embedding or head, padded so every TP shard is whole."""
    return math.ceil(vocab_size / (VOCAB_PADDING * tensor)) * VOCAB_PADDING * tensor


def plan_ranks_for_model(model: str | Path, profile: Profile, gpu_memory: str | None, gpus: int | None,
                         label: str) -> RankPlan:
    """`llmd check` for an `engine: vllm` profile: each GPU of `gpus` per node of `gpu_memory` each."""
    if gpu_memory is None or gpus is None:
        raise ConfigError(f"profile `{profile.name}` runs vLLM on {profile.parallel.sizes}: plan it with "
                          "--gpus N (per node) and --gpu-memory SIZE (per GPU), e.g. --gpus 8 --gpu-memory "
                          "80GiB", param="gpus")
    if gpus < 1:
        raise ConfigError(f"--gpus: {gpus} is not a GPU count", param="gpus")
    try:
        gpu_bytes = parse_size(gpu_memory)
    except ValueError as exc:
        raise ConfigError(f"--gpu-memory: {exc}", param="gpu_memory") from exc
    return plan_ranks(model, profile, gpu_bytes, gpus, label)


def plan_ranks(model: str | Path, profile: Profile, gpu_bytes: int, gpus: int, label: str) -> RankPlan:
    """The plan of `profile` for `model` on nodes of `gpus` GPUs of `gpu_bytes` each."""
    shape = read_model_shape(model)
    tp = profile.parallel.tensor
    # per GPU: the CUDA context, a TP slice of the prefill activations, the profile's headroom
    overhead = CUDA_CONTEXT_BYTES + workspace_bytes(shape, profile) // tp + profile.headroom_bytes
    return rank_plan(shape, profile.parallel, gpu_bytes=gpu_bytes, gpus_per_node=gpus, dtype=profile.dtype,
                     kv_dtype=profile.kv_cache_dtype, context=effective_context(shape, profile),
                     overhead_bytes=overhead, model=label)


def rank_plan(shape: ModelShape, parallel: Parallel, *, gpu_bytes: int, gpus_per_node: int, dtype: str,
              kv_dtype: str, context: int, overhead_bytes: int, model: str = "model") -> RankPlan:
    """Each stage's GPU: weights, KV bytes per token, what is left for the KV cache; refusals and
    warnings. `overhead_bytes` is what a GPU holds besides weights and KV (CUDA context, activations,
    graphs, headroom); `kv_dtype` "auto" is the compute dtype."""
    tp, pp = parallel.tensor, parallel.pipeline
    weight, kv = DTYPE_BYTES[dtype], KV_DTYPE_BYTES[dtype if kv_dtype == "auto" else kv_dtype]
    refusals, warnings = _shape_refusals(shape, parallel, gpus_per_node), []
    if shape.kv_heads < tp:
        warnings.append(f"tensor parallel size {tp} exceeds the model's {shape.kv_heads} KV heads: each GPU "
                        f"holds a whole replicated head, so the KV cache per GPU stops shrinking past TP "
                        f"{shape.kv_heads}")
    heads = kv_heads_per_gpu(shape.kv_heads, tp)
    layer_params = _layer_params_per_gpu(shape, tp, heads)
    vocab_params = padded_vocab(shape.vocab_size, tp) * shape.hidden_size // tp
    stages = []
    for index, layers in enumerate(stage_layers(shape.layers, pp) if shape.layers >= pp else [0] * pp):
        params = layers * layer_params
        params += vocab_params if index == 0 else 0  # the embedding
        last_head = index == pp - 1 and (not shape.tie_word_embeddings or pp > 1)
        params += vocab_params if last_head else 0  # the output head (tied: shared on one stage)
        params += shape.hidden_size if index == pp - 1 else 0  # the final norm
        kv_per_token = 2 * layers * heads * shape.head_dim * kv
        weights = params * weight
        left = gpu_bytes - weights - overhead_bytes
        stages.append(StagePlan(index, layers, weights, heads, kv_per_token, left))
    for stage in stages:
        refusals += _memory_refusals(stage, parallel, context, gpu_bytes)
    return RankPlan(model, shape, parallel, gpu_bytes, gpus_per_node, overhead_bytes, tuple(stages), context,
                    tuple(refusals), tuple(warnings))


def _layer_params_per_gpu(shape: ModelShape, tensor: int, kv_heads: int) -> int:
    """One decoder layer's parameters on one GPU: the sharded projections and MLP, its KV heads, the
    replicated norms (Llama-family arithmetic, as `shape_from_config`'s)."""
    hidden, dim = shape.hidden_size, shape.head_dim
    query_output = 2 * hidden * shape.heads * dim // tensor  # q and o, sharded by heads
    key_value = 2 * hidden * kv_heads * dim
    mlp = 3 * hidden * shape.intermediate_size // tensor
    return query_output + key_value + mlp + 2 * hidden


def _shape_refusals(shape: ModelShape, parallel: Parallel, gpus_per_node: int) -> list[str]:
    tp, pp, total = parallel.tensor, parallel.pipeline, parallel.gpus
    refusals, gpus = [], gpus_per_node * parallel.nodes
    if shape.heads % tp:
        fits = [n for n in (1, 2, 4, 8, 16) if shape.heads % n == 0 and n <= gpus]
        refusals.append(f"the model's {shape.heads} attention heads do not divide by tensor parallel size "
                        f"{tp}; use one of {', '.join(map(str, fits))}")
    if shape.kv_heads % tp and tp % shape.kv_heads:
        refusals.append(f"the model's {shape.kv_heads} KV heads neither divide by tensor parallel size {tp} "
                        "nor divide it; vLLM cannot shard or replicate them evenly")
    if shape.layers < pp:
        refusals.append(f"pipeline parallel size {pp} exceeds the model's {shape.layers} layers")
    if total > gpus:
        refusals.append(f"tensor {tp} x pipeline {pp} x data {parallel.data} = {total} GPUs, but "
                        f"{parallel.nodes} node(s) x {gpus_per_node} GPU(s) = {gpus}; add nodes or lower a "
                        "parallel size")
    return refusals


def _memory_refusals(stage: StagePlan, parallel: Parallel, context: int, gpu_bytes: int) -> list[str]:
    one_sequence = stage.kv_bytes_per_token * context
    if stage.kv_cache_bytes >= one_sequence:
        return []
    where = f"pipeline stage {stage.stage}" if parallel.pipeline > 1 else "each GPU"
    fixes = "a larger tensor parallel size, more pipeline stages, fp8 weights or KV cache"
    if stage.kv_cache_bytes <= 0:
        return [f"{where} needs {short_bytes_text(stage.weight_bytes)} of weights on a "
                f"{short_bytes_text(gpu_bytes)} GPU, leaving nothing for the KV cache; {fixes}"]
    longest = stage.kv_cache_bytes // max(1, stage.kv_bytes_per_token)
    return [f"{where} holds {longest} tokens of KV cache after its weights, fewer than one "
            f"{context}-token sequence; a max_context of at most {longest}, or {fixes}"]
