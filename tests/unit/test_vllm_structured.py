"""What the vLLM engine hands vLLM beside the prompt, pure: a grammar as Lark text that llguidance
reads to the same language llmd validated, the request's keywords, and the start-up checks (the
tokenizers agree, vLLM's stop ids, vLLM installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from llguidance import LLMatcher

from llmd.engine.grammar import BoundGrammar, validated
from llmd.engine.types import ANY_OBJECT, GrammarRequest, SamplingParams
from llmd.engine.vllm import launch
from llmd.engine.vllm.sampling import request_kwargs
from llmd.engine.vllm.structured import lark_grammar, structured_outputs
from llmd.engine.vllm.vocabulary import Vocabulary, check_vocabularies, stop_ids
from llmd.errors import ConfigError
from tests.helpers.byte_tokenizer import byte_tokenizer
from tests.helpers.fake_vllm import vllm_profile

PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"], "additionalProperties": False})
TOOL_CALL = 'start: "<tool_call>" %json {"type": "object"} "</tool_call>"'


def accepts(grammar: str, text: str) -> bool:
    """Whether llguidance's matcher over a byte vocabulary takes all of `text` and may end there."""
    tokenizer, view = byte_tokenizer()
    matcher = LLMatcher(view, grammar, log_level=0)
    return matcher.consume_tokens(tokenizer.encode(text).ids) and matcher.is_accepting()


@pytest.mark.parametrize("text", ['{"name": "Ann", "age": 3}', '{"name":"Ann","age":3}', '{"name": "Ann"}',
                                  '{ "name": "Ann", "age": 3}', '{"age": 3, "name": "Ann"}'])
def test_a_schemas_lark_form_takes_exactly_what_llmds_grammar_takes(text: str) -> None:
    llmd_grammar = validated(GrammarRequest(PERSON, "response_format")).grammar
    lark = lark_grammar(llmd_grammar)
    assert lark.startswith("start: %json ") and '"x-guidance"' in lark  # llmd's JSON layout travels
    assert accepts(lark, text) == accepts(llmd_grammar, text)


def test_the_compact_layout_is_kept() -> None:
    lark = lark_grammar(validated(GrammarRequest(ANY_OBJECT, "response_format")).grammar)
    assert accepts(lark, '{"a": 1}') and not accepts(lark, '{"a":1}')


def test_a_lark_grammar_goes_as_it_is() -> None:
    grammar = validated(GrammarRequest(TOOL_CALL, "tools", lark=True)).grammar
    assert lark_grammar(grammar) == TOOL_CALL


@pytest.mark.parametrize("grammar", ['{"grammars": []}', '{"grammars": [{"lark_grammar": null}]}',
                                     '{"grammars": [{"json_schema": {}}, {"json_schema": {}}]}'])
def test_a_grammar_with_no_single_lark_form_is_refused(grammar: str) -> None:
    with pytest.raises(ValueError, match="Lark form"):
        lark_grammar(grammar)


def test_a_constrained_requests_keywords_carry_its_grammar_and_others_none() -> None:
    constraint = BoundGrammar(validated(GrammarRequest(ANY_OBJECT, "response_format")), tokenizer=None)
    kwargs = request_kwargs(SamplingParams(max_tokens=8, constraint=constraint))
    assert kwargs["structured_outputs"] == structured_outputs(constraint)
    assert kwargs["structured_outputs"]["grammar"].startswith("start: %json ")
    assert "structured_outputs" not in request_kwargs(SamplingParams(max_tokens=8))
    assert structured_outputs(None) is None


def test_tokenizers_that_agree_pass_and_each_difference_is_named() -> None:
    ours = Vocabulary(50, frozenset({2}), frozenset({0, 1, 2}))
    check_vocabularies(ours, Vocabulary(50, frozenset({2}), frozenset({0, 1, 2})))
    with pytest.raises(ConfigError) as caught:
        check_vocabularies(ours, Vocabulary(60, frozenset(), frozenset(range(12))))
    message = caught.value.message
    assert "vocabulary size 50 in llmd, 60 in vLLM" in message
    assert "EOS ids 2 in llmd, none in vLLM" in message
    assert "special token ids [0, 1, 2] in llmd, [0, 1, 2, 3, 4, 5, 6, 7, ... 4 more] in vLLM" in message


@pytest.mark.parametrize(("tokenizer_eos", "generation_eos", "expected"), [
    (2, None, {2}), (2, 7, {2, 7}), (2, [7, 8], {2, 7, 8}), (None, [7], {7}), (None, None, set()),
])
def test_vllm_stops_at_its_tokenizers_eos_and_the_generation_configs(
        tokenizer_eos: int | None, generation_eos: int | list[int] | None, expected: set[int]) -> None:
    assert stop_ids(tokenizer_eos, generation_eos) == expected


def test_serving_on_vllm_without_it_installed_names_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as caught:
        launch.require_vllm(vllm_profile())
    assert "scripts/vllm-env" in caught.value.message and caught.value.param == "engine"
