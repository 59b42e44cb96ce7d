#!/usr/bin/env python3
"""Measure the grammar libraries issue 15 weighs, xgrammar and llguidance, on this machine.

For JSON schemas of the kind clients send (a Pydantic model through `chat.completions.parse`,
an agent framework's function tool, `json_object`), it times what a server pays: preparing the
vocabulary once, compiling a schema (what would stall the first request), and per decode step
the token masks of a batch of constrained rows, plus applying them to the logits.

Neither library is a dependency of llmd yet: install both first (`pip install xgrammar
llguidance`). Mask cost grows with the vocabulary, and nothing here may be downloaded, so the
vocabulary is a byte-level BPE trained here on generated text up to `--vocab` ids (cached in
`--cache`); the demo tokenizer's 1.6k ids would say nothing about a 150k one.

Usage: scripts/grammar_bench.py [--vocab 131072] [--rows 8] [--repeats 3] [--cache DIR] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
SYLLABLES = [a + b for a in "bcdfghjklmnprstvwz" for b in ("a", "e", "i", "o", "u", "ai", "ou", "er", "an")]
HANGUL = [chr(code) for code in range(0xAC00, 0xAC00 + 400)]
HAN = [chr(code) for code in range(0x4E00, 0x4E00 + 400)]

SCHEMAS: dict[str, tuple[dict[str, Any] | None, str]] = {
    # `json_object`: any JSON object.
    "json_object": (None, '{"status": "ok", "items": [1, 2, 3], "note": "fine"}'),
    # A small Pydantic model, as `chat.completions.parse(response_format=Person)` sends it.
    "person": ({
        "type": "object", "title": "Person", "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "email": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["name", "age", "email"],
    }, '{"name": "Ada Lovelace", "age": 36, "email": null}'),
    # A nested model with $defs, an enum and a list, as instructor and pydantic-ai send.
    "invoice": ({
        "type": "object", "title": "Invoice", "additionalProperties": False,
        "$defs": {"Line": {"type": "object", "additionalProperties": False,
                           "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"},
                                          "price": {"type": "number"}},
                           "required": ["sku", "quantity", "price"]}},
        "properties": {"number": {"type": "string"},
                       "currency": {"type": "string", "enum": ["EUR", "USD", "KRW", "JPY"]},
                       "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                       "paid": {"type": "boolean"}},
        "required": ["number", "currency", "lines", "paid"],
    }, '{"number": "INV-2026-0042", "currency": "KRW", "lines": [{"sku": "A-1", "quantity": 2, '
       '"price": 1500.5}, {"sku": "B-22", "quantity": 1, "price": 990}], "paid": false}'),
    # An OpenAI Agents SDK strict function tool's arguments.
    "tool_args": ({
        "type": "object", "additionalProperties": False,
        "properties": {"city": {"type": "string", "description": "The city"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city", "unit", "days"],
    }, '{"city": "Seoul", "unit": "celsius", "days": 3}'),
}


# Schema keywords a library may not enforce: each one's verdict is reported (refused, or accepted).
KEYWORD_PROBES: dict[str, dict[str, Any]] = {
    "not": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
    "if/then": {"type": "object", "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "string"}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "pattern": {"type": "string", "pattern": "^[a-z]+$"},
    "format: email": {"type": "string", "format": "email"},
    "format: unknown": {"type": "string", "format": "x-weird"},
    "minItems/maxItems": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
}


def keyword_verdicts(library: Any) -> dict[str, str]:
    """Per probed keyword: `accepted`, or the library's refusal (its first line)."""
    verdicts = {}
    for keyword, schema in KEYWORD_PROBES.items():
        try:
            library.check(schema)
            verdicts[keyword] = "accepted"
        except Exception as exc:  # each library has its own error types
            verdicts[keyword] = "refused: " + str(exc).splitlines()[0][:120]
    return verdicts


def corpus(seed: int, megabytes: float) -> Iterator[str]:
    """Generated text that trains a vocabulary shaped like a real one: words, identifiers, JSON,
    numbers, code punctuation, Korean and Chinese."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(60_000)]
    weights = [1 / (rank + 1) for rank in range(len(words))]
    made = 0
    while made < megabytes * 1e6:
        picked = rng.choices(words, weights, k=64)
        line = " ".join(picked)
        line += f' {{"{picked[0]}": {rng.randint(0, 99999)}, "{picked[1]}_{picked[2]}": "{picked[3]}"}}'
        line += f" {picked[4]}{picked[5].capitalize()}({picked[6]}, {rng.random():.3f});"
        line += " " + "".join(rng.choice(HANGUL) for _ in range(rng.randint(2, 8)))
        line += " " + "".join(rng.choice(HAN) for _ in range(rng.randint(2, 8))) + "\n"
        made += len(line)
        yield line


def trained_tokenizer(vocab: int, cache: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab` ids, trained once and cached."""
    path = cache / f"bpe-{vocab}.json"
    if not path.exists():
        started = time.perf_counter()
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=[EOS],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(corpus(0, megabytes=vocab / 2500), trainer=trainer)
        cache.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(path))
        print(f"trained a {tokenizer.get_vocab_size()}-id BPE in {time.perf_counter() - started:.0f} s",
              file=sys.stderr)
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOS)


