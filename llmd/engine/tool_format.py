"""How a model writes tool calls and thinking, read from its chat template (no operator flag).

As llama.cpp does, the template's own text says the format: a template that renders assistant
calls between `<tool_call>` tags is Hermes-style (Qwen2.5, Qwen3, Hermes), one with
`<function=` and `<parameter=` is Qwen3-Coder's XML, one with `[TOOL_CALLS]` is Mistral's (its
newer `NAME[ARGS]{...}` form where the template has `[ARGS]`), one
that asks for `"parameters"` JSON with `<|python_tag|>` or `ipython` turns is Llama 3.x's. A
template with none of them, or that does not read `tools`, gets the generic format: the tools
described in a system message, calls written between `<tool_call>` tags (the grammar holds the
model to it).

Thinking markers come from the template too (`<think>`/`</think>`): a template that renders them
marks a reasoning model. Pure: no tokenizer, no torch.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# A template that reads the `tools` variable renders the tools itself.
TOOLS_VARIABLE = re.compile(r"\btools\b")


class ToolSyntax(enum.Enum):
    """The shapes of tool calls a model writes."""

    HERMES = "hermes"  # <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one per call
    LLAMA3_JSON = "llama3_json"  # {"name": ..., "parameters": {...}}, optionally after <|python_tag|>
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    QWEN3_CODER = "qwen3_coder"  # <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
    GENERIC = "generic"  # Hermes's tags, taught by a system message: the template knows no tools


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """One model's tool-call syntax and its marker strings.

    `start` opens a call (Mistral: the whole list of calls; Llama 3: nothing, the JSON object
    itself is the call), `end` closes it ("" where the JSON's own end does), `arguments_key` is
    the JSON key holding the arguments.
    """

    syntax: ToolSyntax
    start: str
    end: str
    arguments_key: str = "arguments"
    name_separator: str = ""  # Mistral's newer `[TOOL_CALLS]NAME[ARGS]{...}`: what parts name and arguments


HERMES = ToolFormat(ToolSyntax.HERMES, "<tool_call>", "</tool_call>")
LLAMA3_JSON = ToolFormat(ToolSyntax.LLAMA3_JSON, "", "", "parameters")
MISTRAL = ToolFormat(ToolSyntax.MISTRAL, "[TOOL_CALLS]", "")
MISTRAL_NAMED = ToolFormat(ToolSyntax.MISTRAL, "[TOOL_CALLS]", "", name_separator="[ARGS]")
QWEN3_CODER = ToolFormat(ToolSyntax.QWEN3_CODER, "<tool_call>", "</tool_call>")
GENERIC = ToolFormat(ToolSyntax.GENERIC, "<tool_call>", "</tool_call>")


@dataclass(frozen=True, slots=True)
class ReasoningMarkers:
    """The strings around a reasoning model's thinking."""

    start: str = "<think>"
    end: str = "</think>"


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """What the API layer needs to know about the model's chat output: its tool-call format,
    its thinking markers (None: not a reasoning model), and whether its template renders
    `tools` itself (otherwise llmd describes them in a system message). The tokenizer fills in
    `tokens`: the template's markers that grammars must write as tokens, never as text."""

    tools: ToolFormat = GENERIC
    reasoning: ReasoningMarkers | None = None
    template_renders_tools: bool = False
    tokens: tuple[tuple[str, int], ...] = ()  # markers that are single tokens, and their ids


PLAIN = ChatFormat()


def grammar_token(content: str, special: bool) -> bool:
    """Whether llguidance keeps an added token out of text, so grammars must name it: a special
    one, or one written like a tag (`<tool_call>`, `<think>`; not `<function=`)."""
    return special or (len(content) > 1 and content.startswith("<") and content.endswith(">"))


def detect_tool_format(template: str) -> ToolFormat:
    """The tool-call format a chat template renders, from its marker strings; `GENERIC` if none."""
    if "<function=" in template and "<parameter=" in template:
        return QWEN3_CODER
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL_NAMED if MISTRAL_NAMED.name_separator in template else MISTRAL
    if '"parameters"' in template and ("<|python_tag|>" in template or "ipython" in template):
        return LLAMA3_JSON
    return GENERIC


def detect_chat_format(template: str) -> ChatFormat:
    """Everything `ChatFormat` says, read from the template's text."""
    reasoning = ReasoningMarkers() if "<think>" in template and "</think>" in template else None
    tools = detect_tool_format(template) if TOOLS_VARIABLE.search(template) else GENERIC
    # A template that renders tools in a format llmd does not know is given none: the generic
    # format's system message teaches the model the one the grammar holds it to.
    return ChatFormat(tools, reasoning, template_renders_tools=tools is not GENERIC)
