"""The Responses API (`POST /v1/responses`) as the bench speaks it: the body, and its stream read.

`--api responses` sends each chat request the bench would send as a Responses request: the
messages as `input`, `max_output_tokens`, `text.format` for a JSON schema, `store: false`, and
llmd's `ignore_eos` extension where the chat body had it. Its stream is typed events (`event:
<type>` with a JSON `type`), ending with `response.completed`, `response.incomplete` or a failure
(`response.failed`, an `error` event), without `data: [DONE]`. Timing is counted as for chat
(llmd/bench/http.py): each text delta (output or reasoning) is a content chunk stamped when it was
parsed, and the completion tokens are the terminal event's `usage.output_tokens`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmd.bench.results import StreamResult
from llmd.bench.sse import SSEEvent

PATH = "/responses"
END = "its response.completed or response.incomplete event"
# Deltas that carry generated text, as chat's `content` and `reasoning_content` do.
TEXT_DELTAS = frozenset({
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
})
# llmd extensions the chat body may carry that mean the same on /v1/responses.
EXTENSIONS = ("ignore_eos", "min_tokens")


def responses_body(chat: dict[str, Any]) -> dict[str, Any]:
    """The streamed Responses request equal to the chat completion request `chat`."""
    body: dict[str, Any] = {
        "model": chat["model"],
        "input": [{"role": m["role"], "content": m["content"]} for m in chat["messages"]],
        "max_output_tokens": chat["max_tokens"],
        "temperature": chat["temperature"],
        "stream": chat["stream"],
        "store": False,
    }
    body.update({key: chat[key] for key in EXTENSIONS if key in chat})
    if "response_format" in chat:
        body["text"] = {"format": text_format(chat["response_format"])}
    return body


def text_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """Chat's `response_format` as the Responses API's `text.format`: a json_schema's
    name, schema and strict move up beside its type."""
    if response_format.get("type") != "json_schema":
        return dict(response_format)
    return {"type": "json_schema", **response_format["json_schema"]}


def record_response_events(result: StreamResult, events: Sequence[SSEEvent]) -> None:
    """Apply Responses stream events in order until one ends the stream."""
    for event in events:
        if record_response_event(result, event):
            return


def record_response_event(result: StreamResult, event: SSEEvent) -> bool:
    """Apply one event to `result`; True once the stream is over (its terminal event or an error)."""
    try:
        payload = json.loads(event.data)
    except ValueError:
        result.error = f"unparseable event data: {event.data[:200]}"
        return True
    kind = payload.get("type") if isinstance(payload, dict) else None
    if not isinstance(kind, str):
        result.error = f"an event without a type: {event.data[:200]}"
        return True
    if kind == "error" or event.event == "error":
        result.error = f"stream error event: {event.data[:200]}"
        return True
    if kind in TEXT_DELTAS:
        _record_delta(result, payload, event.time)
        return False
    if kind in ("response.completed", "response.incomplete", "response.failed"):
        _record_end(result, kind, payload.get("response"), event.time)
        return True
    return False  # created, in_progress, item and part events, tool call arguments


def _record_delta(result: StreamResult, payload: dict[str, Any], arrived: float) -> None:
    text = payload.get("delta")
    if isinstance(text, str) and text:
        result.chunk_times.append(arrived)
        if result.text is not None:
            result.text.append(text)


def _record_end(result: StreamResult, kind: str, response: Any, arrived: float) -> None:
    """The terminal event: a failure is the stream's error; otherwise its usage and why it ended."""
    response = response if isinstance(response, dict) else {}
    if kind == "response.failed":
        result.error = f"response.failed: {json.dumps(response.get('error'))[:200]}"
        return
    _record_usage(result, response.get("usage"))
    result.done, result.finished = True, arrived
    result.finish_reason = finish_reason(response)


def _record_usage(result: StreamResult, usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("output_tokens"), int):
        result.completion_tokens = usage["output_tokens"]
    if isinstance(usage.get("input_tokens"), int):
        result.prompt_tokens = usage["input_tokens"]


def finish_reason(response: dict[str, Any]) -> str:
    """Chat's name for how a response ended: `stop`, or `length` for a cut by
    max_output_tokens (another incomplete reason, e.g. content_filter, as it is)."""
    if response.get("status") != "incomplete":
        return "stop"
    details = response.get("incomplete_details") or {}
    reason = details.get("reason") if isinstance(details, dict) else None
    return "length" if reason in (None, "max_output_tokens") else str(reason)
