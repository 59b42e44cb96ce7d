"""llmd's vLLM arguments against vLLM itself: every engine argument is one of `AsyncEngineArgs`'s,
vLLM's own `serve` parser reads a headless worker's command back to the same values, and vLLM's
`SamplingParams` takes a request's sampling as it is, and its own `RequestOutput`s read as events.

Skipped without vLLM; run in the vLLM environment (README: "The vLLM environment")."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmd.config import Parallel, Profile
from llmd.engine.detokenizer import OutputText
from llmd.engine.types import FinishReason, SamplingParams, TokenEvent
from llmd.engine.vllm.args import engine_args, worker_command
from llmd.engine.vllm.deltas import token_events
from llmd.engine.vllm.sampling import sampling_kwargs
from llmd.preflight.ranks import rank_plan
from llmd.preflight.shape import shape_from_config
from tests.helpers.configs import LLAMA_3_1_70B

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # vLLM's imports trip torch's own deprecations
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    serve = pytest.importorskip("vllm.entrypoints.cli.serve")
    argparse_utils = pytest.importorskip("vllm.utils.argparse_utils")
    vllm = pytest.importorskip("vllm")


def test_vllm_takes_the_engine_arguments_and_parses_the_worker_command_to_them(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_3_1_70B))
    profile = Profile(name="tp", engine="vllm", device="cuda", dtype="bfloat16", max_running=16,
                      parallel=Parallel(tensor=4, pipeline=2, nodes=2, master_addr="10.0.0.1"))
    plan = rank_plan(shape_from_config(LLAMA_3_1_70B), profile.parallel, gpu_bytes=80 << 30, gpus_per_node=4,
                     dtype="bfloat16", kv_dtype="auto", context=8192, overhead_bytes=2 << 30)
    args = engine_args(str(model), profile, plan)
    arg_utils.AsyncEngineArgs(**args)
    parser = argparse_utils.FlexibleArgumentParser()
    serve.ServeSubcommand().subparser_init(parser.add_subparsers())
    parsed = parser.parse_args(worker_command(args, node_rank=1))
    assert parsed.model_tag == str(model) and parsed.headless
    expected = {key: value for key, value in {**args, "node_rank": 1}.items() if key != "model"}
    assert {key: getattr(parsed, key) for key in expected} == expected


def test_vllm_takes_a_requests_sampling_parameters_as_they_are() -> None:
    params = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, top_k=40, seed=2**64 - 1, min_p=0.05,
                            presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.1,
                            stop_token_ids=(7,), min_tokens=3, logit_bias=((5, -100.0),), logprobs=2)
    kwargs = sampling_kwargs(params)
    taken = vllm.SamplingParams(**kwargs, output_kind=vllm.sampling_params.RequestOutputKind.DELTA)
    assert {key: getattr(taken, key) for key in kwargs} == kwargs
    greedy = vllm.SamplingParams(**sampling_kwargs(SamplingParams(max_tokens=4, temperature=0.0)))
    assert greedy.sampling_type == vllm.sampling_params.SamplingType.GREEDY


def test_vllms_own_request_outputs_read_as_llmd_events() -> None:
    outputs = pytest.importorskip("vllm.outputs")

    def delta(ids: list[int], finished: bool = False, reason: str | None = None) -> object:
        completion = outputs.CompletionOutput(index=0, text="", token_ids=ids, cumulative_logprob=None,
                                              logprobs=None, finish_reason=reason)
        return outputs.RequestOutput(request_id="r", prompt=None, prompt_token_ids=[3, 4],
                                     prompt_logprobs=None, outputs=[completion], finished=finished,
                                     num_cached_tokens=2)

    class Digits:
        def decode(self, ids: list[int]) -> str:
            return "".join(str(i % 10) for i in ids)

    async def deltas() -> AsyncIterator[object]:
        yield delta([5, 6])
        yield delta([7], finished=True, reason="length")

    async def nothing() -> None:
        raise AssertionError("a request vLLM finished is not aborted")

    async def collect() -> list[TokenEvent]:
        text = OutputText(Digits(), [3, 4], ())
        events = token_events(deltas(), text, SamplingParams(max_tokens=3), frozenset(), nothing)  # type: ignore[arg-type]
        return [event async for event in events]

    events = asyncio.run(collect())
    assert [(e.text, e.completion_tokens) for e in events] == [("5", 1), ("6", 2), ("7", 3)]
    assert events[0].cached_tokens == 2 and events[-1].finish_reason is FinishReason.LENGTH
