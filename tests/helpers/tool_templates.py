"""Chat templates for the tool-calling and reasoning tests, one per model family llmd detects.

Written here for the tests: each imitates only the marker strings of a released family's template
and how it uses `tools`, assistant `tool_calls`, `tool` results and thinking, never its wording.
Turns use the demo tokenizer's markers (`<|start_header|>role<|end_header|>\\n\\n ... <|eot|>`), so
any of them fits `build_scripted_model`; `template_tokens` names the marker strings a template
uses, which the fixture tokenizer must hold as tokens (as the real vocabularies do).

Assistant `tool_calls` arguments may be a dict (llmd converts the wire's JSON strings to objects
before rendering, as vLLM does) or, from other callers, a string: the JSON templates render both;
QWEN3_CODER, which writes one block per argument, raises on a string (as the released one fails).
"""

from __future__ import annotations

from typing import TypedDict

# The text of a message's content: a string, None (an assistant turn with only calls), or parts.
_TEXT = r"""
{%- macro text(content) -%}
    {%- if content is string -%}{{ content }}
    {%- elif content -%}{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro header(role) -%}{{ '<|start_header|>' + role + '<|end_header|>\n\n' }}{%- endmacro -%}
{%- macro json_arguments(arguments) -%}
    {%- if arguments is string -%}{{ arguments }}{%- else -%}{{ arguments | tojson }}{%- endif -%}
{%- endmacro -%}
"""

# `tool` results, consecutive ones in one user turn, each inside <tool_response> tags.
_TOOL_RESPONSE = r"""
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ header('user') }}{%- endif -%}
        {{- '<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|eot|>' }}
        {%- else -%}{{ '\n' }}{%- endif -%}
"""

# Hermes / Qwen2.5: tools as JSON lines in the system turn, calls as JSON inside <tool_call> tags.
_HERMES_SYSTEM = r"""
{{- bos_token -}}
{%- set system = messages[0] if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
    {{- header('system') -}}
    {%- if system -%}{{ text(system.content) + '\n\n' }}{%- endif -%}
    {{- 'Functions you may call, one JSON description per line, inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}{{ '\n' + tool | tojson }}{%- endfor -%}
    {{- '\n</tools>\n\nTo call one, reply with a JSON object holding its "name" and its "arguments", '
        'between <tool_call> and </tool_call>:\n'
        '<tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call><|eot|>' -}}
{%- elif system -%}
    {{- header('system') + text(system.content) + '<|eot|>' -}}
{%- endif -%}
"""

_HERMES_CALLS = r"""
            {%- for tool_call in message.tool_calls -%}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                {%- if not loop.first or text(message.content) -%}{{ '\n' }}{%- endif -%}
                {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
                {{- json_arguments(call.arguments) + '}\n</tool_call>' -}}
            {%- endfor -%}
"""


def _hermes_family(thinking: bool) -> str:
    """The Hermes / Qwen2.5 template, or with thinking markers Qwen3's."""
    reasoning = (r"""
            {%- if message.reasoning_content is defined and message.reasoning_content -%}
                {{- '<think>\n' + message.reasoning_content.strip() + '\n</think>\n\n' -}}
            {%- endif -%}""" if thinking else "")
    no_thinking = (r"""
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}"""
                   if thinking else "")
    return _TEXT + _HERMES_SYSTEM + r"""
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'tool' -%}""" + _TOOL_RESPONSE + r"""
    {%- else -%}
        {{- header(message.role) -}}
        {%- if message.role == 'assistant' -%}""" + reasoning + r"""
            {{- text(message.content) -}}
            {%- if message.tool_calls -%}""" + _HERMES_CALLS + r"""
            {%- endif -%}
        {%- else -%}
            {{- text(message.content) -}}
        {%- endif -%}
        {{- '<|eot|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- header('assistant') -}}""" + no_thinking + r"""
{%- endif -%}
"""


HERMES_QWEN25 = _hermes_family(thinking=False)
QWEN3_THINKING = _hermes_family(thinking=True)

