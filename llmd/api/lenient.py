"""The chat request's allow-list: what llmd accepts because it cannot change a local answer.

The rule stays "never silently ignore a field that changes the answer". Clients send more than
that, though: the SDKs echo an assistant reply back with `refusal: null` and friends, agent
frameworks add `store`, `metadata`, `prompt_cache_key`. Such a field is accepted here only
when, and only with the values for which, it cannot change what a local model answers; any
other value asks for something llmd does not do and is refused with a 400 naming it. Every
refusal of one body is gathered into one 400 (message lists each, `param` names the first),
so a client learns all it must drop at once. What was ignored is logged at debug level.

`n`, `logprobs`, `top_logprobs`, `logit_bias` and tools are not here: they are served (`api/chat.py`,
`api/tools.py`).

Pure: no engine, no web framework; `api/chat.py` calls it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from llmd.errors import UnsupportedParameter
from llmd.protocol import ChatCompletionRequest, ChatMessage, ContentPart, StreamOptions

log = logging.getLogger("llmd.api")

# Request fields accepted and ignored, and why none can change a local answer.
IGNORED_FIELDS: dict[str, str] = {
    "store": "llmd stores no completions",
    "metadata": "tags for OpenAI's dashboard; nothing reads them here",
    "service_tier": "there is one tier: this machine",
    "user": "an end-user id for abuse monitoring",
    "safety_identifier": "an end-user id for abuse monitoring",
    "prompt_cache_key": "llmd's prefix cache finds shared prefixes by their tokens",
    "prompt_cache_retention": "llmd's prefix cache keeps what its memory budget allows",
    "verbosity": "a hint to OpenAI's GPT-5 models that no local chat template reads",
    "stream_options": "ignored when not streaming (`include_usage` shapes only the stream)",
    "modalities": 'accepted only as ["text"], what llmd answers in anyway',
}
# Fields of an assistant turn, as the SDKs echo a reply back, accepted and ignored.
IGNORED_MESSAGE_FIELDS: dict[str, str] = {
    "refusal": "null, or a refusal text that stands in for empty content",
    "annotations": "citations of OpenAI's web search",
    "audio": "accepted only as null",
    "function_call": "accepted only as null",
}
ASSISTANT_ONLY = (*IGNORED_MESSAGE_FIELDS, "tool_calls", "reasoning_content", "reasoning")
UNKNOWN = "is not supported by llmd"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One field of a body that llmd refuses, and why (a clause that follows the field's name)."""

    param: str
    reason: str


def refuse(refusals: list[Refusal]) -> UnsupportedParameter:
    """One 400 for all of a body's refusals: the message lists each, `param` names the first."""
    clauses = [f"`{r.param}` {r.reason}" for r in refusals]
    message = clauses[0] if len(clauses) == 1 else f"{len(clauses)} fields are refused: " + "; ".join(clauses)
    return UnsupportedParameter(message, param=refusals[0].param)


