"""Every error leaves the app as `{"error": {message, type, param, code}}` with its status and headers."""

from __future__ import annotations

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmd.errors import EngineFailure, Overloaded, ShuttingDown
from llmd.service.metrics import Metrics
from tests.helpers.api_client import MESSAGES, openai_error, post_chat, sdk, served, sse_chunks
from tests.helpers.fake_engine import FakeEngine

JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"min_p": 2}, "min_p"),
        ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
    ],
)
def test_bad_fields_are_400_naming_the_param(fields: dict, param: str) -> None:
    with served() as client:
        error = openai_error(post_chat(client, **fields), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("field", "value"), [
    ("functions", [{"name": "f"}]), ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy"}),
])
def test_unimplemented_fields_are_400_unsupported_parameter(field: str, value: object) -> None:
    with served() as client:
        error = openai_error(post_chat(client, **{field: value}), 400, "unsupported_parameter")
    assert error["param"] == field and field in error["message"] and error["type"] == "invalid_request_error"


def test_a_missing_model_field_is_400_naming_it() -> None:
    with served() as client:
        response = client.post("/v1/chat/completions", json={"messages": MESSAGES})
        error = openai_error(response, 400)
    assert error["param"] == "model" and "required" in error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"}"])
def test_malformed_json_and_wrong_top_level_are_400(raw: bytes) -> None:
    with served() as client:
        response = client.post("/v1/chat/completions", content=raw, headers=JSON)
        assert openai_error(response, 400)["type"] == "invalid_request_error"


def test_a_null_text_part_is_a_400_naming_the_text() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": None}]}]
    with served() as client:
        error = openai_error(post_chat(client, messages=messages), 400)
    assert error["param"] == "messages[0].content[0].text" and "must be a string" in error["message"]


def test_an_image_part_is_unsupported() -> None:
    messages = [{"role": "user", "content": [{"type": "image_url"}]}]
    with served() as client:
        error = openai_error(post_chat(client, messages=messages), 400, "unsupported_parameter")
    assert error["param"] == "messages[0].content[0].type"


def test_an_unknown_model_is_404_model_not_found() -> None:
    with served() as client:
        error = openai_error(post_chat(client, model="gpt-4o"), 404, "model_not_found")
    assert error["param"] == "model" and "gpt-4o" in error["message"] and "tiny" in error["message"]


def test_context_length_exceeded_names_both_numbers() -> None:
    with served(FakeEngine(max_context=4096)) as client:
        error = openai_error(post_chat(client, max_tokens=100_000), 400, "context_length_exceeded")
    assert "4096" in error["message"] and "100007" in error["message"] and "100000" in error["message"]
    assert error["param"] == "messages"


def test_an_oversized_body_is_413() -> None:
    huge = "x" * (9 * 1024 * 1024)  # past the default max_body_bytes (8 MiB)
    with served() as client:
        response = post_chat(client, messages=[{"role": "user", "content": huge}])
    openai_error(response, 413, "payload_too_large")


def test_unknown_route_is_404_and_wrong_method_405() -> None:
    with served() as client:
        openai_error(client.get("/v1/nothing-here"), 404, "not_found")
        error = openai_error(client.get("/v1/chat/completions"), 405, "method_not_allowed")
    assert "GET" in error["message"]


def test_queue_full_is_503_with_retry_after() -> None:
    refusal = Overloaded("the server is at capacity; retry later", retry_after=7, code="queue_full")
    with served(FakeEngine(refusal=refusal)) as client:
        for stream in (False, True):
            response = post_chat(client, stream=stream)
            error = openai_error(response, 503, "queue_full")
            assert response.headers["retry-after"] == "7" and error["type"] == "server_error"


def test_a_loading_model_is_503_not_ready_and_ready_says_loading() -> None:
    engine = FakeEngine()
    engine.ready.clear()
    with served(engine) as client:
        response = post_chat(client)
        openai_error(response, 503, "not_ready")
        assert response.headers["retry-after"] == "5"
        loading = client.get("/ready")
    assert loading.status_code == 503 and loading.json() == {"status": "loading"}
    assert loading.headers["retry-after"] == "5"


def test_an_engine_failure_mid_stream_is_one_error_event_then_done() -> None:
    engine = FakeEngine(failure=EngineFailure("the device fell over"), fail_after=2)
    with served(engine) as client:
        response = post_chat(client, stream=True, max_tokens=10)
    assert response.status_code == 200
    chunks = sse_chunks(response)
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:-1]] == ["", "Hello", ","]
    assert chunks[-1] == {"error": {"message": "the device fell over", "type": "server_error",
                                    "param": None, "code": "engine_error"}}
    assert engine.streams[0].closed


def test_an_engine_failure_without_streaming_is_500() -> None:
    with served(FakeEngine(failure=EngineFailure("the device fell over"), fail_after=1)) as client:
        error = openai_error(post_chat(client), 500, "engine_error")
    assert error["message"] == "the device fell over"


def test_an_unexpected_exception_is_500_without_internals(caplog: pytest.LogCaptureFixture) -> None:
    with served(FakeEngine(refusal=KeyError("secret"))) as client:  # type: ignore[arg-type]
        error = openai_error(post_chat(client), 500)
    assert error["type"] == "server_error" and "secret" not in error["message"]
    assert "unhandled error on POST /v1/chat/completions" in caplog.text


def test_shutting_down_is_503_with_retry_after() -> None:
    with served(FakeEngine(refusal=ShuttingDown("the server is shutting down"))) as client:
        response = post_chat(client)
        openai_error(response, 503, "shutting_down")
    assert int(response.headers["retry-after"]) >= 1


def test_the_app_still_serves_after_errors() -> None:
    with served() as client:
        post_chat(client, temperature=9)
        client.post("/v1/chat/completions", content=b"}", headers=JSON)
        assert post_chat(client, max_tokens=3, temperature=0).status_code == 200


def test_errors_arrive_as_sdk_exceptions() -> None:
    with served() as client:
        openai_sdk = sdk(client)
        with pytest.raises(openai.BadRequestError) as bad:
            openai_sdk.chat.completions.create(model="tiny", messages=MESSAGES, temperature=3)  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError) as missing:
            openai_sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    assert missing.value.code == "model_not_found"


def test_error_responses_and_in_stream_errors_are_counted_by_code() -> None:
    engine = FakeEngine(failure=ShuttingDown("cut"), fail_after=1)
    metrics = Metrics(engine_stats=engine.stats)
    with served(engine, metrics=metrics) as client:
        post_chat(client, max_tokens=0)
        post_chat(client, model="gpt-4o")
        assert post_chat(client, stream=True).status_code == 200
        text = client.get("/metrics").text
    errors = {s.labels["type"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "llmd_errors_total"}
    assert errors == {"invalid_request_error": 1, "model_not_found": 1, "shutting_down": 1}

