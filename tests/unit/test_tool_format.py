"""The tool-call and thinking formats read from chat templates (the test templates imitate each
family's marker strings), and the grammars built for them: what each lets a reply say."""

from __future__ import annotations

import pytest
from llguidance import LLMatcher

from llmd.api.tool_grammar import (
    NO_PARAMETERS,
    CallPlan,
    Spelling,
    Thinking,
    ToolSpec,
    call_grammar,
    json_grammar,
)
from llmd.engine.tool_format import (
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_NAMED,
    QWEN3_CODER,
    ReasoningMarkers,
    ToolFormat,
    detect_chat_format,
    grammar_token,
)
from tests.helpers import tool_templates
from tests.helpers.byte_tokenizer import END, byte_tokenizer

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]})
NOW = ToolSpec("now", NO_PARAMETERS)
MARKERS = ReasoningMarkers()


@pytest.mark.parametrize(("template", "tools", "reasoning"), [
    (tool_templates.HERMES_QWEN25, HERMES, False),
    (tool_templates.QWEN3_THINKING, HERMES, True),
    (tool_templates.DEEPSEEK_R1, GENERIC, True),
    (tool_templates.LLAMA31_JSON, LLAMA3_JSON, False),
    (tool_templates.MISTRAL, MISTRAL, False),
    (tool_templates.QWEN3_CODER, QWEN3_CODER, False),
    (tool_templates.PLAIN, GENERIC, False),
])
def test_the_format_is_read_from_the_template(template: str, tools: ToolFormat, reasoning: bool) -> None:
    chat = detect_chat_format(template)
    assert chat.tools == tools and (chat.reasoning is not None) == reasoning
    assert chat.template_renders_tools == (tools is not GENERIC)


TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "</parameter>")  # tokens in Qwen's vocabulary


# Mistral's `[TOOL_CALLS]` is special; with `tags`, Qwen's tags are added tokens (llguidance keeps them
# out of text).
TOKENIZERS = {tags: byte_tokenizer([MISTRAL.start], TAGS if tags else ()) for tags in (False, True)}
MISTRAL_TOKEN = TOKENIZERS[False][0].token_to_id(MISTRAL.start)
TAG_SPELLING = Spelling({tag: TOKENIZERS[True][0].token_to_id(tag) for tag in TAGS})


