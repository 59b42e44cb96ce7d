"""llmd's vLLM engine split across processes (issue 18), on vLLM's CPU backend and the small demo
model in float32: tensor parallel 2 gives tensor parallel 1's greedy tokens; data parallel 2 serves
concurrent streams, one event per token; two "nodes" over loopback (llmd's engine as the head, node
rank 0, and vLLM's headless worker for node rank 1, started from the same engine arguments through
`worker_command`, as `llmd install-service --worker` writes it) give tensor parallel 1's tokens again.

One engine runs at a time and is shut down before the next (two cores, 24 GB), and every test
leaves no process behind. vLLM's CPU backend binds each rank's threads to a NUMA node of its own
(`VLLM_CPU_OMP_THREADS_BIND=auto`) and refuses more ranks of one replica than the machine has
nodes ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"): llmd gives each
rank of tensor parallel 2 its own share of the cores itself (`cpu_thread_binding`), and the test of
two "nodes" on one machine binds each node to its own core.

Skipped without vLLM; run in the vLLM environment (README: "The vLLM environment"). Each engine
starts in 20-60 s on a CPU.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import warnings
from pathlib import Path

import msgspec
import pytest

from llmd.config import Parallel, Profile
from llmd.engine.types import FinishReason, SamplingParams, TokenEvent
from llmd.engine.vllm.args import ENVIRONMENT, core_shares, engine_args, worker_command
from llmd.engine.vllm.engine import VllmEngine
from llmd.engine.vllm.launch import vllm_engine
from llmd.preflight.ranks import RankPlan, plan_ranks
from llmd.service.worker import VLLM_CLI
from tests.helpers import processes
from tests.helpers.processes import GONE_SECONDS, group_members, signal_group, vllm_titles
from tests.helpers.vllm_engines import read, running
from tests.helpers.waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # vLLM's imports trip torch's own deprecations
    pytest.importorskip("vllm")

PROFILE = Profile(name="vllm-parallel", engine="vllm", device="cpu", dtype="float32", compile="none",
                  max_context=256, max_running=8, max_queue=8, prefix_cache_tokens=0)
CHATS = ([{"role": "user", "content": "Hello there"}],
         [{"role": "user", "content": "Name three colours"}],
         [{"role": "system", "content": "Answer briefly."},
          {"role": "user", "content": "Why is the sky blue?"}])
TOKENS = 16
GREEDY = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
LOOPBACK = "127.0.0.1"
BIND = "VLLM_CPU_OMP_THREADS_BIND"

Replies = list[list[str]]  # per chat, one text per token


def core_bindings(ranks: int) -> list[str]:
    """vLLM's thread binding for `ranks` ranks on this machine: its cores split into even shares."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        pytest.skip(f"{ranks} ranks need {ranks} cores; this machine lets the test use {len(cores)}")
    return core_shares(cores, ranks)


def profile_on(parallel: Parallel) -> Profile:
    return msgspec.structs.replace(PROFILE, parallel=parallel)


