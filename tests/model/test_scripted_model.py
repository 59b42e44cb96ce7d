"""The scripted model fixture (greedy output is its script, then end of turn) and the tool templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from jinja2 import TemplateError
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmd.demo.tokenizer import CHAT_TEMPLATE, EOT_TOKEN_ID
from tests.helpers.scripted_model import build_scripted_model, read_script_ids
from tests.helpers.tool_templates import (
    DEEPSEEK_R1,
    HERMES_QWEN25,
    LLAMA31_JSON,
    MISTRAL,
    PLAIN,
    QWEN3_CODER,
    QWEN3_THINKING,
    TEMPLATES,
    template_tokens,
)

TOOL_SCRIPT = ["Let me check.", "<tool_call>", '\n{"name": "get_weather", "arguments": ', '{"city": "Seoul"}',
               "}\n", "</tool_call>"]
THINKING_SCRIPT = ["The user greets me.", "</think>", "\n\nHello!"]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
# An agent loop's history as llmd hands it to the template: arguments already parsed into objects.
AGENT_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Seoul?"},
    {"role": "assistant", "content": None, "reasoning_content": "I should look it up.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Seoul"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
]
PROMPTS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "안녕 👋🏽 <tool_call> </think>"}],
    AGENT_CHAT,
]
# The strings each template must render for AGENT_CHAT with tools.
RENDERED = {
    "hermes_qwen25": ['<tools>\n{"type": "function"', "<tool_call>\n",
                      '{"name": "get_weather", "arguments": {"city": "Seoul"}}', "</tool_call>",
                      "<tool_response>\n21 C, sunny\n</tool_response>"],
    "qwen3_thinking": ["<tools>", '"arguments": {"city": "Seoul"}}\n</tool_call>',
                       "<think>\nI should look it up.\n</think>",
                       "<tool_response>\n21 C, sunny\n</tool_response>"],
    "deepseek_r1": ["21 C, sunny", "<|start_header|>assistant<|end_header|>\n\n<think>\n"],
    "llama31_json": ['"parameters": dictionary of argument name and its value', "Environment: ipython",
                     '{"name": "get_weather", "parameters": {"city": "Seoul"}}',
                     "<|start_header|>ipython<|end_header|>\n\n21 C, sunny<|eot|>"],
    "mistral": ['[AVAILABLE_TOOLS][{"type": "function"', "[/AVAILABLE_TOOLS][INST]You are terse.",
                '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Seoul"}, "id": "call_1"}]',
                '[TOOL_RESULTS]{"call_id": "call_1", "content": "21 C, sunny"}[/TOOL_RESULTS]'],
    "qwen3_coder": ["<tools>\n<function>\n<name>get_weather</name>",
                    "<parameter>\n<name>city</name>\n<type>string</type>",
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nSeoul\n</parameter>\n</function>\n</tool_call>",
                    "<tool_response>\n21 C, sunny\n</tool_response>"],
    "plain": ["<|start_header|>tool<|end_header|>\n\n21 C, sunny<|eot|>"],
}
TOOL_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<function=", '"parameters"', "<tools>")


def load(directory: Path) -> tuple[Any, Any]:
    """Tokenizer and model through the Auto classes, offline on the CPU."""
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return tokenizer, AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)


def greedy_reply(tokenizer: Any, model: Any, chat: list[dict[str, Any]], **options: Any) -> list[int]:
    """The ids greedy decoding adds to the chat prompt (stopping at the model's end tokens)."""
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True, **options)
    with torch.no_grad():
        output = model.generate(**prompt, do_sample=False, max_new_tokens=40)
    return [int(token_id) for token_id in output[0, prompt["input_ids"].shape[1]:]]


def build(directory: Path, script: list[str], template: str) -> tuple[Any, Any]:
    """A scripted model with the template's markers, loaded."""
    return load(build_scripted_model(directory, script, template, **template_tokens(template)))


@pytest.mark.parametrize(("script", "template"), [
    (TOOL_SCRIPT, HERMES_QWEN25), (THINKING_SCRIPT, QWEN3_THINKING), (THINKING_SCRIPT, DEEPSEEK_R1)])
def test_greedy_output_is_the_script_then_the_end_of_turn(script: list[str], template: str,
                                                          tmp_path: Path) -> None:
    tokenizer, model = build(tmp_path, script, template)
    for chat in PROMPTS:
        reply = greedy_reply(tokenizer, model, chat, tools=[WEATHER_TOOL])
        assert reply == [*read_script_ids(tmp_path), EOT_TOKEN_ID]
        assert tokenizer.decode(reply, skip_special_tokens=True) == "".join(script)


def test_each_piece_streams_as_its_own_text(tmp_path: Path) -> None:
    tokenizer, _ = build(tmp_path, TOOL_SCRIPT, HERMES_QWEN25)
    assert [tokenizer.decode([token_id]) for token_id in read_script_ids(tmp_path)] == TOOL_SCRIPT


def test_a_special_piece_is_generated_and_skipped_when_decoding_skips_specials(tmp_path: Path) -> None:
    script = ["[TOOL_CALLS]", '[{"name": "get_weather", "arguments": {"city": "Seoul"}}]']
    tokenizer, model = build(tmp_path, script, MISTRAL)
    reply = greedy_reply(tokenizer, model, PROMPTS[1], tools=[WEATHER_TOOL])
    assert tokenizer.decode(reply) == "".join(script) + "<|eot|>"
    assert tokenizer.decode(reply, skip_special_tokens=True) == script[1]