# DeepSeek-R1 distills: no tools; earlier replies lose their thinking; the reply starts inside it.
DEEPSEEK_R1 = _TEXT + r"""
{{- bos_token -}}
{%- for message in messages -%}
    {%- set content = text(message.content) -%}
    {%- if message.role == 'assistant' and '</think>' in content -%}
        {%- set content = content.split('</think>')[-1].lstrip() -%}
    {%- endif -%}
    {{- header(message.role) + content + '<|eot|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- header('assistant') + '<think>\n' -}}{%- endif -%}
"""

# Llama 3.1: JSON function descriptions in the first user turn, calls as {"name", "parameters"},
# results as `ipython` turns; built-in tools would be called after <|python_tag|>.
LLAMA31_JSON = _TEXT + r"""
{{- bos_token -}}
{%- set first_user = namespace(done=false) -%}
{%- if tools or (messages and messages[0].role == 'system') -%}
    {{- header('system') -}}
    {%- if tools -%}{{ 'Environment: ipython\n' }}{%- endif -%}
    {%- if builtin_tools is defined -%}
        {{- 'Tools: ' + builtin_tools | join(', ') + ' (call them after <|python_tag|>)\n' -}}
    {%- endif -%}
    {%- if messages and messages[0].role == 'system' -%}{{ text(messages[0].content) }}{%- endif -%}
    {{- '<|eot|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'user' and tools and not first_user.done -%}
        {%- set first_user.done = true -%}
        {{- header('user') -}}
        {{- 'Answer with a call to one of these functions when one helps. Reply with JSON only, in the form '
            '{"name": function name, "parameters": dictionary of argument name and its value}.\n\n' -}}
        {%- for tool in tools -%}{{ tool | tojson(indent=4) + '\n\n' }}{%- endfor -%}
        {{- text(message.content) + '<|eot|>' -}}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {{- header('assistant') -}}
        {%- for tool_call in message.tool_calls -%}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
            {%- if builtin_tools is defined and call.name in builtin_tools -%}
                {{- '<|python_tag|>' -}}
            {%- endif -%}
            {{- '{"name": "' + call.name + '", "parameters": ' + json_arguments(call.arguments) + '}' -}}
        {%- endfor -%}
        {{- '<|eot|>' -}}
    {%- elif message.role in ('tool', 'ipython') -%}
        {{- header('ipython') -}}
        {%- if message.content is mapping -%}{{ message.content | tojson }}
        {%- else -%}{{ text(message.content) }}{%- endif -%}
        {{- '<|eot|>' -}}
    {%- else -%}
        {{- header(message.role) + text(message.content) + '<|eot|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- header('assistant') -}}{%- endif -%}
"""

# Mistral: [AVAILABLE_TOOLS] before the last user turn, calls as [TOOL_CALLS] + a JSON list,
# results in [TOOL_RESULTS]; a prompt ends with [/INST] or [/TOOL_RESULTS] (no generation prompt).
MISTRAL = _TEXT + r"""
{{- bos_token -}}
{%- set system = messages[0] if messages and messages[0].role == 'system' else none -%}
{%- set last_user = namespace(index=-1) -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}{%- set last_user.index = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {%- if tools and loop.index0 == last_user.index -%}
            {{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' -}}
        {%- endif -%}
        {{- '[INST]' -}}
        {%- if system and loop.index0 == last_user.index -%}{{ text(system.content) + '\n\n' }}{%- endif -%}
        {{- text(message.content) + '[/INST]' -}}
    {%- elif message.role == 'assistant' -%}
        {{- text(message.content) -}}
        {%- if message.tool_calls -%}
            {{- '[TOOL_CALLS][' -}}
            {%- for tool_call in message.tool_calls -%}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                {{- '{"name": "' + call.name + '", "arguments": ' + json_arguments(call.arguments) -}}
                {%- if tool_call.id is defined -%}{{ ', "id": ' + tool_call.id | tojson }}{%- endif -%}
                {{- '}' + (', ' if not loop.last else '') -}}
            {%- endfor -%}
            {{- ']' -}}
        {%- endif -%}
        {{- '<|eot|>' -}}
    {%- elif message.role == 'tool' -%}
        {%- set result = {'call_id': message.tool_call_id, 'content': text(message.content)} -%}
        {{- '[TOOL_RESULTS]' + result | tojson + '[/TOOL_RESULTS]' -}}
    {%- endif -%}
{%- endfor -%}
"""

