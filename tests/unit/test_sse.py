"""SSE framing (llmd/api/sse.py): one `data:` event per payload, named events for the Responses
API, and the framings' ends. The pushed path itself: tests/unit/test_pushed_sse.py."""

from __future__ import annotations

import msgspec

from llmd.api.sse import DONE, LLAMA_EVENTS, NAMED_EVENTS, OPENAI_EVENTS, frames, named_events


class Piece(msgspec.Struct):
    text: str


class Named(msgspec.Struct):
    type: str
    sequence_number: int


def test_each_payload_is_one_data_event() -> None:
    assert frames([Piece("p0"), {"stop": True}]) == b'data: {"text":"p0"}\n\ndata: {"stop":true}\n\n'
    assert frames([]) == b""


def test_a_named_event_is_named_by_its_type_and_carries_it_too() -> None:
    batch = [Named("response.created", 0), Named("response.in_progress", 1)]
    assert named_events(batch) == (
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
        b'event: response.in_progress\ndata: {"type":"response.in_progress","sequence_number":1}\n\n')


def test_only_an_openai_stream_ends_with_done() -> None:
    assert OPENAI_EVENTS.last == DONE == b"data: [DONE]\n\n"
    assert NAMED_EVENTS.last == LLAMA_EVENTS.last == b""
