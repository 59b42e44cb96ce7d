"""`n` choices, logprobs and `logit_bias` on the tiny real model, through the engine client.

Logprobs are checked against `log_softmax` of transformers' own forward pass over the same tokens
(the raw distribution they are documented to describe); forked choices against the same seed run
alone; a biased request against its neighbour in the batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from llmd.engine.client import EngineClient
from llmd.engine.types import SamplingParams, TokenEvent, TokenLogprobs
from llmd.engine.worker import EngineWorker
from llmd.errors import EngineFailure, InvalidRequest
from tests.helpers.engine import PROMPT, greedy, run_with_engine

LONG_PROMPT = [{"role": "user", "content": " ".join(f"word{k} 안녕 🙂" for k in range(60))}]


async def events_of(engine: EngineClient, prompt: list[int], params: SamplingParams) -> list[TokenEvent]:
    """Every event of one request."""
    with engine.submit(prompt, params) as stream:
        return [event async for event in stream]


def raw_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """`log_softmax` of transformers' logits at every position of `ids` (float32)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_position(entry: TokenLogprobs, expected: torch.Tensor, top: int) -> None:
    """One position's logprobs: the chosen token's and the `top` likeliest, as `expected` says."""
    assert entry.chosen.logprob == pytest.approx(float(expected[entry.chosen.token_id]), abs=1e-4)
    values, ids = torch.topk(expected, top)
    assert [t.token_id for t in entry.top] == ids.tolist()
    assert [t.logprob for t in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_token_logprobs_are_the_raw_models_before_temperature_top_k_and_bias(tiny_model: Path) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.7, top_k=5, seed=3, ignore_eos=True,
                            logit_bias=((40, 3.0),), logprobs=4)

    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[list[int], list[TokenEvent]]:
        prompt = await engine.encode_chat(PROMPT)
        return prompt, await events_of(engine, prompt, params)

    prompt, events = run_with_engine(tiny_model, body)
    entries = [event.logprobs for event in events]
    assert all(entry is not None for entry in entries) and len(entries) == 10
    generated = [entry.chosen.token_id for entry in entries if entry is not None]
    expected = raw_logprobs(tiny_model, prompt + generated)
    for step, entry in enumerate(entries):
        assert entry is not None
        check_position(entry, expected[len(prompt) - 1 + step], 4)


