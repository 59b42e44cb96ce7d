"""`POST /v1/completions` around a fake engine: shapes streamed and not, prompt lists, echo, FIM, errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from llmd.engine.types import SamplingParams
from llmd.errors import EngineFailure, Overloaded
from tests.helpers.api_client import MODEL, openai_error, sdk, served, sse_chunks
from tests.helpers.fake_engine import FIM_END_IDS, FakeEngine, FakeStream

TEXT = "Hello, world!"


def post(client: TestClient, **fields: object) -> httpx.Response:
    return client.post("/v1/completions", json={"model": MODEL, "prompt": "def f(", **fields})


def choice_texts(chunks: list[dict]) -> dict[int, str]:
    """Each index's text, assembled from streamed chunks."""
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts


def test_a_completion_has_the_openai_shape() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        result = sdk(client).completions.create(model=MODEL, prompt="def f(")
    assert result.id.startswith("cmpl-") and result.object == "text_completion" and result.model == MODEL
    [choice] = result.choices
    assert (choice.index, choice.text, choice.finish_reason, choice.logprobs) == (0, TEXT, "stop", None)
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (7, 4)
    assert engine.completion_prompts == [("def f(", None)]
    assert engine.submitted[0][1].max_tokens == 16  # OpenAI's default for this API
    assert engine.streams[0].closed


def test_max_tokens_cuts_with_length() -> None:
    with served() as client:
        result = sdk(client).completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert result.choices[0].text == "Hello," and result.choices[0].finish_reason == "length"


def test_a_stream_is_text_completion_chunks_then_usage_then_done() -> None:
    with served() as client:
        response = post(client, stream=True, stream_options={"include_usage": True})
    chunks = sse_chunks(response)
    *pieces, last = chunks
    assert [c["choices"][0]["text"] for c in pieces] == ["Hello", ",", " world", "!"]
    assert [c["choices"][0]["finish_reason"] for c in pieces] == [None, None, None, "stop"]
    assert all(c["object"] == "text_completion" and c["choices"][0]["index"] == 0 for c in pieces)
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 7, "completion_tokens": 4,
                                                       "total_tokens": 11}
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    assert chunks[0]["id"].startswith("cmpl-")
    assert set(pieces[0]["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}


def test_the_sdk_streams_it() -> None:
    with served() as client:
        chunks = list(sdk(client).completions.create(model=MODEL, prompt="x", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == TEXT
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_list_of_prompts_is_one_choice_each_in_prompt_order(stream: bool) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        response = post(client, prompt=["a", "b", "c"], stream=stream, max_tokens=3)
    if stream:
        chunks = sse_chunks(response)
        assert choice_texts(chunks) == {0: "Hello, world", 1: "Hello, world", 2: "Hello, world"}
        finished = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
        assert sorted(finished) == [0, 1, 2]
    else:
        body = response.json()
        assert [(c["index"], c["text"]) for c in body["choices"]] == [(i, "Hello, world") for i in range(3)]
        assert body["usage"] == {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}
    assert [prompt for prompt, _ in engine.completion_prompts] == ["a", "b", "c"]
    assert len(engine.submitted) == 3 and all(s.closed for s in engine.streams)


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7]]])
def test_a_token_id_prompt_reaches_the_engine_as_given(prompt: list) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        result = post(client, prompt=prompt, echo=True).json()
    assert engine.submitted[0][0] == [5, 6, 7]
    assert result["choices"][0]["text"] == "<5><6><7>" + TEXT
    assert result["usage"]["prompt_tokens"] == 3


def test_echo_puts_the_prompt_first() -> None:
    with served() as client:
        plain = post(client, echo=True).json()
        streamed = sse_chunks(post(client, echo=True, stream=True, prompt=["a", "b"]))
    assert plain["choices"][0]["text"] == "def f(" + TEXT
    assert [c["choices"][0]["text"] for c in streamed[:2]] == ["a", "b"]
    assert choice_texts(streamed) == {0: "a" + TEXT, 1: "b" + TEXT}


def test_a_suffix_asks_the_engine_for_its_fim_prompt() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        result = sdk(client).completions.create(model=MODEL, prompt="def f(", suffix="\n    return x\n")
    assert engine.completion_prompts == [("def f(", "\n    return x\n")]
    assert result.choices[0].text == TEXT
    (_, params), = engine.submitted
    assert params.stop_token_ids == FIM_END_IDS  # the layout's pad and file separator end the answer


def test_a_null_suffix_is_plain_completion() -> None:
    engine = FakeEngine(fim=False)
    with served(engine) as client:
        assert post(client, suffix=None).status_code == 200
    assert engine.completion_prompts == [("def f(", None)]


