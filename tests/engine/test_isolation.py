"""One request's failure ends that request only (runner and worker on the tiny model), and
extreme but valid sampling values get the greedy tokens (over HTTP: tests/e2e/test_isolation.py).

The poison is real: the poisoned request's logits turn NaN, and the real `sample` then raises
what the issue saw ("probability tensor contains either inf, nan or element < 0"). It gets in
through the runner's `sampler` dependency, the one seam that sees a request's logits and
parameters together; NaN prompt embeddings poison the model's own output (the prefill case).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace

from llmd.engine.client import EngineClient
from llmd.engine.model.runner import ModelRunner
from llmd.engine.model.sampling import Sampler, sample
from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import Request, RowFailure, Sampled, SamplingParams
from llmd.engine.worker import EngineWorker
from llmd.errors import EngineFailure
from tests.helpers.configs import eager_profile

POISONED = 77  # the max_tokens that marks the poisoned request
STREAMS = 4


def poisoning_sampler(good_tokens: int) -> Sampler:
    """The real `sample`, except that the poisoned request's logits are NaN after `good_tokens`."""
    drawn = [0]

    def poisoned(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                 token_counts: torch.Tensor | None) -> int:
        if params.max_tokens == POISONED:
            drawn[0] += 1
            if drawn[0] > good_tokens:
                logits = torch.full_like(logits, float("nan"))
        return sample(logits, params, generator, token_counts)

    return poisoned


def seeded(k: int, max_tokens: int = 20) -> SamplingParams:
    """Sampled at temperature 1 from seed k: a contaminated row would draw other tokens."""
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 + k)


def prompts(tiny_model: Path, count: int) -> list[list[int]]:
    tokenizer = ChatTokenizer(tiny_model)
    return [tokenizer.encode_chat([{"role": "user", "content": "word " * (3 * k + 1)}]) for k in range(count)]


def alone(runner: ModelRunner, prompt: list[int], params: SamplingParams, count: int) -> list[int]:
    """The tokens a request gets with the runner to itself."""
    request = Request("alone", prompt, params)
    tokens = [runner.first_token(request)] + [runner.decode([request])[0] for _ in range(count - 1)]
    runner.release(request.request_id)
    return tokens


def collect(runner: ModelRunner, tokens: dict[str, list[Sampled]], requests: list[Request],
            outcomes: list[Sampled]) -> list[Request]:
    """Record a step's outcomes; release (as the worker does) and drop the requests that failed."""
    for request, outcome in zip(requests, outcomes, strict=True):
        tokens[request.request_id].append(outcome)
        if isinstance(outcome, RowFailure):
            runner.release(request.request_id)
    return [r for r, outcome in zip(requests, outcomes, strict=True) if not isinstance(outcome, RowFailure)]


def assert_streams_as_alone(tiny_model: Path, tokens: dict[str, list[Sampled]],
                            texts: list[list[int]]) -> None:
    reference = ModelRunner(tiny_model, replace(eager_profile(), prefix_cache_tokens=0))
    for k in range(STREAMS):
        got = tokens[f"s{k}"]
        assert all(isinstance(t, int) for t in got), got
        assert got == alone(reference, texts[k], seeded(k), len(got)), k


def start_streams(runner: ModelRunner, texts: list[list[int]], poisoned: Request | None,
                  tokens: dict[str, list[Sampled]]) -> list[Request]:
    streams = [Request(f"s{k}", texts[k], seeded(k)) for k in range(STREAMS)]
    joining = streams + ([poisoned] if poisoned is not None else [])
    for request in joining:
        tokens[request.request_id] = []
    firsts = runner.prefill_many([(r, len(r.prompt_ids)) for r in joining])
    return collect(runner, tokens, joining, [t for t in firsts if t is not None])


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_a_row_that_fails_to_sample_ends_alone_in_a_decode_step(tiny_model: Path, kv_cache: str) -> None:
    runner = ModelRunner(tiny_model, replace(eager_profile(), kv_cache=kv_cache),
                         sampler=poisoning_sampler(good_tokens=3))
    texts = prompts(tiny_model, STREAMS + 1)
    tokens: dict[str, list[Sampled]] = {}
    poisoned = Request("poisoned", texts[STREAMS], seeded(STREAMS, POISONED))
    running = start_streams(runner, texts, poisoned, tokens)
    for _ in range(9):
        step = runner.step(running, [])
        decoded = step.tokens
        running = collect(runner, tokens, running, decoded)
    assert [type(t) for t in tokens["poisoned"]] == [int, int, int, RowFailure]
    assert "nan" in tokens["poisoned"][-1].message  # type: ignore[union-attr]
    assert len(running) == STREAMS and runner.active_sequences == STREAMS
    assert_streams_as_alone(tiny_model, tokens, texts)