def follows(grammar: str, text: str, tags: bool = False) -> bool:
    """Whether `text`, then the end token, is a whole reply the grammar allows (`tags`: on the
    tokenizer whose Qwen tags are tokens)."""
    tokenizer, view = TOKENIZERS[tags]
    matcher = LLMatcher(view, LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids = [*tokenizer.encode(text).ids, tokenizer.token_to_id(END)]
    return all(matcher.consume_token(token) for token in ids) and matcher.is_stopped()


def grammar(fmt: ToolFormat, required: bool = False, parallel: bool = True,
            thinking: Thinking = Thinking.NONE, tools: tuple[ToolSpec, ...] = (WEATHER, NOW),
            spell: Spelling | None = None) -> str:
    spell = spell or (Spelling({MISTRAL.start: MISTRAL_TOKEN}) if fmt is MISTRAL else Spelling())
    return call_grammar(fmt, CallPlan(tools, required, parallel), thinking, MARKERS, spell)


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Seoul"}}\n</tool_call>'
NOW_CALL = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
CALLS = {
    HERMES: HERMES_CALL,
    LLAMA3_JSON: '{"name": "get_weather", "parameters": {"city": "Seoul", "days": 3}}',
    MISTRAL: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Seoul"}}, '
             '{"name": "now", "arguments": {}}]',
    QWEN3_CODER: "<tool_call>\n<function=get_weather>\n<parameter=city>\nSeoul\n</parameter>\n"
                 "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
}


@pytest.mark.parametrize("fmt", list(CALLS))
def test_auto_allows_text_or_text_then_calls(fmt: ToolFormat) -> None:
    auto = grammar(fmt)
    assert follows(auto, "Just an answer.") and follows(auto, CALLS[fmt])
    assert follows(auto, "Let me look. " + CALLS[fmt])


@pytest.mark.parametrize("fmt", list(CALLS))
def test_required_starts_with_a_call_and_thinking_comes_first(fmt: ToolFormat) -> None:
    assert follows(grammar(fmt, required=True), CALLS[fmt])
    assert not follows(grammar(fmt, required=True), "Let me look. " + CALLS[fmt])
    assert not follows(grammar(fmt, required=True), "No call.")
    assert follows(grammar(fmt, required=True, thinking=Thinking.OPEN), "Hmm.</think>\n\n" + CALLS[fmt])
    optional = grammar(fmt, required=True, thinking=Thinking.OPTIONAL)
    assert follows(optional, "<think>Hmm.</think>\n\n" + CALLS[fmt]) and follows(optional, CALLS[fmt])


def test_a_call_marker_in_auto_text_holds_the_rest_to_a_call() -> None:
    auto = grammar(HERMES)
    assert not follows(auto, "Let me look. <tool_call>\nnot json")
    assert not follows(auto, HERMES_CALL.replace("get_weather", "get_time"))  # not a tool
    assert not follows(auto, HERMES_CALL.replace('"Seoul"', "3"))  # the parameters' schema holds
    assert not follows(auto, HERMES_CALL + " and more text")


def test_parallel_calls_only_when_allowed() -> None:
    both = HERMES_CALL + "\n" + NOW_CALL
    assert follows(grammar(HERMES, required=True), both)
    assert not follows(grammar(HERMES, required=True, parallel=False), both)
    assert follows(grammar(HERMES, required=True, parallel=False), NOW_CALL)
    mistral_one = '[TOOL_CALLS][{"name": "now", "arguments": {}}]'
    assert follows(grammar(MISTRAL, parallel=False), mistral_one)
    assert not follows(grammar(MISTRAL, parallel=False), CALLS[MISTRAL])


def test_a_named_tool_is_the_only_call_and_parameterless_tools_take_empty_objects() -> None:
    named = grammar(HERMES, required=True, parallel=False, tools=(NOW,))
    assert follows(named, NOW_CALL) and not follows(named, HERMES_CALL)
    assert not follows(named, NOW_CALL.replace("{}", '{"x": 1}'))


def test_qwen3_coder_strings_are_raw_text_and_enums_are_kept() -> None:
    color = {"type": "string", "enum": ["red", "blue"]}
    enum = ToolSpec("pick", {"type": "object", "properties": {"color": color}, "required": ["color"]})
    pick = "<tool_call>\n<function=pick>\n<parameter=color>\n{}\n</parameter>\n</function>\n</tool_call>"
    xml = grammar(QWEN3_CODER, required=True, tools=(enum, WEATHER))
    assert follows(xml, pick.format("red")) and not follows(xml, pick.format("green"))
    multiline = CALLS[QWEN3_CODER].replace("Seoul", "Seoul,\nKorea")
    assert follows(xml, multiline)
    assert not follows(xml, CALLS[QWEN3_CODER].replace("\n3\n", "\nthree\n"))  # an integer is JSON


def test_the_mistral_marker_is_its_token_never_text() -> None:
    text_marker = call_grammar(MISTRAL, CallPlan((NOW,), True, True), Thinking.NONE, None)
    assert '"[TOOL_CALLS]"' in text_marker
    assert f"<[{MISTRAL_TOKEN}]>" in grammar(MISTRAL)


def test_json_follows_the_thinking() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert follows(json_grammar(schema, Thinking.OPEN, MARKERS), 'I should say 1.</think>\n{"a": 1}')
    assert follows(json_grammar(schema, Thinking.OPTIONAL, MARKERS), '{"a": 1}')
    assert not follows(json_grammar(schema, Thinking.NONE, MARKERS), '<think>x</think>{"a": 1}')
    assert not follows(json_grammar(schema, Thinking.NONE, MARKERS), '{"a":1}')  # llmd's JSON layout


@pytest.mark.parametrize("fmt", [HERMES, QWEN3_CODER])
def test_tags_that_are_tokens_are_written_as_tokens(fmt: ToolFormat) -> None:
    for required in (True, False):
        tagged = grammar(fmt, required=required, thinking=Thinking.OPTIONAL, spell=TAG_SPELLING)
        assert follows(tagged, CALLS[fmt], tags=True)
        assert follows(tagged, "<think>Hmm.</think>\n\n" + CALLS[fmt], tags=True)
        assert not follows(tagged, CALLS[fmt], tags=False)  # the tags spelled out as text are refused
    assert follows(grammar(fmt, spell=TAG_SPELLING), "Text, then " + CALLS[fmt], tags=True)
    assert follows(grammar(fmt, spell=TAG_SPELLING), "Only text.", tags=True)


def test_the_tag_rule_matches_llguidance() -> None:
    tokenizer, view = TOKENIZERS[True]
    for text in (*TAGS, MISTRAL.start, END):
        token = tokenizer.token_to_id(text)
        assert grammar_token(text, special=text in (MISTRAL.start, END)) == view.is_special_token(token)


def test_mistrals_named_form_is_read_from_its_args_marker_and_followed() -> None:
    named = detect_chat_format(tool_templates.MISTRAL.replace("[TOOL_CALLS]", "[TOOL_CALLS]{{ name }}[ARGS]"))
    assert named.tools == MISTRAL_NAMED
    one, two = '[TOOL_CALLS]get_weather[ARGS]{"city": "Seoul"}', "[TOOL_CALLS]now[ARGS]{}"
    spell = Spelling({MISTRAL.start: MISTRAL_TOKEN})
    assert follows(grammar(MISTRAL_NAMED, spell=spell), one + two)
    assert follows(grammar(MISTRAL_NAMED, spell=spell), "Text first. " + one)
    assert not follows(grammar(MISTRAL_NAMED, parallel=False, spell=spell), one + two)
    assert not follows(grammar(MISTRAL_NAMED, spell=spell), '[TOOL_CALLS][{"name": "now", "arguments": {}}]')
