"""The verdict on one chat completion SSE body that a client read to its end.

A whole stream is `data: <json>` events, then one terminal event (a chunk carrying a
`finish_reason`, or an error object), optionally a usage chunk after a finish, then
`data: [DONE]` and nothing more. A body that stops before `[DONE]` is *lost*; one that
reaches `[DONE]` but breaks the shape on the way is *garbled*. `scripts/soak` sorts every
stream it reads through here.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

DONE = b"[DONE]"


class StreamVerdict(enum.Enum):
    """How a stream read to its end looked."""

    WHOLE = "whole"
    GARBLED = "garbled"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """The verdict, how the stream ended (a finish reason or an error code), and why if bad."""

    verdict: StreamVerdict
    finish_reason: str | None = None
    error_code: str | None = None
    error_type: str | None = None  # `server_error` is the streamed twin of a 5xx
    problem: str = ""

    @property
    def outcome(self) -> str:
        """A short label for tallies: `stop`, `error:engine_error`, `garbled`, ..."""
        if self.verdict is not StreamVerdict.WHOLE:
            return self.verdict.value
        return f"error:{self.error_code}" if self.error_code is not None else str(self.finish_reason)


def check_stream(body: bytes) -> StreamCheck:
    """Judge a whole SSE body (the decoded HTTP body, not the chunked framing)."""
    events, tail = split_events(body)
    if DONE not in events:
        return StreamCheck(StreamVerdict.LOST, problem=f"no [DONE] after {len(events)} events")
    if events[-1] != DONE or tail.strip():
        return _garbled("bytes after [DONE]")
    try:
        payloads = [json.loads(event) for event in events[:-1]]
    except ValueError as exc:
        return _garbled(f"an event is not JSON: {exc}")
    return _check_payloads(payloads)


def split_events(body: bytes) -> tuple[list[bytes], bytes]:
    """The `data:` payloads of complete events, and the bytes after the last one.

    A complete event that is not a `data:` line is kept as-is with a marker so the
    caller sees it as garbage rather than skipping it.
    """
    pieces = body.split(b"\n\n")
    events = [piece[6:] if piece.startswith(b"data: ") else b"\x00" + piece for piece in pieces[:-1]]
    return events, pieces[-1]


def _check_payloads(payloads: list[Any]) -> StreamCheck:
    """Every payload is a chunk or the one final error; the stream ends once every choice it
    named has finished (each once, nothing for it after). Reported: the first choice's reason."""
    seen: set[int] = set()
    finished: dict[int, str] = {}
    for index, payload in enumerate(payloads):
        if _is_error(payload):
            if index != len(payloads) - 1:
                return _garbled("an error event is not the last before [DONE]")
            code, kind = payload["error"]["code"], payload["error"]["type"]
            return StreamCheck(StreamVerdict.WHOLE, error_code=str(code), error_type=str(kind))
        if not _is_chunk(payload):
            return _garbled(f"event {index} is neither a chunk nor an error: {str(payload)[:80]}")
        problem = _take_choices(payload, seen, finished)
        if problem:
            return _garbled(problem)
        if seen and len(finished) == len(seen):
            return _after_finish(finished[min(finished)], payloads[index + 1:])
    return _garbled(f"no finish_reason or error in {len(payloads)} events")


def _take_choices(chunk: dict[str, Any], seen: set[int], finished: dict[int, str]) -> str:
    """Note the chunk's choices and their finishes; what is wrong with them ("" when nothing)."""
    for choice in chunk["choices"]:
        position = choice.get("index", 0) if isinstance(choice, dict) else None
        if not isinstance(position, int):
            return f"a choice without an integer index: {str(choice)[:80]}"
        if position in finished:
            return f"a chunk for choice {position} after its finish_reason"
        seen.add(position)
        if choice.get("finish_reason") is not None:
            finished[position] = str(choice["finish_reason"])
    return ""


def _after_finish(reason: str, rest: list[Any]) -> StreamCheck:
    """After the finishing chunk only one usage chunk (no choices) may follow."""
    if not rest or (len(rest) == 1 and _is_chunk(rest[0]) and rest[0]["choices"] == []):
        return StreamCheck(StreamVerdict.WHOLE, finish_reason=reason)
    return _garbled(f"{len(rest)} events after finish_reason {reason!r}")


def _is_error(payload: Any) -> bool:
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= error.keys()


def _is_chunk(payload: Any) -> bool:
    return (isinstance(payload, dict) and payload.get("object") == "chat.completion.chunk"
            and isinstance(payload.get("choices"), list))


def _garbled(problem: str) -> StreamCheck:
    return StreamCheck(StreamVerdict.GARBLED, problem=problem)


def is_error_body(body: bytes) -> bool:
    """True when `body` is an OpenAI-shaped error: {"error": {message, type, param, code}}."""
    try:
        return _is_error(json.loads(body))
    except ValueError:
        return False