@pytest.mark.parametrize("fails", ["decoding", "joining"])
def test_a_row_that_fails_to_sample_ends_alone_in_a_fused_step(tiny_model: Path, fails: str) -> None:
    """Decode rows and a newcomer's prompt chunks in one pass; the poisoned request is a decode
    row of that pass, or the newcomer whose chunk completes its prompt."""
    runner = ModelRunner(tiny_model, eager_profile(), sampler=poisoning_sampler(good_tokens=2))
    assert runner.fused
    texts = prompts(tiny_model, STREAMS + 2)
    tokens: dict[str, list[Sampled]] = {}
    newcomer = Request("poisoned" if fails == "joining" else "late", texts[STREAMS + 1],
                       seeded(STREAMS + 1, POISONED if fails == "joining" else 20))
    poisoned = Request("poisoned", texts[STREAMS], seeded(STREAMS, POISONED)) if fails == "decoding" else None
    running = start_streams(runner, texts, poisoned, tokens)
    running = collect(runner, tokens, running, runner.step(running, []).tokens)
    tokens[newcomer.request_id] = []
    for stop in [*range(9, len(newcomer.prompt_ids), 9), len(newcomer.prompt_ids)]:
        step = runner.step(running, [(newcomer, stop)])
        decoded, firsts = step.tokens, step.firsts
        running = collect(runner, tokens, running, decoded)
        if firsts[0] is not None:
            running += collect(runner, tokens, [newcomer], [firsts[0]])
    for _ in range(3):
        running = collect(runner, tokens, running, runner.step(running, []).tokens)
    assert isinstance(tokens["poisoned"][-1], RowFailure)
    assert all(isinstance(t, int) for t in tokens["poisoned"][:-1])
    assert "poisoned" not in [r.request_id for r in running]
    assert_streams_as_alone(tiny_model, tokens, texts)


def test_non_finite_model_output_fails_only_its_row_and_is_not_cached(tiny_model: Path) -> None:
    """A prompt token whose embedding is NaN: the model's logits for that row are NaN, and even
    greedy sampling (where argmax would quietly pick a token) ends that request alone."""
    runner = ModelRunner(tiny_model, replace(eager_profile(), prefix_min_match=1))
    texts = prompts(tiny_model, STREAMS + 1)
    bad_token = runner.vocab_size - 1
    assert all(bad_token not in text for text in texts)
    with torch.no_grad():
        runner.model.get_input_embeddings().weight[bad_token] = float("nan")
    greedy = SamplingParams(max_tokens=20, temperature=0.0)
    requests = [Request(f"s{k}", texts[k], greedy) for k in range(STREAMS)]
    requests.append(Request("poisoned", [*texts[STREAMS], bad_token], greedy))
    firsts = runner.prefill_many([(r, len(r.prompt_ids)) for r in requests])
    assert isinstance(firsts[-1], RowFailure) and "not finite" in firsts[-1].message
    assert all(isinstance(t, int) for t in firsts[:-1])
    assert runner.active_sequences == STREAMS  # the failed request never joined the batch
    retry = Request("retry", [*texts[STREAMS], bad_token], greedy)
    runner.reuse_prefix(retry)
    assert retry.prefilled < len(texts[STREAMS]), "the poisoned prompt's cache was stored"


def test_a_failed_rows_keys_and_values_never_reach_the_next_owner_of_its_slot(tiny_model: Path) -> None:
    """A row that failed may leave non-finite keys and values in its static slot. The next
    owner's masked columns weigh 0 there, but 0 * NaN is NaN: the slot is zeroed when freed."""
    runner = ModelRunner(tiny_model, replace(eager_profile(), prefix_cache_tokens=0))
    texts = prompts(tiny_model, 3)  # longer with k
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    expected = alone(runner, texts[0], greedy, 8)
    longest, doomed = Request("longest", texts[2], greedy), Request("doomed", texts[1], greedy)
    runner.prefill_many([(r, len(r.prompt_ids)) for r in (longest, doomed)])
    with torch.inference_mode():  # the batch's tensors are inference tensors
        for keys, values in runner.kv_tensors("doomed"):
            keys.fill_(float("nan"))
            values.fill_(float("nan"))
    runner.release("doomed", failed=True)
    late = Request("late", texts[0], greedy)  # takes the freed slot, its window over the stale columns
    tokens = runner.prefill_many([(late, len(late.prompt_ids))])
    tokens += [runner.decode([longest, late])[1] for _ in range(7)]
    assert tokens == expected


def test_the_worker_ends_the_poisoned_request_and_streams_the_others(tiny_model: Path) -> None:
    texts = prompts(tiny_model, STREAMS + 1)

    async def stream(engine: EngineClient, prompt: list[int], params: SamplingParams) -> str:
        with engine.submit(prompt, params) as events:
            return "".join([event.text async for event in events])

    async def main() -> tuple[list[str | BaseException], list[str]]:
        worker = EngineWorker(tiny_model, eager_profile())
        engine = EngineClient(worker, max_context=512)
        await engine.start()
        try:
            await asyncio.wait_for(engine.ready.wait(), 60)
            runner = worker.runner
            assert runner is not None
            solo = [await stream(engine, texts[k], seeded(k)) for k in range(STREAMS)]
            runner.sampler = poisoning_sampler(good_tokens=3)
            params = [seeded(k) for k in range(STREAMS)] + [seeded(STREAMS, POISONED)]
            together = await asyncio.gather(
                *(stream(engine, text, p) for text, p in zip(texts, params, strict=True)),
                return_exceptions=True)
            return together, solo
        finally:
            await engine.shutdown()

    together, solo = asyncio.run(main())
    assert together[:STREAMS] == solo
    assert isinstance(together[STREAMS], EngineFailure) and "nan" in str(together[STREAMS])


def test_extreme_sampling_values_give_the_greedy_tokens(tiny_model: Path) -> None:
    runner = ModelRunner(tiny_model, eager_profile())
    text = prompts(tiny_model, 1)[0]
    greedy = alone(runner, text, SamplingParams(max_tokens=12, temperature=0.0), 12)
    for extreme in (dict(temperature=1e-38), dict(top_p=1e-45), dict(temperature=1e-6, top_p=7e-46)):
        params = SamplingParams(max_tokens=12, seed=3, **extreme)  # type: ignore[arg-type]
        assert alone(runner, text, params, 12) == greedy, extreme
