"""Grammar validation and its cache, pure (llguidance's validator; a byte vocabulary where a matcher
needs one; no torch)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from llmd.engine.grammar import (
    CompiledGrammar,
    GrammarCache,
    GrammarCompiler,
    SharedGrammars,
    refusal,
    validated,
)
from llmd.engine.types import ANY_OBJECT, GrammarRequest
from llmd.errors import InvalidRequest, UnsupportedParameter
from tests.helpers.byte_tokenizer import byte_tokenizer

PARAM = "response_format.json_schema.schema"
PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"], "additionalProperties": False})


def test_a_schema_and_any_object_validate() -> None:
    assert validated(GrammarRequest(PERSON, PARAM)).grammar
    assert validated(GrammarRequest(ANY_OBJECT, "response_format")).grammar


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "`uniqueItems`"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "`if`, `then`"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "`not`"),
])
def test_keywords_that_cannot_be_enforced_are_refused_by_name(schema: dict[str, object], named: str) -> None:
    with pytest.raises(UnsupportedParameter, match="cannot enforce") as caught:
        validated(GrammarRequest(json.dumps(schema), PARAM))
    assert named in caught.value.message and caught.value.param == PARAM


@pytest.mark.parametrize("schema", ['{"type": "nonsense"}', "[1, 2]", '{"$ref": "#/nowhere"}', "not json"])
def test_a_schema_that_is_not_one_is_a_400_naming_the_field(schema: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validated(GrammarRequest(schema, PARAM))
    assert not isinstance(caught.value, UnsupportedParameter) and caught.value.param == PARAM


def test_refusal_messages() -> None:
    assert refusal('Unimplemented keys: ["contains"]', "p").message.endswith("`contains`")
    assert "Invalid type" in refusal("Invalid type: x", "p").message


def test_the_cache_is_bounded_in_bytes_and_drops_the_least_recently_used() -> None:
    cache = GrammarCache(max_bytes=30)
    cache.put("a", CompiledGrammar("x" * 9))  # 10 bytes with its key
    cache.put("b", CompiledGrammar("y" * 9))
    assert cache.get("a") is not None  # now b is the oldest
    cache.put("c", CompiledGrammar("z" * 14))  # 15: b goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.bytes == 25
    cache.put("huge", CompiledGrammar("w" * 100))  # larger than the whole budget: not kept
    assert cache.get("huge") is None and cache.bytes == 25
    assert (cache.hits, cache.misses) == (3, 2)


def test_the_compiler_validates_a_schema_once() -> None:
    compiler = GrammarCompiler(tokenizer=None)
    first = compiler.compile(GrammarRequest(PERSON, PARAM))
    assert compiler.compile(GrammarRequest(PERSON, "other")) is first
    assert (compiler.cache.hits, compiler.cache.misses) == (1, 1)


def byte_view() -> Any:
    """llguidance's view of a vocabulary of single bytes and an end token."""
    return byte_tokenizer()[1]


def test_requests_get_copies_of_one_start_matcher_with_their_own_state() -> None:
    compiled = GrammarCompiler(byte_view()).compile(GrammarRequest(PERSON, PARAM))
    assert compiled.start is not None and compiled.size > len(compiled.grammar)
    first, second = compiled.matcher(None), compiled.matcher(None)
    assert first.consume_token(first_token(first))
    assert second.compute_bitmask() == compiled.start.compute_bitmask() != first.compute_bitmask()


def first_token(matcher: Any) -> int:
    """The first token the matcher allows."""
    mask = matcher.compute_bitmask()
    return next(token for token in range(len(mask) * 8) if mask[token // 8] >> (token % 8) & 1)


def test_shared_grammars_find_a_cached_grammar_without_a_thread() -> None:
    views: list[Any] = []
    shared = SharedGrammars(lambda: views.append(byte_view()) or views[-1])
    request = GrammarRequest(PERSON, PARAM)
    assert shared.cached(request) is None  # nothing compiled, no view built yet
    bound = shared.compile(request)
    assert shared.cached(request) == bound and len(views) == 1
    assert shared.compile(GrammarRequest(ANY_OBJECT, PARAM)).tokenizer is bound.tokenizer
    with shared._lock:  # the view being built in another thread: a miss, not a wait
        assert shared.cached(request) is None


def test_a_slow_compile_holds_up_no_other_grammar(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmd.engine.grammar as grammar_module

    slow = GrammarRequest(json.dumps({"type": "array"}), PARAM)
    release, entered = threading.Event(), threading.Event()
    real = grammar_module.validated

    def blocking(request: GrammarRequest, tokenizer: Any = None) -> CompiledGrammar:
        if request == slow:  # a hostile schema: validating it takes as long as the test says
            entered.set()
            release.wait()
        return real(request, tokenizer)

    monkeypatch.setattr(grammar_module, "validated", blocking)
    shared = SharedGrammars(byte_view)
    known = shared.compile(GrammarRequest(PERSON, PARAM))
    worker = threading.Thread(target=shared.compile, args=(slow,))
    worker.start()
    entered.wait()
    try:
        assert shared.cached(GrammarRequest(PERSON, PARAM)) == known  # found while the slow one runs
        assert shared.compile(GrammarRequest(ANY_OBJECT, PARAM)).compiled.grammar  # and another compiles
    finally:
        release.set()
        worker.join()
    assert shared.cached(slow) is not None
    shared.close()
