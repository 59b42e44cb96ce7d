"""The tokenizer side of tools and thinking, on scripted models of each family: the format read from
the template, tools rendered (their special-token strings kept literal), the Mistral marker kept
in decoded text, a prompt that opened the thinking, and which markers grammars write as tokens."""

from __future__ import annotations

from pathlib import Path

import llguidance.hf
import pytest
from transformers import AutoTokenizer

from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.tool_format import HERMES, MISTRAL, QWEN3_CODER, grammar_token
from llmd.engine.types import TemplateOptions
from tests.helpers import tool_templates
from tests.helpers.scripted_model import build_scripted_model

ASK = [{"role": "user", "content": "Weather?"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Not <|eot|> here.",
                                         "parameters": {"type": "object", "properties": {}}}}


def scripted(tmp_path: Path, template: str, script: tuple[str, ...] = ("Hi.",)) -> Path:
    tokens = tool_templates.template_tokens(template)
    return build_scripted_model(tmp_path / "model", list(script), template, **tokens)


@pytest.mark.parametrize(("template", "tools"), [
    (tool_templates.HERMES_QWEN25, HERMES), (tool_templates.MISTRAL, MISTRAL),
    (tool_templates.QWEN3_CODER, QWEN3_CODER),
])
def test_the_format_and_its_token_markers(tmp_path: Path, template: str, tools: object) -> None:
    model = scripted(tmp_path, template)
    tokenizer = ChatTokenizer(model)
    assert tokenizer.chat_format.tools == tools and tokenizer.chat_format.template_renders_tools
    hf = AutoTokenizer.from_pretrained(str(model))
    view = llguidance.hf.from_tokenizer(hf)
    named = dict(tokenizer.chat_format.tokens)
    for token_id, token in hf.added_tokens_decoder.items():
        kept_out = grammar_token(token.content, token.special)
        assert kept_out == view.is_special_token(token_id), token.content  # llmd's rule is llguidance's
        assert (token.content in named) == (kept_out and token.content in template)


def test_tools_are_rendered_with_their_special_strings_literal(tmp_path: Path) -> None:
    tokenizer = ChatTokenizer(scripted(tmp_path, tool_templates.HERMES_QWEN25))
    ids = tokenizer.encode_chat(ASK, TemplateOptions(tools=[TOOL]))
    eot = tokenizer.eos_token_ids
    assert "get_weather" in tokenizer.decode(ids) and "Not <|eot|> here." in tokenizer.decode(ids)
    assert sum(1 for token in ids if token in eot) == 2  # the system and user turns' ends only


def test_the_mistral_marker_stays_in_decoded_text(tmp_path: Path) -> None:
    tokenizer = ChatTokenizer(scripted(tmp_path, tool_templates.MISTRAL))
    marker = dict(tokenizer.chat_format.tokens)[MISTRAL.start]
    ids = [marker, *tokenizer.encode_text('[{"name": "f"}]', literal=True), *tokenizer.eos_token_ids]
    assert tokenizer.decode(ids) == '[TOOL_CALLS][{"name": "f"}]'


@pytest.mark.parametrize(("template", "variables", "opened"), [
    (tool_templates.DEEPSEEK_R1, {}, True),
    (tool_templates.QWEN3_THINKING, {}, False),
    (tool_templates.QWEN3_THINKING, {"enable_thinking": False}, False),
    (tool_templates.HERMES_QWEN25, {}, False),
])
def test_whether_the_prompt_opened_the_thinking(tmp_path: Path, template: str, variables: dict[str, object],
                                                opened: bool) -> None:
    tokenizer = ChatTokenizer(scripted(tmp_path, template))
    ids = tokenizer.encode_chat(ASK, TemplateOptions(variables=variables))
    assert tokenizer.opens_reasoning(ids) is opened
    assert (tokenizer.chat_format.reasoning is not None) == (template is not tool_templates.HERMES_QWEN25)