def test_a_model_without_fim_tokens_refuses_a_suffix() -> None:
    with served(FakeEngine(fim=False)) as client:
        error = openai_error(post(client, suffix="x"), 400, "unsupported_parameter")
    assert error["param"] == "suffix" and "FIM" in error["message"]


@pytest.mark.parametrize(("prompt", "param"), [("x", "prompt"), (["a", "b"], "prompt[0]")])
def test_a_prompt_that_fills_the_context_is_the_chat_400(prompt: object, param: str) -> None:
    with served(FakeEngine(max_context=7)) as client:  # the fake's prompts are 7 tokens
        error = openai_error(post(client, prompt=prompt), 400, "context_length_exceeded")
    assert error["param"] == param and "maximum context length is 7 tokens" in error["message"]
    assert "in the prompt" in error["message"] and "messages" not in error["message"]


def test_max_tokens_beyond_the_context_is_cut_to_the_room_left() -> None:
    engine = FakeEngine(max_context=10)
    with served(engine) as client:
        result = sdk(client).completions.create(model=MODEL, prompt="x", max_tokens=4096)  # as Continue sends
    assert engine.submitted[0][1].max_tokens == 3 and result.choices[0].finish_reason == "length"


def test_a_suffix_with_token_ids_is_refused() -> None:
    with served() as client:
        refused = openai_error(post(client, prompt=[1, 2], suffix="x"), 400)
    assert refused["param"] == "suffix"


TWO = (("A", "a"), ("B",))  # choice i's pieces


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_per_prompt_are_indexed_prompt_major(stream: bool) -> None:
    engine = FakeEngine(choice_pieces=TWO)
    with served(engine) as client:
        response = post(client, prompt=["p", "q"], n=2, stream=stream, seed=3)
    texts = choice_texts(sse_chunks(response)) if stream else {
        c["index"]: c["text"] for c in response.json()["choices"]}
    assert texts == {0: "Aa", 1: "B", 2: "Aa", 3: "B"}  # index = prompt_index * n + choice_index
    assert engine.choice_counts == [2, 2] and [p.seed for _, p in engine.submitted] == [3, 4, 3, 4]
    if not stream:
        assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2, 3]
        assert response.json()["usage"] == {"prompt_tokens": 14, "completion_tokens": 6, "total_tokens": 20}


def test_each_of_n_streamed_choices_echoes_its_own_prompt() -> None:
    with served(FakeEngine(choice_pieces=TWO)) as client:
        chunks = sse_chunks(post(client, prompt=["p", "q"], n=2, echo=True, stream=True))
    assert [c["choices"][0]["text"] for c in chunks[:4]] == ["p", "p", "q", "q"]
    assert choice_texts(chunks) == {0: "pAa", 1: "pB", 2: "qAa", 3: "qB"}


def test_best_of_keeps_the_likeliest_and_returns_no_logprobs_unasked() -> None:
    engine = FakeEngine(choice_pieces=(("x",), ("y",), ("z",)), choice_scores=(-3.0, -1.0, -2.0))
    with served(engine) as client:
        body = post(client, prompt=["p", "q"], n=2, best_of=3).json()
    assert [(c["index"], c["text"], c["logprobs"]) for c in body["choices"]] == [
        (0, "y", None), (1, "z", None), (2, "y", None), (3, "z", None)]
    assert engine.choice_counts == [3, 3] and all(p.logprobs == 0 for _, p in engine.submitted)
    assert body["usage"]["completion_tokens"] == 6  # every generated choice was computed
    assert all(s.closed for s in engine.streams)


def test_best_of_with_logprobs_returns_those_asked() -> None:
    engine = FakeEngine(choice_scores=(-1.0, 0.0))
    with served(engine) as client:
        body = post(client, best_of=2, logprobs=1, max_tokens=1).json()
    [choice] = body["choices"]
    assert choice["logprobs"]["token_logprobs"] == [-0.25] and engine.submitted[0][1].logprobs == 1


def test_best_of_streamed_is_a_400_naming_it() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        error = openai_error(post(client, best_of=2, stream=True), 400)
    assert error["param"] == "best_of" and not engine.submitted


def test_best_of_beyond_what_the_engine_runs_at_once_names_best_of() -> None:
    with served(FakeEngine(max_running=2)) as client:
        error = openai_error(post(client, best_of=3), 400)
    assert error["param"] == "best_of" and "`best_of`" in error["message"]


LEGACY: dict[str, Any] = {"text_offset": [0, 5, 6, 12], "token_logprobs": [-0.25, -0.5, -0.75, -1.0],
          "tokens": ["Hello", ",", " world", "!"],
          "top_logprobs": [{"Hello": -0.25, "alt1": -1.25}, {",": -0.5, "alt1": -1.5},
                           {" world": -0.75, "alt1": -1.75}, {"!": -1.0, "alt1": -2.0}]}


