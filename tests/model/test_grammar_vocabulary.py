"""A validated grammar over the demo model's real vocabulary: every token its masks allow keeps the
output on the schema, to the end (a seeded random walk through the allowed tokens)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import llguidance.hf
from transformers import AutoTokenizer

from llmd.engine.grammar import GrammarCompiler
from llmd.engine.types import GrammarRequest
from tests.helpers.configs import eager_profile

BOUNDED = json.dumps({
    "type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 999},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
})


def allowed(mask: bytes, vocab: int) -> list[int]:
    """The token ids whose bit is set in llguidance's packed mask (32-bit little-endian words)."""
    return [token for token in range(vocab) if mask[token // 8] >> (token % 8) & 1]


def test_random_walks_through_the_masks_end_as_valid_json(tiny_model: Path) -> None:
    hf = AutoTokenizer.from_pretrained(str(tiny_model))
    compiler = GrammarCompiler(llguidance.hf.from_tokenizer(hf))
    compiled = compiler.compile(GrammarRequest(BOUNDED, "response_format.json_schema.schema"))
    vocab = len(hf)
    for seed in range(5):
        rng, matcher, tokens = random.Random(seed), compiled.matcher(compiler.tokenizer), []
        for _ in range(400):
            if matcher.is_stopped():
                break
            token = rng.choice(allowed(matcher.compute_bitmask(), vocab))
            assert matcher.consume_token(token), matcher.get_error()
            tokens.append(token)
        assert matcher.is_stopped() and not matcher.is_error()
        value = json.loads(hf.decode([t for t in tokens if t != hf.eos_token_id]))
        assert set(value) == {"name", "age", "tags"} and len(value["name"]) <= 8
        assert isinstance(value["age"], int) and value["age"] <= 999 and set(value["tags"]) <= {"a", "b"}


def run_until_eos(runner: Any, requests: list[Any], steps: int) -> dict[str, list[int]]:
    """Every request prefilled, then decoded together; one leaves the batch at its first EOS id."""
    tokens = {request.request_id: [runner.first_token(request)] for request in requests}
    running = [r for r in requests if tokens[r.request_id][-1] not in runner.eos_token_ids]
    for _ in range(steps):
        if not running:
            break
        for request, token in zip(running, runner.decode(running), strict=True):
            tokens[request.request_id].append(token)
        for request in [r for r in running if tokens[r.request_id][-1] in runner.eos_token_ids]:
            runner.release(request.request_id)
            running.remove(request)
    for request in running:
        runner.release(request.request_id)
    return tokens


def test_constrained_rows_follow_the_schema_and_their_neighbour_is_untouched(tiny_model: Path) -> None:
    from llmd.engine.grammar import BoundGrammar
    from llmd.engine.model.runner import ModelRunner
    from llmd.engine.tokenizer import ChatTokenizer
    from llmd.engine.types import Request, SamplingParams
    from tests.helpers.engine import PROMPT, greedy

    runner = ModelRunner(tiny_model, eager_profile())
    hf = AutoTokenizer.from_pretrained(str(tiny_model))
    view = llguidance.hf.from_tokenizer(hf, n_vocab=runner.vocab_size, eos_token=sorted(runner.eos_token_ids))
    constraint = BoundGrammar(GrammarCompiler(view).compile(GrammarRequest(BOUNDED, "p")), view)
    prompt = ChatTokenizer(tiny_model).encode_chat(PROMPT)
    alone = run_until_eos(runner, [Request("plain", prompt, greedy(60))], 60)["plain"]
    sampled = [SamplingParams(max_tokens=60, temperature=1.0, seed=k, constraint=constraint)
               for k in range(3)]
    requests = [Request("plain", prompt, greedy(60))] + [
        Request(f"json{k}", prompt, params) for k, params in enumerate(sampled)]
    tokens = run_until_eos(runner, requests, 200)
    assert tokens["plain"][: len(alone)] == alone  # the masks in the batch touch only their own rows
    for k in range(3):
        produced = tokens[f"json{k}"]
        assert produced[-1] in runner.eos_token_ids  # the grammar ended it
        value = json.loads(hf.decode(produced[:-1]))
        assert set(value) == {"name", "age", "tags"} and len(value["name"]) <= 8