def test_prompt_logprobs_cover_every_prompt_token_even_when_its_prefix_is_cached(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[list[int], TokenEvent, int]:
        prompt = await engine.encode_chat(LONG_PROMPT)
        await events_of(engine, prompt, greedy(2))  # now the prefix cache holds the prompt
        reused = engine.stats().prefix_tokens_reused
        events = await events_of(engine, prompt, greedy(2, prompt_logprobs=2, logprobs=0))
        assert engine.stats().prefix_tokens_reused == reused  # a scored prompt computes every position
        return prompt, events[0], len(events)

    prompt, first, count = run_with_engine(tiny_model, body)
    assert count == 2
    assert len(prompt) > 128  # more than one scored piece
    scores = first.prompt_logprobs
    assert scores is not None and len(scores) == len(prompt)
    assert scores[0].chosen.token_id == prompt[0] and scores[0].chosen.logprob is None  # nothing predicts it
    expected = raw_logprobs(tiny_model, prompt)
    for position in range(1, len(prompt)):
        entry = scores[position]
        assert entry.chosen.token_id == prompt[position]
        check_position(entry, expected[position - 1], 2)


def test_a_streams_cached_tokens_say_how_much_of_its_prompt_the_prefix_cache_held(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[int, int, int]:
        prompt = await engine.encode_chat(LONG_PROMPT)
        counts = []
        for _ in range(2):  # the first fills the prefix cache, the second reuses it
            with engine.submit(prompt, greedy(2)) as stream:
                [event async for event in stream]
                counts.append(stream.cached_tokens)
        return counts[0], counts[1], engine.stats().prefix_tokens_reused

    first, second, reused = run_with_engine(tiny_model, body)
    assert first == 0 and second == reused > 0


def test_logit_bias_steers_its_own_row_and_leaves_its_neighbour_alone(tiny_model: Path) -> None:
    forced = 40

    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[Any, ...]:
        assert forced not in worker.eos_token_ids
        prompt = await engine.encode_chat(PROMPT)
        alone = await events_of(engine, prompt, greedy(12, ignore_eos=True))
        with engine.submit(prompt, greedy(12, ignore_eos=True)) as plain, engine.submit(
            prompt, greedy(12, ignore_eos=True, logit_bias=((forced, 100.0),), logprobs=0)
        ) as biased:
            beside = [event async for event in plain]
            steered = [event async for event in biased]
        with pytest.raises(InvalidRequest, match="logit_bias"):
            engine.submit(prompt, greedy(4, logit_bias=((10**6, 1.0),)))
        return alone, beside, steered

    alone, beside, steered = run_with_engine(tiny_model, body)
    assert [e.text for e in beside] == [e.text for e in alone]
    assert [e.logprobs.chosen.token_id for e in steered if e.logprobs] == [forced] * 12


def texts(choices: list[list[TokenEvent]]) -> list[str]:
    """Each choice's whole text."""
    return ["".join(event.text for event in events) for events in choices]


def test_n_choices_share_one_prefill_and_each_samples_as_its_seed_alone(tiny_model: Path) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11, ignore_eos=True, logprobs=1)

    async def choices(engine: EngineClient, prompt: list[int]) -> list[list[TokenEvent]]:
        streams = engine.submit_choices(prompt, params, 3)
        try:
            return [[event async for event in stream] for stream in streams]
        finally:
            for stream in streams:
                stream.close()

    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[Any, ...]:
        assert worker.runner is not None
        prompt = await engine.encode_chat(LONG_PROMPT)
        prefilled: list[int] = []
        hook = worker.runner.model.register_forward_pre_hook(
            lambda module, args, kwargs: prefilled.append(kwargs["input_ids"].numel())
            if kwargs["input_ids"].shape[1] > 1 else None, with_kwargs=True)
        try:
            first = await choices(engine, prompt)
        finally:
            hook.remove()
        again = await choices(engine, prompt)
        alone = [await events_of(engine, prompt, dataclasses.replace(params, seed=11 + k)) for k in range(3)]
        return prompt, prefilled, first, again, alone

    prompt, prefilled, first, again, alone = run_with_engine(tiny_model, body)
    assert sum(prefilled) == len(prompt)  # the prompt went through the model once for three choices
    assert texts(first) == texts(again) == texts(alone)
    assert len(set(texts(first))) > 1
    assert all(len(events) == 10 and all(e.logprobs for e in events) for events in first)


def test_forked_choices_get_the_prompts_logprobs_and_a_closed_choice_ends_alone(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        prompt = await engine.encode_chat(PROMPT)
        streams = engine.submit_choices(prompt, greedy(6, ignore_eos=True, prompt_logprobs=0), 3)
        streams[1].close()  # before or after the fork: either way the others run on
        kept = [[event async for event in streams[k]] for k in (0, 2)]
        for stream in streams:
            stream.close()
        assert [len(events) for events in kept] == [6, 6]
        firsts = [events[0].prompt_logprobs for events in kept]
        assert firsts[0] is not None and firsts[0] == firsts[1] and len(firsts[0]) == len(prompt)
        with pytest.raises(InvalidRequest, match="`n`"):
            engine.submit_choices(prompt, greedy(2), worker.profile.max_running + 1)
        assert engine.stats().running == 0

    run_with_engine(tiny_model, body)


def test_closing_the_first_choice_early_never_strands_the_others(tiny_model: Path) -> None:
    async def body(engine: EngineClient, worker: EngineWorker) -> None:
        prompt = await engine.encode_chat(LONG_PROMPT)
        streams = engine.submit_choices(prompt, greedy(4, ignore_eos=True), 2)
        streams[0].close()  # before its prefill (the follower ends with an error) or after (it runs on)
        try:
            events = [event async for event in streams[1]]
            assert len(events) == 4
        except EngineFailure as exc:
            assert "first choice was cancelled" in str(exc)
        finally:
            streams[1].close()
        assert [len(e) for e in [await events_of(engine, prompt, greedy(3))]] == [3]  # still serving

    run_with_engine(tiny_model, body)


def test_choices_forked_inside_a_fused_step_beside_a_running_stream(tiny_model: Path) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)

    async def body(engine: EngineClient, worker: EngineWorker) -> tuple[Any, ...]:
        assert worker.runner is not None and worker.runner.fused
        prompt = await engine.encode_chat(PROMPT)
        alone = [texts([await events_of(engine, prompt, dataclasses.replace(params, seed=5 + k))])[0]
                 for k in range(2)]
        with engine.submit(prompt, greedy(40, ignore_eos=True)) as running:
            first = await anext(aiter(running))  # it decodes: the group's prefill shares its steps
            streams = engine.submit_choices(prompt, params, 2)
            try:
                forked = texts([[event async for event in stream] for stream in streams])
            finally:
                for stream in streams:
                    stream.close()
            rest = [event async for event in running]
        return alone, forked, 1 + len(rest), first

    alone, forked, running_tokens, _ = run_with_engine(tiny_model, body)
    assert forked == alone and running_tokens == 40
