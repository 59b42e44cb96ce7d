"""`POST /infill` around a fake engine: llama.cpp's shapes streamed and not, the editors' exact
requests (llama.vim's and llama.vscode's), the limits, and the refusals."""

from __future__ import annotations

import json

import httpx
import pytest
from litestar.testing import TestClient

from llmd.api import infill
from llmd.errors import EngineFailure
from tests.helpers.api_client import openai_error, served, sse_payloads
from tests.helpers.fake_engine import FIM_END_IDS, FakeEngine

TEXT = "Hello, world!"
TIMINGS = {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
           "predicted_per_token_ms", "predicted_per_second"}
CHUNKS = [{"text": "def sub(a, b):\n    return a - b\n", "time": [1733000000, 250], "filename": "util.py"}]
# llama.vim's FIM request, field for field (autoload/llama.vim, llama#fim).
LLAMA_VIM = {
    "input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n", "input_extra": CHUNKS,
    "prompt": "    ", "n_predict": 256, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False,
    "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1500,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                        "tokens_cached"],
}
# llama.vim's background request that only loads the ring buffer's chunks (s:ring_update).
LLAMA_VIM_RING = {"input_prefix": "", "input_suffix": "", "input_extra": CHUNKS, "prompt": "", "n_predict": 0,
                  "temperature": 0.0, "stream": False, "samplers": [], "cache_prompt": True,
                  "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}
# llama.vscode's FIM request (src/llama-server.ts, createRequestPayload; chunks from extra-context.ts).
VSCODE_CHUNKS = [{"text": "class Point:\n", "time": 1733000000250, "filename": "/src/point.py"}]
LLAMA_VSCODE = {"input_prefix": "def add(a, b):\n", "input_suffix": "\n", "input_extra": VSCODE_CHUNKS,
                "prompt": "    ", "n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False,
                "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
                "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}


def post(client: TestClient, **fields: object) -> httpx.Response:
    return client.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")\n"} | fields)


def test_the_result_has_llama_cpps_shape() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        response = post(client)
    assert response.status_code == 200, response.text
    result = response.json()
    assert set(result) == {"content", "model", "tokens_predicted", "tokens_evaluated", "truncated",
                           "tokens_cached", "timings", "index", "stop"}
    assert (result["content"], result["stop"], result["model"]) == (TEXT, True, "tiny")
    assert result["truncated"] is False
    assert (result["tokens_predicted"], result["tokens_evaluated"], result["tokens_cached"]) == (4, 7, 11)
    assert set(result["timings"]) == TIMINGS
    assert (result["timings"]["prompt_n"], result["timings"]["predicted_n"]) == (7, 4)
    assert engine.streams[0].closed


def test_llama_vims_request_is_served_with_its_picked_fields() -> None:
    engine = FakeEngine(pieces=("return", " a + b", "\n"))
    with served(engine) as client:
        response = client.post("/infill", json=LLAMA_VIM)
    assert response.status_code == 200, response.text
    result = response.json()
    assert set(result) == set(LLAMA_VIM["response_fields"])  # type: ignore[arg-type]
    assert result["content"] == "return a + b\n" and result["tokens_cached"] == 10
    assert result["timings/prompt_n"] == 7 and result["timings/predicted_n"] == 3
    assert result["truncated"] is False
    [infill] = engine.infills
    assert infill.prefix == "def add(a, b):\n    " and infill.suffix == LLAMA_VIM["input_suffix"]
    assert [(f.filename, f.text) for f in infill.extra] == [("util.py", CHUNKS[0]["text"])]
    [(_, params)] = engine.submitted
    assert (params.top_k, params.top_p, params.temperature, params.min_p) == (40, 0.99, 1.0, 0.0)
    assert params.max_tokens == 256 and params.stop_token_ids == FIM_END_IDS


def test_llama_vims_ring_update_evaluates_the_chunks_and_answers_nothing() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        response = client.post("/infill", json=LLAMA_VIM_RING)
    assert response.status_code == 200 and response.json() == {}
    [(_, params)] = engine.submitted
    assert params.max_tokens == 1  # the prompt is evaluated (the prefix cache warms), the token dropped
    assert engine.infills[0].reserve_tokens == 1


def test_llama_vscodes_request_gets_the_nested_result_it_reads() -> None:
    with served(FakeEngine(pieces=("return a + b",))) as client:
        response = client.post("/infill", json=LLAMA_VSCODE)
    assert response.status_code == 200, response.text
    result = response.json()  # LlamaResponse: content, tokens_cached, truncated, timings.*
    assert result["content"] == "return a + b" and result["tokens_cached"] == 8
    assert result["truncated"] is False
    assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
            "predicted_per_second"} <= set(result["timings"])


