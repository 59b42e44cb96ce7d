"""llmd's vLLM engine on vLLM itself: the factory's pieces against vLLM's own classes, then the small
demo model served through `start_async_llm` and `VllmEngine` on vLLM's CPU backend (a greedy stream of
one event per token, the same tokens again, a stop string, a client leaving mid-reply, a grammar,
a refused parameter, health, shutdown).

Skipped without vLLM; run in the vLLM environment (README: "The vLLM environment"). The engine
starts in 20-60 s on a CPU.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest

from llmd.config import Profile
from llmd.engine.grammar import BoundGrammar, validated
from llmd.engine.types import ANY_OBJECT, FinishReason, GrammarRequest, SamplingParams
from llmd.engine.vllm.args import engine_args
from llmd.engine.vllm.engine import VllmEngine
from llmd.engine.vllm.launch import validation_errors, vllm_engine, vllm_sampling
from llmd.engine.vllm.sampling import request_kwargs
from llmd.engine.vllm.structured import lark_grammar
from llmd.errors import InvalidRequest
from llmd.preflight.ranks import RankPlan, plan_ranks
from tests.helpers.vllm_engines import read, started

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # vLLM's imports trip torch's own deprecations
    vllm = pytest.importorskip("vllm")
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    vllm_config = pytest.importorskip("vllm.config")

PROFILE = Profile(name="vllm-test", engine="vllm", device="cpu", dtype="float32", compile="none",
                  max_context=256, max_running=4, max_queue=4, prefix_cache_tokens=0)
CHAT = [{"role": "user", "content": "Hello there"}]


def plan_for(model: Path) -> RankPlan:
    """The test profile planned on one 4 GiB "GPU" (vLLM's CPU backend sizes its own KV cache)."""
    return plan_ranks(model, PROFILE, 4 << 30, 1, label="tiny")


def test_vllm_takes_the_factorys_engine_arguments_and_sampling(tiny_model: Path) -> None:
    structured = vllm_config.StructuredOutputsConfig(backend="guidance")
    arg_utils.AsyncEngineArgs(**engine_args(str(tiny_model), PROFILE, plan_for(tiny_model)),
                              structured_outputs_config=structured)
    constraint = BoundGrammar(validated(GrammarRequest(ANY_OBJECT, "response_format")), tokenizer=None)
    taken = vllm_sampling(request_kwargs(SamplingParams(max_tokens=8, constraint=constraint)))
    assert taken.output_kind == vllm.sampling_params.RequestOutputKind.DELTA
    assert taken.structured_outputs.grammar == lark_grammar(constraint.grammar)
    with pytest.raises(validation_errors()):
        vllm_sampling(request_kwargs(SamplingParams(max_tokens=8, top_k=-5)))


async def serve_checks(engine: VllmEngine) -> None:
    prompt = await engine.encode_chat(CHAT)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    first = await read(engine.submit(prompt, greedy))
    assert [e.completion_tokens for e in first] == list(range(1, 9)), "one event per token"
    assert first[-1].finish_reason is FinishReason.LENGTH
    again = await read(engine.submit(prompt, greedy))
    assert [e.text for e in again] == [e.text for e in first], "greedy tokens repeat"
    text = "".join(e.text for e in first)
    if len(text) > 2:  # a stop string inside the reply ends it there, in llmd
        stopping = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop=(text[1:3],))
        stopped = await read(engine.submit(prompt, stopping))
        assert stopped[-1].finish_reason is FinishReason.STOP
        assert text.startswith("".join(e.text for e in stopped))


async def leave_checks(engine: VllmEngine) -> None:
    prompt = await engine.encode_chat(CHAT)
    stream = engine.submit(prompt, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    with stream:
        await anext(stream)
    after = await read(engine.submit(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)))
    assert after[-1].finish_reason is FinishReason.LENGTH and engine.stats().aborted == 1
    with pytest.raises(InvalidRequest):
        engine.submit(prompt, SamplingParams(max_tokens=4, top_k=-5))  # vLLM refuses it: a 400


async def grammar_checks(engine: VllmEngine) -> None:
    prompt = await engine.encode_chat(CHAT)
    constraint = await engine.constrain(GrammarRequest(ANY_OBJECT, "response_format"))
    events = await read(engine.submit(prompt, SamplingParams(max_tokens=32, temperature=0.0,
                                                             constraint=constraint)))
    assert "".join(e.text for e in events).startswith("{")  # the random model writes JSON or runs out
    assert await engine.check_health()


def test_the_engine_serves_the_small_model_on_vllm(vllm_model: Path) -> None:
    engine = vllm_engine(str(vllm_model), PROFILE, plan_for(vllm_model), fim_template=None)

    async def run() -> None:
        try:
            await started(engine)
            assert engine.max_context == PROFILE.max_context
            await serve_checks(engine)
            await leave_checks(engine)
            await grammar_checks(engine)
        finally:
            await engine.shutdown()

    asyncio.run(run())
