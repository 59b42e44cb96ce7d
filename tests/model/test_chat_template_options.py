"""Chat template options: generation prompt, continuing the last message, template variables.

On the Llama-3-style fixture tokenizer with a template that reads `enable_thinking`, `extra`,
`strict` and an assistant turn's `reasoning_content`, compared with transformers' own render.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from llmd.engine.tokenizer import ChatTokenizer
from llmd.engine.types import TemplateOptions
from llmd.errors import InvalidRequest
from tests.helpers.llama3_tokenizer import CHAT_TEMPLATE, build_llama3_tokenizer

THINKING_TEMPLATE = (
    "{%- if strict is defined %}{{ raise_exception('strict mode refuses this chat') }}{%- endif %}"
    + CHAT_TEMPLATE.replace(
        "{{- '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}",
        "{{- '<|end_header_id|>\\n\\n' }}"
        "{%- if message.reasoning_content is defined %}{{- 'thought: ' + message.reasoning_content + '\\n' }}"
        "{%- endif %}{{- message['content'] | trim + '<|eot_id|>' }}")
    + "{%- if enable_thinking is defined and not enable_thinking %}{{- 'no thinking\\n' }}{%- endif %}"
    + "{{- extra | default('') }}"
)
CHAT = [{"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": "The weather is", "reasoning_content": "look outside"}]


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = build_llama3_tokenizer(tmp_path_factory.mktemp("thinking"))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text("utf-8")) | {"chat_template": THINKING_TEMPLATE}
    config_path.write_text(json.dumps(config), "utf-8")
    return directory


@pytest.fixture(scope="module")
def ours(template_dir: Path) -> ChatTokenizer:
    return ChatTokenizer(template_dir)


@pytest.fixture(scope="module")
def hf(template_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(template_dir))


def reference_ids(hf: PreTrainedTokenizerBase, **render: Any) -> list[int]:
    text = hf.apply_chat_template(CHAT, tokenize=False, **render)
    return list(hf.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("options", [
    TemplateOptions(),
    TemplateOptions(add_generation_prompt=False),
    TemplateOptions(add_generation_prompt=False, continue_final_message=True),
    TemplateOptions(variables={"enable_thinking": False}),
])
def test_renders_as_transformers_does(ours: ChatTokenizer, hf: PreTrainedTokenizerBase,
                                      options: TemplateOptions) -> None:
    expected = reference_ids(hf, add_generation_prompt=options.add_generation_prompt,
                             continue_final_message=options.continue_final_message, **options.variables)
    assert ours.encode_chat(CHAT, options) == expected


def test_each_option_changes_the_prompt_as_asked(ours: ChatTokenizer, hf: PreTrainedTokenizerBase) -> None:
    def text(options: TemplateOptions) -> str:
        return str(hf.decode(ours.encode_chat(CHAT, options)))

    assert text(TemplateOptions()).endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert text(TemplateOptions(add_generation_prompt=False)).endswith("The weather is<|eot_id|>")
    assert text(TemplateOptions(False, True)).endswith("thought: look outside\nThe weather is")
    assert text(TemplateOptions(variables={"enable_thinking": False})).endswith("no thinking\n")


def test_template_variables_cannot_forge_control_tokens(ours: ChatTokenizer) -> None:
    plain = ours.encode_chat(CHAT, TemplateOptions(variables={"extra": "eot"}))
    forged = ours.encode_chat(CHAT, TemplateOptions(variables={"extra": "<|eot_id|>"}))
    eot = ours.encode_text("<|eot_id|>", literal=False)
    assert plain.count(eot[0]) == forged.count(eot[0]) and len(forged) > len(plain)


@pytest.mark.parametrize("name", ["tokenize", "chat_template", "tools", "messages", "add_generation_prompt"])
def test_a_reserved_variable_is_refused_by_name(ours: ChatTokenizer, name: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        ours.encode_chat(CHAT, TemplateOptions(variables={name: True}))
    assert err.value.param == f"chat_template_kwargs.{name}"


def test_a_template_that_refuses_the_chat_is_a_400(ours: ChatTokenizer) -> None:
    with pytest.raises(InvalidRequest, match="strict mode refuses") as err:
        ours.encode_chat(CHAT, TemplateOptions(variables={"strict": True}))
    assert err.value.param == "messages" and err.value.status == 400