def test_a_stream_is_llama_cpps_events_without_done() -> None:
    with served() as client:
        response = post(client, stream=True)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response)
    assert "[DONE]" not in payloads
    *pieces, last = [json.loads(p) for p in payloads]
    assert all(p["stop"] is False and set(p) == {"content", "tokens_predicted", "tokens_evaluated", "index",
                                                  "stop"} for p in pieces)
    assert "".join(p["content"] for p in pieces) == TEXT and pieces[-1]["tokens_predicted"] == 4
    assert last["stop"] is True and last["content"] == "" and set(last["timings"]) == TIMINGS
    assert last["tokens_predicted"] == 4


def test_a_streams_last_event_honours_response_fields() -> None:
    with served() as client:
        payloads = sse_payloads(post(client, stream=True, response_fields=["stop", "timings/predicted_n"]))
    assert json.loads(payloads[-1]) == {"stop": True, "timings/predicted_n": 4}


def test_an_unindented_line_ends_the_answer_and_aborts_the_request() -> None:
    engine = FakeEngine(pieces=("x = 1\n", "    y = 2\n", "print(y)\n", "more"))
    with served(engine) as client:
        result = post(client, n_indent=4).json()
    assert result["content"] == "x = 1\n    y = 2\n" and result["tokens_predicted"] == 3
    assert engine.streams[0].closed and not engine.streams[0].finished  # left early: aborted


def test_the_time_limit_ends_the_answer_at_a_newline_once_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(100))  # a clock a second further on each reading: submit, then each event
    monkeypatch.setattr(infill, "CLOCK", lambda: float(next(ticks)))
    engine = FakeEngine(pieces=("a\n", "b\n", "c", "d\n", "e\n"))
    with served(engine) as client:
        result = post(client, t_max_predict_ms=1500).json()
    assert result["content"] == "a\nb\ncd\n"  # 3 s after the first token, at the next newline
    assert result["timings"]["prompt_ms"] == 1000.0 and result["timings"]["predicted_ms"] == 3000.0
    assert engine.streams[0].closed and not engine.streams[0].finished


def test_stop_strings_and_n_predict_reach_the_engine() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        post(client, stop=["\n\n", "def "], n_predict=2, seed=5)
    [(_, params)] = engine.submitted
    assert params.stop == ("\n\n", "def ") and params.max_tokens == 2 and params.seed == 5


def test_n_predict_minus_one_gets_the_room_left() -> None:
    engine = FakeEngine(max_context=100)
    with served(engine) as client:
        post(client, n_predict=-1)
    assert engine.submitted[0][1].max_tokens == 93


def test_unknown_fields_are_refused_together() -> None:
    with served() as client:
        response = post(client, lora=[{"id": 0, "scale": 0.5}], n_probs=5,
                        input_extra=[{"text": "x", "lang": "c"}])
    error = openai_error(response, 400, "unsupported_parameter")
    assert error["param"] == "lora" and "`n_probs`" in error["message"]
    assert "`input_extra[0].lang`" in error["message"]


def test_an_unknown_sampler_is_refused() -> None:
    with served() as client:
        error = openai_error(post(client, samplers=["top_k", "mirostat"]), 400, "unsupported_parameter")
    assert error["param"] == "samplers[1]"


def test_a_model_without_fim_tokens_is_a_400_saying_so() -> None:
    with served(FakeEngine(fim=False)) as client:
        error = openai_error(post(client), 400, "unsupported_parameter")
    assert error["param"] == "input_suffix" and "FIM" in error["message"]


def test_a_prompt_that_fills_the_context_names_the_prefix() -> None:
    with served(FakeEngine(max_context=7)) as client:
        error = openai_error(post(client), 400, "context_length_exceeded")
    assert error["param"] == "input_prefix" and "messages" not in error["message"]


def test_a_failure_midway_is_one_error_event_and_no_done() -> None:
    engine = FakeEngine(failure=EngineFailure("the step failed"), fail_after=1)
    with served(engine) as client:
        payloads = sse_payloads(post(client, stream=True))
    assert json.loads(payloads[0])["content"] == "Hello"
    assert json.loads(payloads[-1])["error"]["message"] == "the step failed" and "[DONE]" not in payloads
