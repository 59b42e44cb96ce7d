"""Chat `n`, `logprobs`/`top_logprobs` and `logit_bias` around a fake engine: shapes streamed and not,
what the SDK's stream helper assembles, what reaches the engine, the 400s."""

from __future__ import annotations

from typing import Any

import pytest

from llmd.errors import EngineFailure
from tests.helpers.api_client import MESSAGES, MODEL, openai_error, post_chat, sdk, served, sse_chunks
from tests.helpers.fake_engine import HALF_CHARACTER, INCOMPLETE, FakeEngine

THREE = (("Hello", " there"), ("Hi",), ("Hey", ",", " you"))  # choice i's pieces


def choices_of(chunks: list[dict]) -> list[dict]:
    """Every chunk's one choice (the usage chunk has none)."""
    return [choice for chunk in chunks for choice in chunk["choices"]]


def test_n_choices_come_back_indexed_with_the_prompt_counted_once() -> None:
    engine = FakeEngine(choice_pieces=THREE)
    with served(engine) as client:
        body = post_chat(client, n=3, seed=5, max_tokens=10).json()
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [
        (0, "Hello there"), (1, "Hi"), (2, "Hey, you")]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 6, "total_tokens": 13}
    assert engine.choice_counts == [3] and [p.seed for _, p in engine.submitted] == [5, 6, 7]
    assert all(stream.closed for stream in engine.streams)


def test_streamed_choices_open_in_index_order_and_each_finishes() -> None:
    engine = FakeEngine(choice_pieces=THREE)
    with served(engine) as client:
        chunks = sse_chunks(post_chat(client, n=3, stream=True, max_tokens=10,
                                      stream_options={"include_usage": True}))
    choices = choices_of(chunks)
    assert [(c["index"], c["delta"]) for c in choices[:3]] == [
        (i, {"role": "assistant", "content": ""}) for i in range(3)]
    texts = {i: "".join(c["delta"].get("content", "") for c in choices if c["index"] == i) for i in range(3)}
    assert texts == {0: "Hello there", 1: "Hi", 2: "Hey, you"}
    finishes = [c["index"] for c in choices if c["finish_reason"] is not None]
    assert sorted(finishes) == [0, 1, 2] and all(c["finish_reason"] == "stop" for c in choices
                                                  if c["finish_reason"] is not None)
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 6, "total_tokens": 13}


def test_the_sdk_stream_helper_assembles_n_choices() -> None:
    with served(FakeEngine(choice_pieces=THREE)) as client, sdk(client).chat.completions.stream(
            model=MODEL, messages=MESSAGES, n=3, max_tokens=10) as stream:  # type: ignore[arg-type]
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert [(c.index, c.message.content, c.finish_reason) for c in final.choices] == [
        (0, "Hello there", "stop"), (1, "Hi", "stop"), (2, "Hey, you", "stop")]
    assert "".join(deltas) == "HelloHiHey there, you"  # interleaved as they came


@pytest.mark.parametrize("n", [0, 9])
def test_n_outside_1_to_8_is_a_400_naming_it(n: int) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        error = openai_error(post_chat(client, n=n), 400)
    assert error["param"] == "n" and not engine.submitted


def test_more_choices_than_the_engine_runs_at_once_is_a_400_naming_n() -> None:
    with served(FakeEngine(max_running=2)) as client:
        error = openai_error(post_chat(client, n=3), 400)
    assert error["param"] == "n" and "3" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_choice_ends_them_all(stream: bool) -> None:
    engine = FakeEngine(failure=EngineFailure("the device fell over"), fail_after=1)
    with served(engine) as client:
        response = post_chat(client, n=2, stream=stream)
    if stream:
        assert sse_chunks(response)[-1]["error"]["code"] == "engine_error"
    else:
        openai_error(response, 500, "engine_error")
    assert len(engine.streams) == 2 and all(s.closed for s in engine.streams)


