"""vLLM's engine arguments from an llmd profile: the one mapping the head and its workers share.

The head (llmd's engine, in process) and every headless worker node (`vllm serve --headless`,
written into its systemd unit by `llmd install-service --worker`) start from the same profile
through `engine_args`, so their parallel sizes, dtype, context and cache cannot drift apart.

Memory is what preflight computed (`kv_cache_memory_bytes`: the KV room of the fullest GPU in the
per-rank plan), never a utilization fraction vLLM would measure and never `cpu_offload_gb`. Pure:
no vLLM import here; the names are those of vLLM's `EngineArgs` (0.32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmd.config import Profile
from llmd.preflight.ranks import RankPlan

# vLLM reports usage statistics to a remote host unless told not to.
ENVIRONMENT = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def engine_args(model_dir: str, profile: Profile, plan: RankPlan) -> dict[str, Any]:
    """Keyword arguments for vLLM's `AsyncEngineArgs` that serve `model_dir` as `profile` says."""
    parallel = profile.parallel
    args: dict[str, Any] = {
        "model": model_dir,
        "dtype": profile.dtype,
        "kv_cache_dtype": profile.kv_cache_dtype,
        "max_model_len": plan.context,
        "max_num_seqs": profile.max_running,
        "tensor_parallel_size": parallel.tensor,
        "pipeline_parallel_size": parallel.pipeline,
        "data_parallel_size": parallel.data,
        "distributed_executor_backend": "mp",
        "enable_prefix_caching": profile.prefix_cache_tokens > 0,
        # compile: none is eager; any other mode leaves vLLM its own compilation and CUDA graphs
        "enforce_eager": profile.compile == "none",
        "kv_cache_memory_bytes": kv_cache_bytes(profile, plan),
    }
    if parallel.nodes > 1:
        args |= {"nnodes": parallel.nodes, "node_rank": parallel.node_rank,
                 "master_addr": parallel.master_addr}
    return args


def kv_cache_bytes(profile: Profile, plan: RankPlan) -> int:
    """vLLM's KV cache per GPU: the room the plan leaves on the fullest GPU. On a CPU the cache lives
    in the RAM everything else on the machine uses, and vLLM's CPU backend wants it free on one NUMA
    node, so it is capped at what can be used at once: `max_running` full-length requests and the
    prefix cache's tokens (a `vllm-cpu` profile planned on a 22 GiB machine asked for 20 GiB, and
    vLLM refused to start with 13 GiB free on its node)."""
    room = min(stage.kv_cache_bytes for stage in plan.stages)
    if profile.device != "cpu":
        return room
    tokens = profile.max_running * plan.context + profile.prefix_cache_tokens
    return min(room, tokens * max(stage.kv_bytes_per_token for stage in plan.stages))


def worker_command(args: dict[str, Any], node_rank: int) -> list[str]:
    """`vllm serve` flags for a headless worker on node `node_rank`, from the head's `engine_args`."""
    verb, model, *flags = serve_command({**args, "node_rank": node_rank})
    return [verb, model, "--headless", *flags]


def serve_command(args: dict[str, Any]) -> list[str]:
    """`vllm serve MODEL --flag value ...` for `engine_args` (booleans as --x / --no-x)."""
    flags = ["serve", str(args["model"])]
    for key, value in args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


def cpu_thread_binding(profile: Profile, cores: Sequence[int]) -> dict[str, str]:
    """`VLLM_CPU_OMP_THREADS_BIND` for vLLM's CPU backend where its own `auto` cannot start: it binds
    each rank of a replica to a NUMA node of its own and refuses more ranks on a machine than nodes
    ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"). Each of the replica's
    ranks on this node gets its own contiguous share of `cores` ("0|1", "0-3|4-7"). Nothing for one
    rank, for data parallel (its replicas start with `auto`), off the CPU, or with fewer cores than
    ranks; a binding the environment already sets wins (the caller sets it only when absent)."""
    parallel = profile.parallel
    ranks = parallel.tensor * parallel.pipeline // max(parallel.nodes, 1)
    if profile.device != "cpu" or parallel.data > 1 or ranks < 2 or len(cores) < ranks:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(core_shares(cores, ranks))}


def core_shares(cores: Sequence[int], ranks: int) -> list[str]:
    """`cores` split into `ranks` contiguous even shares, each as vLLM reads a binding (`core_range`);
    cores left over by the division go unused."""
    ordered, share = sorted(cores), len(cores) // ranks
    return [core_range(ordered[rank * share:(rank + 1) * share]) for rank in range(ranks)]


def core_range(cores: Sequence[int]) -> str:
    """Sorted core ids as vLLM reads them: "3", or "0-3" when they run on without a gap, else "0,2"."""
    if len(cores) > 1 and cores[-1] - cores[0] == len(cores) - 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))