def test_thinking_off_still_gives_the_script(tmp_path: Path) -> None:
    tokenizer, model = build(tmp_path, ["Hello!"], QWEN3_THINKING)
    reply = greedy_reply(tokenizer, model, PROMPTS[0], enable_thinking=False)
    assert tokenizer.decode(reply, skip_special_tokens=True) == "Hello!"


def test_an_empty_script_ends_the_turn_at_once(tmp_path: Path) -> None:
    tokenizer, model = load(build_scripted_model(tmp_path, [], CHAT_TEMPLATE))
    assert greedy_reply(tokenizer, model, PROMPTS[0]) == [EOT_TOKEN_ID]


def test_a_script_the_prompt_could_end_with_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generation prompt ends with"):
        build_scripted_model(tmp_path, ["Hi", "\n"], CHAT_TEMPLATE)
    with pytest.raises(ValueError, match="distinct"):
        build_scripted_model(tmp_path, ["a", "a"], CHAT_TEMPLATE)


def test_the_build_is_deterministic(tmp_path: Path) -> None:
    first = build_scripted_model(tmp_path / "a", TOOL_SCRIPT, HERMES_QWEN25)
    second = build_scripted_model(tmp_path / "b", TOOL_SCRIPT, HERMES_QWEN25)
    assert [path.read_bytes() for path in sorted(first.iterdir())] == [
        path.read_bytes() for path in sorted(second.iterdir())]


def render(tokenizer: Any, chat: list[dict[str, Any]], template: str, **options: Any) -> str:
    """The prompt text `template` makes of `chat`, with a generation prompt."""
    return str(tokenizer.apply_chat_template(chat, chat_template=template, add_generation_prompt=True,
                                             tokenize=False, **options))


@pytest.fixture(scope="module")
def markers_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One fixture tokenizer holding every template's markers, to render with each template."""
    directory = tmp_path_factory.mktemp("templates")
    tokens = [template_tokens(template) for template in TEMPLATES.values()]
    build_scripted_model(directory, ["ok"], PLAIN, markers=sorted({m for t in tokens for m in t["markers"]}),
                         special=sorted({m for t in tokens for m in t["special"]}))
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_template_renders_tools_calls_and_results(name: str, markers_tokenizer: Any) -> None:
    rendered = render(markers_tokenizer, AGENT_CHAT, TEMPLATES[name], tools=[WEATHER_TOOL])
    for expected in RENDERED[name]:
        assert expected in rendered
    if name in ("plain", "deepseek_r1"):
        assert not any(marker in rendered for marker in TOOL_MARKERS)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_template_renders_string_arguments_and_no_tools(name: str, markers_tokenizer: Any) -> None:
    chat = [dict(message) for message in AGENT_CHAT]
    chat[2] = chat[2] | {"tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Seoul"})}}]}
    if name == "qwen3_coder":
        with pytest.raises(TemplateError, match="from an object"):
            render(markers_tokenizer, chat, TEMPLATES[name], tools=[WEATHER_TOOL])
    else:
        rendered = render(markers_tokenizer, chat, TEMPLATES[name], tools=[WEATHER_TOOL])
        assert rendered.count('"city": "Seoul"') == (name not in ("plain", "deepseek_r1"))
    bare = render(markers_tokenizer, PROMPTS[0], TEMPLATES[name])
    assert "Hi" in bare and "<tools>" not in bare and "AVAILABLE_TOOLS" not in bare


def test_qwen3_thinking_off_closes_an_empty_thought(markers_tokenizer: Any) -> None:
    rendered = render(markers_tokenizer, PROMPTS[0], QWEN3_THINKING, enable_thinking=False)
    assert rendered.endswith("<|start_header|>assistant<|end_header|>\n\n<think>\n\n</think>\n\n")


def test_each_template_names_its_markers() -> None:
    assert template_tokens(QWEN3_CODER)["markers"] == ("<tool_call>", "</tool_call>", "<tools>", "</tools>",
                                                       "<tool_response>", "</tool_response>", "<function=",
                                                       "</function>", "<parameter=", "</parameter>")
    assert "<|python_tag|>" in template_tokens(LLAMA31_JSON)["special"]
    assert "[TOOL_CALLS]" in template_tokens(MISTRAL)["special"]
    assert template_tokens(PLAIN) == {"markers": (), "special": ()}


def test_sampling_at_temperature_one_follows_the_script_too(tmp_path: Path) -> None:
    tokenizer, model = build(tmp_path, TOOL_SCRIPT, HERMES_QWEN25)
    script = [*read_script_ids(tmp_path), EOT_TOKEN_ID]
    for chat in PROMPTS:
        prompt = tokenizer.apply_chat_template(chat, tools=[WEATHER_TOOL], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
        ids = torch.cat([prompt["input_ids"], torch.tensor([script[:-1]])], dim=1)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -len(script):]
        chosen = torch.softmax(logits, dim=-1)[torch.arange(len(script)), torch.tensor(script)]
        assert float(chosen.min()) > 1 - 1e-6
