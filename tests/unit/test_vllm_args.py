"""vLLM's engine arguments and a headless worker's command, from one profile and its per-GPU plan;
vLLM's sampling parameters from a request's."""

from __future__ import annotations

from llmd.config import Parallel, Profile
from llmd.engine.types import SamplingParams
from llmd.engine.vllm.args import ENVIRONMENT, cpu_thread_binding, engine_args, kv_cache_bytes, worker_command
from llmd.engine.vllm.sampling import sampling_kwargs
from llmd.preflight.ranks import rank_plan
from llmd.preflight.shape import shape_from_config
from tests.helpers.configs import LLAMA_3_1_70B

SHAPE = shape_from_config(LLAMA_3_1_70B)


def profile(**parallel: object) -> Profile:
    return Profile(name="tp", engine="vllm", device="cuda", dtype="bfloat16", max_running=16,
                   max_context=8192, parallel=Parallel(**parallel))  # type: ignore[arg-type]


def test_the_engine_arguments_come_from_the_profile_and_the_plan() -> None:
    tp4_pp2 = profile(tensor=4, pipeline=2)
    plan = rank_plan(SHAPE, tp4_pp2.parallel, gpu_bytes=80 << 30, gpus_per_node=8, dtype="bfloat16",
                     kv_dtype="auto", context=6144, overhead_bytes=2 << 30)
    args = engine_args("/models/llama", tp4_pp2, plan)
    assert args == {
        "model": "/models/llama", "dtype": "bfloat16", "kv_cache_dtype": "auto", "max_model_len": 6144,
        "max_num_seqs": 16, "tensor_parallel_size": 4, "pipeline_parallel_size": 2, "data_parallel_size": 1,
        "distributed_executor_backend": "mp", "enable_prefix_caching": True, "enforce_eager": True,
        "kv_cache_memory_bytes": min(stage.kv_cache_bytes for stage in plan.stages),
    }
    assert ENVIRONMENT["VLLM_NO_USAGE_STATS"] == "1"  # no usage report to a remote host


def test_on_a_cpu_the_kv_cache_holds_what_the_running_requests_and_prefix_cache_can_use() -> None:
    cpu = Profile(name="c", engine="vllm", device="cpu", dtype="float32", max_running=8, max_context=4096,
                  prefix_cache_tokens=16384)
    plan = rank_plan(SHAPE, cpu.parallel, gpu_bytes=512 << 30, gpus_per_node=1, dtype="float32",
                     kv_dtype="auto", context=4096, overhead_bytes=1 << 30)
    per_token = plan.stages[0].kv_bytes_per_token
    assert kv_cache_bytes(cpu, plan) == (8 * 4096 + 16384) * per_token < plan.stages[0].kv_cache_bytes
    small = rank_plan(SHAPE, cpu.parallel, gpu_bytes=290 << 30, gpus_per_node=1, dtype="float32",
                      kv_dtype="auto", context=4096, overhead_bytes=1 << 30)
    assert kv_cache_bytes(cpu, small) == small.stages[0].kv_cache_bytes  # less room than that: the room
    gpu = profile(tensor=8)
    on_gpus = rank_plan(SHAPE, gpu.parallel, gpu_bytes=80 << 30, gpus_per_node=8, dtype="bfloat16",
                        kv_dtype="auto", context=8192, overhead_bytes=2 << 30)
    assert kv_cache_bytes(gpu, on_gpus) == on_gpus.stages[0].kv_cache_bytes  # a GPU's room is vLLM's


def test_several_nodes_add_the_rendezvous_and_the_worker_command_repeats_every_argument() -> None:
    two_nodes = profile(tensor=8, pipeline=2, nodes=2, master_addr="10.0.0.1")
    plan = rank_plan(SHAPE, two_nodes.parallel, gpu_bytes=80 << 30, gpus_per_node=8, dtype="bfloat16",
                     kv_dtype="auto", context=8192, overhead_bytes=2 << 30)
    args = engine_args("/models/llama", two_nodes, plan) | {"enable_prefix_caching": False}
    assert (args["nnodes"], args["node_rank"], args["master_addr"]) == (2, 0, "10.0.0.1")
    command = worker_command(args, node_rank=1)
    assert command[:3] == ["serve", "/models/llama", "--headless"]
    flags = command[3:]
    values = {flag: value for flag, value in zip(flags, [*flags[1:], "--"], strict=True)
              if flag.startswith("--") and not value.startswith("--")}
    switches = {flag for flag, after in zip(flags, [*flags[1:], "--"], strict=True)
                if flag.startswith("--") and after.startswith("--")}
    assert values["--tensor-parallel-size"] == "8" and values["--node-rank"] == "1"
    assert values["--master-addr"] == "10.0.0.1" and values["--kv-cache-dtype"] == "auto"
    assert values["--kv-cache-memory-bytes"] == str(args["kv_cache_memory_bytes"])
    assert switches == {"--no-enable-prefix-caching", "--enforce-eager"}
    assert len(values) + len(switches) == len(args) - 1  # every argument but the model, once
    assert "--model" not in command


def test_a_request_samples_on_vllm_as_it_asked_and_returns_ids_one_token_a_delta() -> None:
    params = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, top_k=40, seed=2**64 - 1,
                            presence_penalty=0.5, frequency_penalty=0.25, stop=("\n\n",), min_p=0.05,
                            repetition_penalty=1.1, stop_token_ids=(7,), min_tokens=3,
                            logit_bias=((5, -100.0), (9, 2.5)), logprobs=2, prompt_logprobs=1)
    kwargs = sampling_kwargs(params)
    assert kwargs == {
        "n": 1, "max_tokens": 64, "min_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
        "min_p": 0.05, "seed": 2**64 - 1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "repetition_penalty": 1.1, "stop_token_ids": [7], "ignore_eos": False,
        "logit_bias": {5: -100.0, 9: 2.5}, "logprobs": 2, "prompt_logprobs": 1,
        "detokenize": False, "stream_interval": 1,
    }  # no stop strings: llmd finds them in its own text and aborts the request
    greedy = sampling_kwargs(SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert greedy["temperature"] == 0.0 and greedy["logit_bias"] is None and greedy["ignore_eos"]


def test_a_cpu_replicas_ranks_get_their_own_cores_where_vllms_auto_binding_refuses() -> None:
    def cpu(**parallel: object) -> Profile:
        return Profile(name="c", engine="vllm", device="cpu", dtype="float32",
                       parallel=Parallel(**parallel))  # type: ignore[arg-type]

    bind = "VLLM_CPU_OMP_THREADS_BIND"
    assert cpu_thread_binding(cpu(tensor=2), [0, 1]) == {bind: "0|1"}
    assert cpu_thread_binding(cpu(tensor=2, pipeline=2), range(8)) == {bind: "0-1|2-3|4-5|6-7"}
    assert cpu_thread_binding(cpu(tensor=2), [0, 2, 4, 6, 7]) == {bind: "0,2|4,6"}  # a spare core unused
    two_nodes = cpu(tensor=2, nodes=2, master_addr="10.0.0.1")
    assert cpu_thread_binding(two_nodes, [0, 1]) == {}  # one rank here: vLLM's own binding
    assert cpu_thread_binding(cpu(), [0, 1]) == {}
    assert cpu_thread_binding(cpu(data=2), [0, 1]) == {}
    assert cpu_thread_binding(cpu(tensor=4), [0, 1]) == {}  # fewer cores than ranks: vLLM says why
    assert cpu_thread_binding(profile(tensor=2), [0, 1]) == {}  # CUDA