def entry(token: str, logprob: float, top: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A `ChatCompletionTokenLogprob` as the wire carries it."""
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": top or []}


def test_logprobs_have_openais_exact_shape() -> None:
    engine = FakeEngine(pieces=("Hello", " world"))
    with served(engine) as client:
        body = post_chat(client, logprobs=True, top_logprobs=2).json()
    alt = {"token": "alt1", "bytes": list(b"alt1")}
    assert body["choices"][0]["logprobs"] == {"content": [
        entry("Hello", -0.25, [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello")},
                               alt | {"logprob": -1.25}]),
        entry(" world", -0.5, [{"token": " world", "logprob": -0.5, "bytes": list(b" world")},
                               alt | {"logprob": -1.5}]),
    ], "refusal": None}
    assert list(body["choices"][0]["logprobs"]["content"][0]) == ["token", "logprob", "bytes", "top_logprobs"]
    assert engine.submitted[0][1].logprobs == 2


def test_the_sdk_parses_logprobs_and_their_bytes_spell_the_token() -> None:
    with served() as client:
        reply = sdk(client).chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True,  # type: ignore[arg-type]
                                                    top_logprobs=0)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and logprobs.refusal is None
    assert "".join(e.token for e in logprobs.content) == reply.choices[0].message.content
    assert all(bytes(e.bytes or []).decode() == e.token and e.top_logprobs == [] for e in logprobs.content)


@pytest.mark.parametrize("fields", [{}, {"logprobs": False}, {"logprobs": None}, {"top_logprobs": 0}])
def test_without_logprobs_true_there_are_none_and_none_are_asked(fields: dict) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        body = post_chat(client, **fields).json()
        chunks = sse_chunks(post_chat(client, stream=True, **fields))
    assert body["choices"][0]["logprobs"] is None and all(c["logprobs"] is None for c in choices_of(chunks))
    assert all(params.logprobs is None for _, params in engine.submitted)


@pytest.mark.parametrize("fields", [{"top_logprobs": 2}, {"top_logprobs": 2, "logprobs": False}])
def test_top_logprobs_without_logprobs_is_a_400(fields: dict) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        error = openai_error(post_chat(client, **fields), 400)
    assert error["param"] == "top_logprobs" and "logprobs" in error["message"] and not engine.submitted


def test_top_logprobs_past_20_is_a_400() -> None:
    with served() as client:
        assert openai_error(post_chat(client, logprobs=True, top_logprobs=21), 400)["param"] == "top_logprobs"


def test_each_chunk_carries_its_own_tokens_logprobs() -> None:
    # An empty piece is half a character: its token waits for the next chunk's text.
    engine = FakeEngine(pieces=("a", "", "b", ""))
    with served(engine) as client:
        chunks = sse_chunks(post_chat(client, stream=True, logprobs=True, max_tokens=10))
    content = [(c["delta"].get("content"), [e["token"] for e in (c["logprobs"] or {}).get("content", [])])
               for c in choices_of(chunks)]
    assert content == [("", []), ("a", ["a"]), ("b", [INCOMPLETE, "b"]), (None, [INCOMPLETE])]
    half = choices_of(chunks)[2]["logprobs"]["content"][0]
    assert half["bytes"] == list(HALF_CHARACTER) and choices_of(chunks)[2]["logprobs"]["refusal"] is None


def test_the_sdk_stream_helper_gathers_every_tokens_logprobs_per_choice() -> None:
    engine = FakeEngine(choice_pieces=(("a", "", "b"), ("c",)))
    with served(engine) as client, sdk(client).chat.completions.stream(
            model=MODEL, messages=MESSAGES, n=2, logprobs=True, top_logprobs=1) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    tokens = [[e.token for e in (c.logprobs.content or [])] if c.logprobs else None for c in final.choices]
    assert tokens == [["a", INCOMPLETE, "b"], ["c"]]


def test_logit_bias_reaches_the_engine_as_token_id_pairs() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        assert post_chat(client, logit_bias={"50256": -100, "11": 5}).status_code == 200
    assert engine.submitted[0][1].logit_bias == ((50256, -100.0), (11, 5.0))


@pytest.mark.parametrize("bias", [{"comma": 5}, {"11": 101}, {"11": -100.5}])
def test_a_bad_logit_bias_is_a_400_naming_it(bias: dict) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        error = openai_error(post_chat(client, logit_bias=bias), 400)
    assert error["param"] == "logit_bias" and not engine.submitted