def timed(work: Callable[[], Any]) -> tuple[float, Any]:
    """Milliseconds `work` took, and what it returned."""
    started = time.perf_counter()
    result = work()
    return (time.perf_counter() - started) * 1000, result


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)


class XGrammar:
    """xgrammar: a compiled grammar per schema (adaptive token-mask cache), C++ batch mask fill."""

    name = "xgrammar"

    def __init__(self, tokenizer: PreTrainedTokenizerFast, vocab: int, rows: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        prepare = functools.partial(xgr.TokenizerInfo.from_huggingface, tokenizer, vocab_size=vocab)
        self.prepare_ms, self.info = timed(prepare)
        self.batch = xgr.BatchGrammarMatcher(max_threads=2)
        self.bitmask = xgr.allocate_token_bitmask(rows, vocab)

    def compile(self, schema: dict[str, Any] | None) -> Any:
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        if schema is None:
            return compiler.compile_builtin_json_grammar()
        return compiler.compile_json_schema(json.dumps(schema))

    def check(self, schema: dict[str, Any]) -> None:
        """Compile, raising what the compiler refuses."""
        self.compile(schema)

    def matchers(self, compiled: Any, rows: int) -> list[Any]:
        return [self.xgr.GrammarMatcher(compiled) for _ in range(rows)]

    def fill(self, matchers: list[Any]) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, self.bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def apply(self, logits: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, self.bitmask)


class LLGuidance:
    """llguidance: no compile step (the lexer is built lazily), a Rust executor for batch fill."""

    name = "llguidance"

    def __init__(self, tokenizer: PreTrainedTokenizerFast, vocab: int, rows: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.fill_par = llguidance.torch.fill_next_token_bitmask_par
        prepare = functools.partial(llguidance.hf.from_tokenizer, tokenizer, n_vocab=vocab)
        self.prepare_ms, self.tokenizer = timed(prepare)
        self.executor = llguidance.LLExecutor(num_threads=2)
        self.bitmask = llguidance.torch.allocate_token_bitmask(rows, vocab)

    def compile(self, schema: dict[str, Any] | None) -> Any:
        wanted = schema if schema is not None else {"type": "object"}
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(wanted))
        return self.llg.LLMatcher(self.tokenizer, grammar)  # checks the grammar: what a server does up front

    def check(self, schema: dict[str, Any]) -> None:
        """Validate, raising the error (an unimplemented keyword is one unless made lenient)."""
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        is_error, messages = self.llg.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ValueError(messages[0])

    def matchers(self, compiled: Any, rows: int) -> list[Any]:
        return [compiled.deep_copy() for _ in range(rows)]

    def fill(self, matchers: list[Any]) -> None:
        self.fill_par(self.executor, [(matcher, row) for row, matcher in enumerate(matchers)], self.bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def apply(self, logits: torch.Tensor) -> None:
        apply_bitmask(logits, self.bitmask)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Mask logits where the packed bitmask has a 0 bit (plain torch, what llmd would write)."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(1)[:, : logits.shape[1]].bool()
    logits.masked_fill_(~allowed, float("-inf"))


def first_mask(library: Any, schema: dict[str, Any] | None) -> None:
    """From a schema to the first row's mask: what a request's first constrained step waits for."""
    library.fill(library.matchers(library.compile(schema), 1))


def measure(library: Any, tokenizer: PreTrainedTokenizerFast, vocab: int, rows: int,
            repeats: int) -> dict[str, Any]:
    """One library's figures over every schema."""
    figures: dict[str, Any] = {"prepare_vocab_ms": round(library.prepare_ms, 1), "schemas": {},
                               "keywords": keyword_verdicts(library)}
    for name, (schema, instance) in SCHEMAS.items():
        compile_ms = [timed(functools.partial(first_mask, library, schema))[0] for _ in range(repeats)]
        compiled = library.compile(schema)
        tokens = tokenizer.encode(instance, add_special_tokens=False)
        fills, accepted = [], True
        for _ in range(repeats):
            matchers = library.matchers(compiled, rows)
            for token in tokens:
                fills.append(timed(functools.partial(library.fill, matchers))[0])
                accepted = all(library.accept(matcher, token) for matcher in matchers) and accepted
        logits = torch.randn(rows, vocab)
        apply_ms = [timed(functools.partial(library.apply, logits.clone()))[0] for _ in range(20)]
        figures["schemas"][name] = {
            "to_first_mask_ms_median": median(compile_ms),
            "to_first_mask_ms_max": round(max(compile_ms), 3),
            "tokens": len(tokens), "instance_accepted": accepted,
            f"fill_{rows}_rows_ms_median": median(fills), f"fill_{rows}_rows_ms_p99": p99(fills),
            f"apply_{rows}_rows_ms_median": median(apply_ms),
        }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--rows", type=int, default=8, help="constrained rows in a step (default 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "llmd" / "grammar-bench")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = trained_tokenizer(args.vocab, args.cache)
    vocab = len(tokenizer)
    report = {"vocab": vocab, "rows": args.rows, "repeats": args.repeats, "libraries": {}}
    for kind in (XGrammar, LLGuidance):
        library = kind(tokenizer, vocab, args.rows)
        report["libraries"][kind.name] = measure(library, tokenizer, vocab, args.rows, args.repeats)
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