def planned(model: Path, profile: Profile) -> RankPlan:
    """The profile planned on 4 GiB "GPUs", as many per node as it has ranks on one node (vLLM's CPU
    backend sizes its KV cache from the plan, as `llmd serve` does)."""
    parallel = profile.parallel
    plan = plan_ranks(model, profile, 4 << 30, parallel.gpus // parallel.nodes, label="small")
    assert plan.fits, plan.refusals
    return plan


def engine_on(model: Path, parallel: Parallel) -> VllmEngine:
    """llmd's vLLM engine for the test profile on `parallel`, built as `llmd serve` builds it."""
    profile = profile_on(parallel)
    return vllm_engine(str(model), profile, planned(model, profile), fim_template=None)


def one_event_per_token(events: list[TokenEvent]) -> list[str]:
    """The reply's texts, one per token, after checking it ran to its length one event at a time."""
    assert [event.completion_tokens for event in events] == list(range(1, TOKENS + 1))
    assert events[-1].finish_reason is FinishReason.LENGTH
    return [event.text for event in events]


async def greedy_replies(engine: VllmEngine) -> Replies:
    """Each chat's greedy reply, one request at a time."""
    return [one_event_per_token(await read(engine.submit(await engine.encode_chat(chat), GREEDY)))
            for chat in CHATS]


async def served(engine: VllmEngine) -> tuple[Replies, list[str]]:
    """The greedy replies of a started engine, and vLLM's processes that served them."""
    async with running(engine):
        return await greedy_replies(engine), vllm_titles()


@pytest.fixture(scope="module")
def single_rank_replies(vllm_model: Path) -> Replies:
    """The greedy replies on one rank: what every split must reproduce."""
    with processes.no_process_left():
        replies, _ = asyncio.run(served(engine_on(vllm_model, Parallel())))
    return replies


def test_tensor_parallel_2_gives_tensor_parallel_1s_greedy_tokens(
        vllm_model: Path, single_rank_replies: Replies, no_process_left: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND, raising=False)  # llmd binds each rank to its own cores (cpu_thread_binding)
    replies, titles = asyncio.run(served(engine_on(vllm_model, Parallel(tensor=2))))
    assert sum("Worker" in name for name in titles) == 2, titles
    assert replies == single_rank_replies


def test_data_parallel_2_serves_concurrent_streams_one_event_per_token(
        vllm_model: Path, no_process_left: None) -> None:
    engine = engine_on(vllm_model, Parallel(data=2))  # vLLM's own binding: replicas share the cores

    async def concurrently() -> tuple[list[list[TokenEvent]], list[str]]:
        async with running(engine):
            prompts = [await engine.encode_chat(chat) for chat in CHATS]
            streams = [engine.submit(prompt, GREEDY) for prompt in prompts * 2]
            return list(await asyncio.gather(*map(read, streams))), vllm_titles()

    replies, titles = asyncio.run(concurrently())
    assert sum("EngineCore" in name for name in titles) == 2, titles
    for events in replies:
        one_event_per_token(events)


async def exits_early(worker: asyncio.subprocess.Process, log: Path) -> None:
    """Fails when the worker node exits (while the head waits for it to join)."""
    code = await worker.wait()
    raise AssertionError(f"the headless worker exited ({code}) before the head was up:\n{tail(log)}")


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


async def start_worker(args: dict[str, object], binding: str, log: Path) -> asyncio.subprocess.Process:
    """vLLM's headless worker for node rank 1 from the head's engine arguments, in a session (and
    process group) of its own, its threads bound to `binding`."""
    environment = {**os.environ, **ENVIRONMENT, "VLLM_HOST_IP": LOOPBACK, BIND: binding}
    # the worker unit's command: vLLM's CLI by module, vllm-cpu's version lookup mended
    command = [sys.executable, "-m", VLLM_CLI, *worker_command(args, node_rank=1)]
    with log.open("wb") as output:
        return await asyncio.create_subprocess_exec(*command, stdout=output, stderr=asyncio.subprocess.STDOUT,
                                                    env=environment, start_new_session=True)


async def stop_worker(worker: asyncio.subprocess.Process) -> None:
    """SIGTERM the worker's whole process group, as systemd stops its unit; fails unless every
    process of it is gone in time (what is left is then killed)."""
    group = worker.pid  # a session of its own: its process group is its id
    signal_group(group, signal.SIGTERM)
    try:
        await asyncio.wait_for(worker.wait(), GONE_SECONDS)
        await asyncio.to_thread(wait_until, "the worker's process group gone",
                                lambda: not group_members(group), GONE_SECONDS)
    finally:
        signal_group(group, signal.SIGKILL)


async def two_node_replies(model: Path, worker_cores: str, log: Path) -> tuple[Replies, list[str], list[str]]:
    """The greedy replies of TP 2 over two "nodes" on this machine (one rank each, the worker node's
    bound to `worker_cores`), vLLM's processes that served them, and those of them the worker node ran."""
    profile = profile_on(Parallel(tensor=2, nodes=2, master_addr=LOOPBACK, node_rank=0))
    plan = planned(model, profile)
    worker = await start_worker(engine_args(str(model), profile, plan), worker_cores, log)
    try:
        engine = vllm_engine(str(model), profile, plan, fim_template=None)
        async with running(engine, exits_early(worker, log)):
            return await greedy_replies(engine), vllm_titles(), vllm_titles(group_members(worker.pid))
    finally:
        await stop_worker(worker)


def test_two_nodes_over_loopback_give_tensor_parallel_1s_greedy_tokens(
        vllm_model: Path, single_rank_replies: Replies, no_process_left: None,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    head_cores, worker_cores = core_bindings(2)
    monkeypatch.setenv("VLLM_HOST_IP", LOOPBACK)  # vLLM's processes reach each other on loopback
    monkeypatch.setenv(BIND, head_cores)
    log = tmp_path / "worker.log"
    replies, titles, worker_titles = asyncio.run(two_node_replies(vllm_model, worker_cores, log))
    assert sum("Worker" in name for name in titles) == 2, titles  # one rank on each node
    assert sum("Worker" in name for name in worker_titles) == 1, worker_titles
    assert replies == single_rank_replies, tail(log)
