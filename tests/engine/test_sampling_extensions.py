"""The local-server sampling extensions on the tiny real model: runner against `generate`, and the
worker's finish decisions (stop_token_ids, min_tokens, ignore_eos) through the engine client."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from llmd.bench.decoder import InProcessDecoder
from llmd.demo.tokenizer import SPECIAL_TOKENS, START_HEADER_TOKEN
from llmd.engine.client import EngineClient
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.sampling import Sampler, sample
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import Request, SamplingParams
from llmd.engine.worker import EngineWorker
from tests.helpers.configs import eager_profile
from tests.helpers.engine import PROMPT, greedy, run_with_engine, text_of

START_HEADER_TOKEN_ID = SPECIAL_TOKENS.index(START_HEADER_TOKEN)  # special: decoding skips its text
PENALTY = 10.0  # the demo model's walk is confident: a mild penalty changes nothing in 48 tokens


def test_greedy_with_repetition_penalty_equals_generate(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, eager_profile())
    prompt = ChatTokenizer(tiny_model).encode_chat(PROMPT)
    request = Request("r", prompt, greedy(48, repetition_penalty=PENALTY))
    ours = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(47)]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    ids = torch.tensor([prompt])
    reference = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48,
                               min_new_tokens=48, repetition_penalty=PENALTY, pad_token_id=0)
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48,
                           min_new_tokens=48, pad_token_id=0)
    assert ours == reference[0, len(prompt):].tolist() != plain[0, len(prompt):].tolist()


def first_new(ids: list[int]) -> int:
    """The first position whose token did not appear before it (beyond the first two)."""
    return next(k for k in range(2, len(ids)) if ids[k] not in ids[:k])


def test_stop_token_ids_and_min_tokens_end_where_they_say(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        ids = InProcessDecoder(tiny_model).decode(await engine.encode_chat(PROMPT), 24).token_ids
        k = first_new(ids)
        before_k = ChatTokenizer(tiny_model).decode(ids[:k])
        assert await text_of(engine, greedy(24, stop_token_ids=(ids[k],))) == (before_k, "stop")
        assert await text_of(engine, greedy(24, stop_token_ids=(ids[0],))) == ("", "stop")
        held, reason = await text_of(engine, greedy(6, stop_token_ids=(ids[0],), min_tokens=6))
        assert reason == "length" and held  # the first 6 tokens could not be the stop id

    run_with_engine(tiny_model, body)


def always_eos(eos: int) -> Sampler:
    """A sampler that answers the model's EOS id every time."""
    def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
             token_counts: torch.Tensor | None) -> int:
        sample(logits, params, generator, token_counts)
        return eos
    return pick


def test_ignore_eos_and_min_tokens_let_eos_pass(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        assert worker.runner is not None
        worker.runner.sampler = always_eos(min(worker.eos_token_ids))
        assert await text_of(engine, greedy(5)) == ("", "stop")
        for params in (greedy(5, ignore_eos=True), greedy(5, min_tokens=5)):
            with engine.submit(await engine.encode_chat(PROMPT), params) as stream:
                events = [event async for event in stream]
            assert events[-1].finish_reason is not None and events[-1].finish_reason.value == "length"
            assert stream.completion_tokens == 5

    run_with_engine(tiny_model, body)


def always(token: int) -> Sampler:
    """A sampler that answers `token` every time."""
    def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
             token_counts: torch.Tensor | None) -> int:
        sample(logits, params, generator, token_counts)
        return token
    return pick


def test_a_stop_string_that_is_one_special_token_stops_as_that_token(tiny_model: Path) -> None:
    """Decoding skips special tokens, so only their id can match (Continue's `<|fim_pad|>` stops)."""
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        assert worker.runner is not None
        worker.runner.sampler = always(START_HEADER_TOKEN_ID)
        assert await text_of(engine, greedy(5)) == ("", "length")
        assert await text_of(engine, greedy(5, stop=("\n", START_HEADER_TOKEN))) == ("", "stop")
        with engine.submit(await engine.encode_chat(PROMPT), greedy(5, stop=(START_HEADER_TOKEN,))) as stream:
            assert [event.finish_reason async for event in stream][-1] is not None
        assert stream.completion_tokens == 1

    run_with_engine(tiny_model, body)
