"""The routes' success shapes and the drain as the app shows it, around a fake engine."""

from __future__ import annotations

import pytest

from llmd.api.app import create_app
from llmd.config import Settings
from llmd.engine.types import SamplingParams
from llmd.errors import ShuttingDown
from llmd.service.metrics import Metrics
from tests.helpers.api_client import MESSAGES, MODEL, openai_error, post_chat, sdk, served, sse_chunks
from tests.helpers.fake_engine import FakeEngine

# --- health, readiness, stats, models -----------------------------------------------------------


def test_health_ready_stats_and_models() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        assert client.get("/health").json() == {"status": "ok"}
        ready = client.get("/ready")
        stats = client.get("/stats").json()
        models = sdk(client).models.list()
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert stats == {"steps": 3, "running": 0, "waiting": 0, "finished": 1, "aborted": 0,
                     "generated_tokens": 12, "prefix_hits": 0, "prefix_tokens_reused": 0, "preemptions": 0,
                     "kv_cache_usage": None, "prefill_chunk_tokens": None, "step_seconds": None,
                     "forward_seconds": None}
    assert [(m.id, m.owned_by, m.object) for m in models.data] == [(MODEL, "llmd", "model")]


@pytest.mark.parametrize("path", ["/health", "/ready", "/v1/models", "/stats", "/metrics"])
def test_head_answers_a_get_route_with_its_headers(path: str) -> None:
    with served() as client:
        head, got = client.head(path), client.get(path)
    assert head.status_code == got.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if path in ("/health", "/v1/models"):  # the same body both times
        assert head.headers["content-length"] == str(len(got.content))


def test_every_get_route_also_answers_head() -> None:
    engine = FakeEngine()
    app = create_app(engine, Metrics(engine_stats=engine.stats), Settings(), MODEL,
                     context_length=engine.max_context)
    for route in app.routes:
        methods: set[str] = getattr(route, "methods", set())
        assert "GET" not in methods or "HEAD" in methods, route.path


def test_metrics_are_prometheus_text_or_openmetrics_on_request() -> None:
    with served() as client:
        text = client.get("/metrics")
        open_metrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert text.headers["content-type"].startswith("text/plain") and "llmd_requests_total" in text.text
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")


# --- chat completions ---------------------------------------------------------------------------


def test_a_completion_has_the_openai_shape_and_usage() -> None:
    with served() as client:
        body = post_chat(client, max_tokens=10).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL and isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello, world!",
                                                        "refusal": None},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


def test_max_tokens_ends_with_length() -> None:
    with served() as client:
        reply = sdk(client).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == "Hello,"


def test_a_stream_has_the_openai_shape_and_usage_last() -> None:
    with served() as client:
        response = post_chat(client, stream=True, max_tokens=3, stream_options={"include_usage": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache" and response.headers["x-accel-buffering"] == "no"
    chunks = sse_chunks(response)
    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in middle] == [{"content": "Hello"}, {"content": ","},
                                                           {"content": " world"}]
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                                         "total_tokens": 10}
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks[:-1])
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1


def test_the_sdk_assembles_a_stream() -> None:
    with served() as client:
        chunks = list(sdk(client).chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True))  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello, world!"  # type: ignore[attr-defined]
    assert chunks[-1].choices[0].finish_reason == "stop"  # type: ignore[attr-defined]


def test_the_request_reaches_the_engine_as_messages_and_sampling_params() -> None:
    engine = FakeEngine()
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "system", "content": "be brief", "name": "boss"}, {"role": "user", "content": parts}]
    with served(engine) as client:
        post_chat(client, messages=messages, temperature=0.5, top_k=20, stop="END", seed=3, max_tokens=9)
        post_chat(client, max_tokens=5, max_completion_tokens=8)
        post_chat(client, max_tokens=None)
    assert engine.encoded[0] == [{"role": "system", "content": "be brief", "name": "boss"},
                                 {"role": "user", "content": "ab"}]
    assert engine.submitted[0] == (list(range(7)), SamplingParams(
        max_tokens=9, temperature=0.5, top_k=20, stop=("END",), seed=3))
    assert engine.submitted[1][1].max_tokens == 8  # max_completion_tokens wins
    assert engine.submitted[2][1].max_tokens == 4096 - 7  # no limit: the rest of the context
    assert all(stream.closed for stream in engine.streams)


# --- the drain, as the app shows it -------------------------------------------------------------


def test_a_draining_engine_is_not_ready_and_refuses_new_requests() -> None:
    with served(FakeEngine(draining=True)) as client:
        ready = client.get("/ready")
        refused = post_chat(client, stream=True)
    assert ready.status_code == 503 and ready.json() == {"status": "draining"}
    assert ready.headers["retry-after"] == "5"
    error = openai_error(refused, 503, "shutting_down")
    assert "shutting down" in error["message"] and int(refused.headers["retry-after"]) >= 1


def test_a_cut_stream_ends_with_the_shutting_down_event_then_done() -> None:
    cut = ShuttingDown("the server is shutting down; its drain timeout (0 s) ran out")
    with served(FakeEngine(failure=cut, fail_after=1)) as client:
        response = post_chat(client, stream=True, max_tokens=10)
    chunks = sse_chunks(response)
    error = chunks[-1]["error"]
    assert error["code"] == "shutting_down" and "drain timeout" in error["message"]
    assert not any("error" in chunk for chunk in chunks[:-1])


def test_a_cut_request_without_streaming_is_503_shutting_down() -> None:
    cut = ShuttingDown("the server is stopping now (a second stop signal)")
    with served(FakeEngine(failure=cut, fail_after=1)) as client:
        response = post_chat(client, max_tokens=10)
    error = openai_error(response, 503, "shutting_down")
    assert "second stop signal" in error["message"] and int(response.headers["retry-after"]) >= 1
