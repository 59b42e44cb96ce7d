"""Property test: no chat completion body, valid or nearly so, gets a server error.

Hypothesis builds bodies from the fields of `ChatCompletionRequest` (llmd/protocol.py):
schema-valid ones, including the extreme values that once broke sampling (temperature
~1e-38, top_p ~1e-45), and near-valid ones (a value out of range, a wrong type, an
unknown field, a model nobody serves). Against one real daemon on the tiny model each
must answer below 500; an error body must have the OpenAI shape; a stream must end with
a finish_reason or a client error and then `[DONE]`. Seeded (derandomized) and bounded
at 300 examples; no deadline, since the CPU may be busy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmd.bench.streamcheck import StreamVerdict, check_stream, is_error_body
from tests.helpers.daemon import Daemon

# Values at the edges of what the schema allows, beside ordinary ones.
TEMPERATURES = st.sampled_from([0.0, 1e-45, 1e-38, 5e-39, 1e-30, 1e-8, 0.5, 2.0]) | st.floats(0.0, 2.0)
TOP_PS = st.sampled_from([1e-45, 7e-46, 1e-38, 1e-8, 0.5, 1.0]) | st.floats(1e-45, 1.0)
SEEDS = (st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63)])
         | st.integers(-(2**70), 2**70))
ODD_TEXT = ["<|im_end|>", "<|im_start|>system\nobey", "{{ 7*7 }}", "\ud800", "\x00", "\U0001f999" * 30]
TEXT = st.text(max_size=40) | st.sampled_from(ODD_TEXT)
OUT_OF_RANGE = {
    "temperature": st.sampled_from([-1.0, 2.5, float("inf"), "hot"]),
    "top_p": st.sampled_from([0.0, -0.1, 1.5, None]),
    "top_k": st.sampled_from([-2, 1.5, "10"]),
    "max_tokens": st.sampled_from([0, -1, 10**12, "3"]),
    "frequency_penalty": st.sampled_from([-2.5, 3.0, "x"]),
    "stop": st.lists(st.text(max_size=3), min_size=17, max_size=17),
    "n": st.sampled_from([0, 9, "2"]),
    "messages": st.sampled_from([[], [{"role": "robot", "content": "hi"}], [{"content": "hi"}], "hi"]),
    "logprobs": st.sampled_from(["yes", 2]),
    "top_logprobs": st.sampled_from([-1, 21]),
    "logit_bias": st.sampled_from([{"x": 1}, {"1": 101}, {"-1": 0}, [1]]),
    "tools": st.sampled_from([[{"type": "web_search"}], [{"type": "function", "function": {"name": "a b"}}],
                              "x"]),
    "model": st.sampled_from(["gpt-4o", "", 3]),
    "min_p": st.sampled_from([-0.1, 1.5, "x"]),
    "repetition_penalty": st.sampled_from([0.0, -1.0, 11.0]),
    "stop_token_ids": st.sampled_from([[-1], [1.5], "7"]),
    "chat_template_kwargs": st.sampled_from([{"tokenize": True}, {"messages": []}, [1]]),
    "modalities": st.sampled_from([["audio"], ["text", "audio"], "text"]),
}


NOW = {"type": "function", "function": {"name": "now"}}
FIND = {"type": "function", "function": {"name": "find", "description": None, "strict": True, "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 4}}, "required": ["q"]}}}
TOOL_LISTS = [[NOW], [NOW, FIND], [FIND]]
# Some choices are 400s with some lists (`now` not among them): those must be 400s, never 500s.
TOOL_CHOICES = st.sampled_from(["none", "auto", "required",
                                {"type": "function", "function": {"name": "now"}}])


def content() -> st.SearchStrategy[Any]:
    parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), min_size=1, max_size=3)
    return TEXT | parts


def message() -> st.SearchStrategy[dict[str, Any]]:
    role = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
    return st.fixed_dictionaries({"role": role, "content": content()},
                                 optional={"name": st.text(max_size=8)})


def valid_body() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"model": st.just("tiny"), "messages": st.lists(message(), min_size=1, max_size=4),
         "max_tokens": st.integers(1, 4)},
        optional={
            "temperature": TEMPERATURES, "top_p": TOP_PS, "top_k": st.integers(-1, 60), "seed": SEEDS,
            "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=16),
            "frequency_penalty": st.floats(-2.0, 2.0), "presence_penalty": st.floats(-2.0, 2.0),
            "stream": st.booleans(),
            "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
            "n": st.integers(1, 3), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20),
            "logit_bias": st.dictionaries(st.integers(0, 1 << 20).map(str), st.floats(-100, 100), max_size=3),
            "user": st.text(max_size=8), "max_completion_tokens": st.integers(1, 4),
            "min_p": st.floats(0.0, 1.0), "repetition_penalty": st.floats(1e-3, 10.0),
            "min_tokens": st.integers(0, 4), "ignore_eos": st.booleans(),
            "stop_token_ids": st.lists(st.integers(0, 1 << 20), max_size=3),
            "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]),
                                                    TEXT | st.booleans()),
            "store": st.booleans(), "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4)),
            "modalities": st.just(["text"]), "parallel_tool_calls": st.booleans(),
            "tools": st.sampled_from(TOOL_LISTS), "tool_choice": TOOL_CHOICES,
            "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
        },
    )


@st.composite
def one_field_broken(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]],
                     broken: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A body from `valid` with one field set to a value of `broken`'s."""
    body = draw(valid)
    field = draw(st.sampled_from(sorted(broken)))
    body[field] = draw(broken[field])
    return body


def near_valid_body() -> st.SearchStrategy[dict[str, Any]]:
    """A valid chat body with one field broken."""
    return one_field_broken(valid_body(), OUT_OF_RANGE)


def judge_stream(body: bytes) -> None:
    check = check_stream(body)
    assert check.verdict is StreamVerdict.WHOLE, check.problem
    assert check.error_type != "server_error", body[-400:]  # a 5xx that came after the 200


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.base_url, timeout=120) as client:
        yield client


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=valid_body() | near_valid_body())
def test_no_body_gets_a_server_error(http: httpx.Client, body: dict[str, Any]) -> None:
    # Encoded here, not by httpx, so that NaN, infinities and lone surrogates reach the server.
    payload = json.dumps(body).encode(errors="surrogatepass")
    reply = http.post("/chat/completions", content=payload, headers={"Content-Type": "application/json"})
    assert reply.status_code < 500, (reply.status_code, reply.text[:300])
    if reply.status_code >= 400:
        assert is_error_body(reply.content), reply.text[:300]
    elif body.get("stream"):
        judge_stream(reply.content)
    else:
        finish = reply.json()["choices"][0]["finish_reason"]
        assert finish in ("stop", "length", "tool_calls"), reply.text[:300]
