"""A validated grammar over the demo model's real vocabulary: every token its masks allow keeps the
output on the schema, to the end (a seeded random walk through the allowed tokens)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import llguidance.hf
from transformers import AutoTokenizer

from llmd.engine.grammar import GrammarCompiler, GrammarRequest

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