def json_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is not one (the Struct decode says why)."""
    try:
        document = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return document if isinstance(document, dict) else None


def unknown_fields(raw: bytes) -> list[Refusal]:
    """Every field of the JSON body that no request Struct declares, with its path.

    A content part that is not text is named by its `type` (an image part's `image_url` is
    not the problem; its being an image is). [] when the body is not a JSON object.
    """
    document = json_object(raw)
    if document is None:
        return []
    found = extra_keys(document, ChatCompletionRequest, "")
    if isinstance(document.get("stream_options"), dict):
        found += extra_keys(document["stream_options"], StreamOptions, "stream_options.")
    messages = document.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        found += message_unknowns(message, f"messages[{i}]")
    return found


def message_unknowns(message: object, path: str) -> list[Refusal]:
    """Unknown fields of one message and of its content parts."""
    if not isinstance(message, dict):
        return []
    found = extra_keys(message, ChatMessage, f"{path}.")
    parts = message.get("content")
    for j, part in enumerate(parts if isinstance(parts, list) else []):
        if not isinstance(part, dict):
            continue
        if part.get("type") != "text":
            found.append(part_type_refusal(part.get("type"), f"{path}.content[{j}]"))
        else:
            found += extra_keys(part, ContentPart, f"{path}.content[{j}].")
    return found


def extra_keys(document: dict[str, Any], struct: type[msgspec.Struct], prefix: str) -> list[Refusal]:
    """The keys of `document` that `struct` does not declare."""
    known = set(struct.__struct_fields__)
    return [Refusal(f"{prefix}{key}", UNKNOWN) for key in document if key not in known]


def part_type_refusal(kind: object, path: str) -> Refusal:
    """A content part llmd cannot read (image, audio, file): named by its type."""
    return Refusal(f"{path}.type", f"`{kind}` is not supported; llmd reads text parts only")


def unsupported_values(body: ChatCompletionRequest) -> list[Refusal]:
    """The allow-listed fields of a decoded body whose values could change the answer."""
    found = [Refusal(param, reason) for param, reason in request_value_problems(body)]
    for i, message in enumerate(body.messages):
        found += message_value_problems(message, f"messages[{i}]")
    return found


def request_value_problems(body: ChatCompletionRequest) -> list[tuple[str, str]]:
    """(param, reason) for each request-level value llmd cannot honour, in the wire Struct's order."""
    checks = [
        ("modalities", body.modalities is not None and any(m != "text" for m in body.modalities),
         'must be ["text"]: llmd answers in text only'),
    ]
    return [(param, reason) for param, refused, reason in checks if refused]


def message_value_problems(message: ChatMessage, path: str) -> list[Refusal]:
    """Values of one message llmd cannot honour: turn fields on the wrong role, audio, parts."""
    if message.role == "assistant":
        found = [Refusal(f"{path}.{name}", reason) for name, reason in assistant_problems(message)]
    else:
        found = [Refusal(f"{path}.{name}", "is only accepted on an assistant message")
                 for name in ASSISTANT_ONLY if getattr(message, name) is not None]
    if message.tool_call_id is not None and message.role != "tool":
        found.append(Refusal(f"{path}.tool_call_id", "is only accepted on a tool message"))
    parts = message.content if isinstance(message.content, list) else []
    return found + [part_type_refusal(part.type, f"{path}.content[{j}]")
                    for j, part in enumerate(parts) if part.type != "text"]


def assistant_problems(message: ChatMessage) -> list[tuple[str, str]]:
    """(field, reason) for each echoed assistant field that refers to something llmd never made."""
    checks = [
        ("audio", message.audio is not None, "must be null: llmd has no audio replies to refer to"),
        ("function_call", message.function_call is not None,
         "must be null: the legacy functions API is not served; send `tool_calls`"),
    ]
    return [(name, reason) for name, refused, reason in checks if refused]


def ignored_fields(body: ChatCompletionRequest) -> list[str]:
    """The paths of the allow-listed fields this body set, all of them ignored."""
    names = [name for name in IGNORED_FIELDS if getattr(body, name) is not None]
    if body.stream and "stream_options" in names:
        names.remove("stream_options")
    for i, message in enumerate(body.messages):
        names += [f"messages[{i}].{name}" for name in IGNORED_MESSAGE_FIELDS
                  if getattr(message, name) is not None]
        parts = message.content if isinstance(message.content, list) else []
        names += [f"messages[{i}].content[{j}].cache_control" for j, part in enumerate(parts)
                  if part.cache_control is not None]
    return names


def log_ignored(body: ChatCompletionRequest) -> None:
    """Say at debug level which fields were accepted and ignored (nothing is computed otherwise)."""
    if log.isEnabledFor(logging.DEBUG):
        names = ignored_fields(body)
        if names:
            log.debug("accepted and ignored (they cannot change a local answer): %s", ", ".join(names))