# Qwen3-Coder: tools described as XML-ish blocks, calls as <function=NAME> with <parameter=KEY>.
QWEN3_CODER = _TEXT + r"""
{{- bos_token -}}
{%- set system = messages[0] if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
    {{- header('system') -}}
    {%- if system -%}{{ text(system.content) + '\n\n' }}{%- endif -%}
    {{- 'These functions are available:\n\n<tools>' -}}
    {%- for tool in tools -%}
        {%- set function = tool.function if tool.function is defined else tool -%}
        {{- '\n<function>\n<name>' + function.name + '</name>' -}}
        {%- if function.description -%}
            {{- '\n<description>' + function.description + '</description>' -}}
        {%- endif -%}
        {{- '\n<parameters>' -}}
        {%- if function.parameters is defined and function.parameters.properties is defined -%}
            {%- for name, schema in function.parameters.properties | items -%}
                {{- '\n<parameter>\n<name>' + name + '</name>' -}}
                {{- '\n<type>' + (schema.type | default('string') | string) + '</type>' -}}
                {%- if schema.description is defined -%}
                    {{- '\n<description>' + schema.description + '</description>' -}}
                {%- endif -%}
                {{- '\n</parameter>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '\n</parameters>\n</function>' -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call a function, reply with exactly this shape, '
        'one <parameter=...> block per argument:\n<tool_call>\n<function=the_name>\n'
        '<parameter=the_argument>\nits value\n</parameter>\n</function>\n</tool_call><|eot|>' -}}
{%- elif system -%}
    {{- header('system') + text(system.content) + '<|eot|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'tool' -%}""" + _TOOL_RESPONSE + r"""
    {%- else -%}
        {{- header(message.role) + text(message.content) -}}
        {%- if message.role == 'assistant' and message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
                {%- if not loop.first or text(message.content) -%}{{ '\n' }}{%- endif -%}
                {{- '<tool_call>\n<function=' + call.name + '>\n' -}}
                {%- if call.arguments is mapping -%}
                    {%- for key, value in call.arguments | items -%}
                        {{- '<parameter=' + key + '>\n' -}}
                        {%- if value is string -%}{{ value }}{%- else -%}{{ value | tojson }}{%- endif -%}
                        {{- '\n</parameter>\n' -}}
                    {%- endfor -%}
                {%- else -%}
                    {{- raise_exception('this template renders tool call arguments '
                                        'from an object, not a string') -}}
                {%- endif -%}
                {{- '</function>\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|eot|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- header('assistant') -}}{%- endif -%}
"""

# No tools at all, in the demo template's style (but an assistant turn may have no content).
PLAIN = _TEXT + r"""
{{- bos_token -}}
{%- for message in messages -%}
    {{- header(message.role) + text(message.content) | trim + '<|eot|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- header('assistant') -}}{%- endif -%}
"""

TEMPLATES: dict[str, str] = {
    "hermes_qwen25": HERMES_QWEN25,
    "qwen3_thinking": QWEN3_THINKING,
    "deepseek_r1": DEEPSEEK_R1,
    "llama31_json": LLAMA31_JSON,
    "mistral": MISTRAL,
    "qwen3_coder": QWEN3_CODER,
    "plain": PLAIN,
}

# Marker strings a template may use: plain added tokens (decoded as text, as in Qwen's and
# DeepSeek's vocabularies) and control tokens (special, as in Llama 3's and Mistral's).
PLAIN_MARKERS = ("<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>", "</tool_response>",
                 "<think>", "</think>", "<function=", "</function>", "<parameter=", "</parameter>")
SPECIAL_MARKERS = ("<|python_tag|>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                   "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")


class TemplateTokens(TypedDict):
    """`build_scripted_model`'s `markers` and `special` for one template."""

    markers: tuple[str, ...]
    special: tuple[str, ...]


def template_tokens(template: str) -> TemplateTokens:
    """The marker strings `template` uses, to pass on as `build_scripted_model(..., **tokens)`."""
    return TemplateTokens(markers=tuple(marker for marker in PLAIN_MARKERS if marker in template),
                          special=tuple(marker for marker in SPECIAL_MARKERS if marker in template))