def test_logprobs_come_in_the_legacy_shape() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        body = post(client, logprobs=2).json()
    assert body["choices"][0]["logprobs"] == LEGACY
    assert engine.submitted[0][1].logprobs == 2 and engine.submitted[0][1].prompt_logprobs is None


def test_the_sdk_parses_legacy_logprobs() -> None:
    with served() as client:
        result = sdk(client).completions.create(model=MODEL, prompt="x", logprobs=0)
    logprobs = result.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens == LEGACY["tokens"]
    assert logprobs.top_logprobs == [{t: lp} for t, lp in zip(LEGACY["tokens"], LEGACY["token_logprobs"],
                                                              strict=True)]  # logprobs 0: the sampled only


def test_echo_with_logprobs_puts_the_prompt_tokens_first() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        body = post(client, prompt=[5, 6, 7], echo=True, logprobs=1).json()
    [choice] = body["choices"]
    assert choice["text"] == "<5><6><7>" + TEXT
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["<5>", "<6>", "<7>", *LEGACY["tokens"]]
    assert logprobs["token_logprobs"][:4] == [None, -1.0, -1.0, -0.25]
    assert logprobs["top_logprobs"][:3] == [None, {"<6>": -1.0}, {"<7>": -1.0}]
    assert logprobs["text_offset"] == [0, 3, 6, *(9 + offset for offset in LEGACY["text_offset"])]
    assert all(choice["text"][o:].startswith(t) for o, t in zip(logprobs["text_offset"], logprobs["tokens"],
                                                                 strict=True))
    assert engine.submitted[0][1].prompt_logprobs == 1


def test_a_stream_carries_each_chunks_logprobs_and_the_echo_its_prompts() -> None:
    with served() as client:
        plain = post(client, prompt=[5, 6, 7], echo=True, logprobs=1).json()["choices"][0]["logprobs"]
        chunks = sse_chunks(post(client, prompt=[5, 6, 7], echo=True, logprobs=1, stream=True))
    choices = [c["choices"][0] for c in chunks]
    assert choices[0]["text"] == "<5><6><7>" and choices[0]["logprobs"]["tokens"] == ["<5>", "<6>", "<7>"]
    joined = {key: [v for c in choices for v in c["logprobs"][key]] for key in plain}
    assert joined == plain  # the chunks' lists, joined, are the whole choice's


def test_a_stream_without_logprobs_has_none() -> None:
    with served() as client:
        chunks = sse_chunks(post(client, stream=True, echo=True))
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)


def test_logit_bias_reaches_the_engine_and_a_bad_one_is_a_400() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        assert post(client, logit_bias={"7": -100}).status_code == 200
        error = openai_error(post(client, logit_bias={"7": 200}), 400)
    assert engine.submitted[0][1].logit_bias == ((7, -100.0),) and error["param"] == "logit_bias"


def test_an_unknown_model_is_404() -> None:
    with served() as client:
        error = openai_error(post(client, model="gpt-3.5-turbo-instruct"), 404, "model_not_found")
    assert error["param"] == "model"


@dataclass
class RefusesSecond(FakeEngine):
    """Admits one request, then is full."""

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> FakeStream:
        if self.streams:
            raise Overloaded("full", retry_after=3, code="queue_full")
        return super().submit(prompt_ids, params)


def test_a_refused_prompt_of_several_aborts_those_already_admitted() -> None:
    engine = RefusesSecond()
    with served(engine) as client:
        openai_error(post(client, prompt=["a", "b"]), 503, "queue_full")
    assert len(engine.streams) == 1 and engine.streams[0].closed and not engine.streams[0].finished


def test_an_engine_failure_mid_stream_is_one_error_event_then_done() -> None:
    engine = FakeEngine(failure=EngineFailure("the device fell over"), fail_after=2)
    with served(engine) as client:
        chunks = sse_chunks(post(client, stream=True))
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Hello", ","]
    assert chunks[-1]["error"]["code"] == "engine_error" and engine.streams[0].closed


@pytest.mark.parametrize("stream", [False, True])
def test_a_failure_in_one_of_several_prompts_ends_them_all(stream: bool) -> None:
    engine = FakeEngine(failure=EngineFailure("the device fell over"), fail_after=1)
    with served(engine) as client:
        response = post(client, prompt=["a", "b", "c"], stream=stream)
    if stream:
        assert sse_chunks(response)[-1]["error"]["code"] == "engine_error"
    else:
        openai_error(response, 500, "engine_error")
    assert len(engine.streams) == 3 and all(s.closed for s in engine.streams)
