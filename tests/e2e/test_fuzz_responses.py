"""Property test: no `/v1/responses` body, valid or nearly so, gets a server error.

As `test_fuzz.py` does for chat: Hypothesis builds bodies from the Responses request's fields
(`llmd/responses_protocol.py`), every input item kind among them, and near-valid ones (one field
broken: a value out of range, a wrong type, an unknown item or tool kind, a bogus
`previous_response_id`). Against the session's real daemon each must answer below 500 with an
OpenAI-shaped error body, or a response that completed or stopped at the length limit; a stream
must be named events, numbered from 0, ending in `response.completed` or `response.incomplete`.
Seeded and bounded; no deadline, since the CPU may be busy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmd.bench.streamcheck import is_error_body
from tests.e2e.test_fuzz import SEEDS, TEMPERATURES, TEXT, TOP_PS, one_field_broken
from tests.helpers.daemon import Daemon

FIND = {
    "type": "function",
    "name": "find",
    "description": None,
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"q": {"type": "string", "maxLength": 4}},
        "required": ["q"],
    },
}
NOW = {"type": "function", "name": "now"}
TOOL_CHOICES = st.sampled_from(["none", "auto", "required", {"type": "function", "name": "now"}])
PARTS = st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": TEXT}), min_size=1, max_size=2)
OUTPUT_PARTS = st.lists(st.fixed_dictionaries({"type": st.just("output_text"), "text": TEXT}), max_size=2)
ITEMS = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer"]), "content": TEXT | PARTS}
    ),
    st.fixed_dictionaries(
        {"type": st.just("message"), "role": st.just("assistant"), "content": OUTPUT_PARTS},
        optional={"id": st.text(max_size=6), "status": st.just("completed")},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.text(max_size=6),
            "name": st.sampled_from(["now", "find"]),
            "arguments": st.sampled_from(["{}", '{"q": "x"}', ""]),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.text(max_size=6), "output": TEXT | PARTS}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("reasoning"),
            "summary": st.lists(
                st.fixed_dictionaries({"type": st.just("summary_text"), "text": TEXT}), max_size=2
            ),
        }
    ),
)
OUT_OF_RANGE = {
    "input": st.sampled_from(
        [
            [],
            3,
            [{"type": "web_search_call"}],
            [{"role": "robot", "content": "x"}],
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            [{"type": "item_reference", "id": "msg_nope"}],
            [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1"}],
        ]
    ),
    "temperature": st.sampled_from([-1.0, 2.5, float("inf"), "hot"]),
    "max_output_tokens": st.sampled_from([0, -1, 10**12, "3"]),
    "tools": st.sampled_from(
        [[{"type": "web_search"}], [{"type": "function", "name": "a b"}], [NOW, NOW], "x"]
    ),
    "tool_choice": st.sampled_from([{"type": "mcp"}, "sometimes", {"type": "function", "name": "other"}]),
    "text": st.sampled_from([{"format": {"type": "xml"}}, {"format": {"type": "json_schema"}}, "x"]),
    "previous_response_id": st.sampled_from(["resp_nope", "", 7]),
    "truncation": st.sampled_from(["auto", 1]),
    "background": st.just(True),
    "frequency_penalty": st.just(0.5),
    "model": st.sampled_from(["gpt-4o", "", 3]),
}


def valid_body() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "model": st.just("tiny"),
            "input": TEXT | st.lists(ITEMS, min_size=1, max_size=4),
            "max_output_tokens": st.integers(1, 4),
        },
        optional={
            "instructions": TEXT,
            "temperature": TEMPERATURES,
            "top_p": TOP_PS,
            "seed": SEEDS,
            "stream": st.booleans(),
            "store": st.booleans(),
            "parallel_tool_calls": st.booleans(),
            "tools": st.sampled_from([[NOW], [NOW, FIND]]),
            "tool_choice": TOOL_CHOICES,
            "text": st.sampled_from(
                [
                    {"format": {"type": "text"}},
                    {"format": {"type": "json_object"}},
                    {"format": {"type": "json_schema", "name": "q", "schema": FIND["parameters"]}},
                ]
            ),
            "reasoning": st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["low", "none"])}),
            "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
            "include": st.just(["reasoning.encrypted_content"]),
            "truncation": st.just("disabled"),
            "user": st.text(max_size=8),
        },
    )


def near_valid_body() -> st.SearchStrategy[dict[str, Any]]:
    """A valid Responses body with one field broken."""
    return one_field_broken(valid_body(), OUT_OF_RANGE)


def judge_stream(text: str) -> None:
    """Named events numbered from 0, ending in a completed or incomplete response."""
    events = []
    for block in filter(None, text.split("\n\n")):
        name, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}", block[:300]
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.base_url, timeout=120) as client:
        yield client


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=valid_body() | near_valid_body())
def test_no_responses_body_gets_a_server_error(http: httpx.Client, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode(errors="surrogatepass")
    reply = http.post("/responses", content=payload, headers={"Content-Type": "application/json"})
    assert reply.status_code < 500, (reply.status_code, reply.text[:300])
    if reply.status_code >= 400:
        assert is_error_body(reply.content), reply.text[:300]
    elif body.get("stream"):
        judge_stream(reply.text)
    else:
        assert reply.json()["status"] in ("completed", "incomplete"), reply.text[:300]
