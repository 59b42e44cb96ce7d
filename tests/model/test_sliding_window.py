"""A model with sliding-window attention: batched, chunked and prefix-reused, it decodes as HF does alone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from llmd.engine.model.dynamic_batch import DynamicDecodeBatch
from llmd.engine.model.runner import ModelRunner
from llmd.engine.types import Request, SamplingParams
from tests.helpers.configs import eager_profile

WINDOW = 16  # shorter than the prompts, so the window bites


@pytest.fixture(scope="module")
def sliding_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    config = AutoConfig.for_model(
        "mistral", sliding_window=WINDOW, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=200, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    path = tmp_path_factory.mktemp("models") / "sliding"
    model.save_pretrained(path)
    return path, model


def test_staggered_chunked_and_reused_requests_decode_as_generate_does_alone(
    sliding_model: tuple[Path, PreTrainedModel], caplog: pytest.LogCaptureFixture
) -> None:
    path, model = sliding_model
    with caplog.at_level(logging.WARNING, "llmd.engine"):
        runner = ModelRunner(path, eager_profile())
    assert isinstance(runner.batch, DynamicDecodeBatch), "the static cache falls back for sliding windows"
    assert "decoding with the dynamic cache instead" in caplog.text
    shared = list(range(3, 23))  # 20 tokens: reused by the later requests (prefix_min_match 16)
    prompts = [shared + [100 + k] * (3 + 9 * k) for k in range(3)]
    new_tokens = 24
    tokens: dict[str, list[int]] = {f"r{k}": [] for k in range(3)}
    greedy = SamplingParams(max_tokens=100, temperature=0.0)
    requests = [Request(f"r{k}", prompt, greedy) for k, prompt in enumerate(prompts)]
    tokens["r0"].append(runner.first_token(requests[0]))
    running = [requests[0]]
    for joining in requests[1:]:
        runner.reuse_prefix(joining)
        stops = [*range(joining.prefilled + 8, len(joining.prompt_ids), 8), len(joining.prompt_ids)]
        for stop in stops:
            step = runner.step(running, [(joining, stop)])
            decoded, firsts = step.tokens, step.firsts
            for request, token in zip(running, decoded, strict=True):
                tokens[request.request_id].append(token)
            if firsts[0] is not None:
                tokens[joining.request_id].append(firsts[0])
        running.append(joining)
    while min(len(t) for t in tokens.values()) < new_tokens:
        for request, token in zip(running, runner.step(running, []).tokens, strict=True):
            tokens[request.request_id].append(token)
    assert runner.prefix_cache.hits == 2
    for k, prompt in enumerate(prompts):
        with torch.inference_mode():
            alone = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens,
                                   min_new_tokens=new_tokens, do_sample=False)
        assert tokens[f"r{k}"][:new_tokens] == alone[0, len(prompt) :].tolist(), k
