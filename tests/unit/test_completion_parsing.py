"""`/v1/completions` bodies: the prompt forms, the options not served yet, the sampling defaults."""

from __future__ import annotations

import json

import pytest

from llmd.api.completions import MAX_PROMPTS, parse_completion_body, prompt_list, to_text_sampling_params
from llmd.errors import InvalidRequest, UnsupportedParameter
from llmd.protocol import MAX_STOP_STRINGS

BASE = {"model": "m", "prompt": "def f("}


def body(**fields: object) -> bytes:
    return json.dumps(BASE | fields).encode()


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("one", ["one"]),
        (["one", "two"], ["one", "two"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        ("<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", ["<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"]),
    ],
)
def test_each_prompt_form_becomes_one_prompt_per_choice(prompt: object, prompts: list) -> None:
    assert prompt_list(parse_completion_body(body(prompt=prompt)).prompt) == prompts


@pytest.mark.parametrize("prompt", [["a", 1], ["a", [1]], [[1], 2], [1, [2]]])
def test_a_mixed_prompt_list_is_refused(prompt: list) -> None:
    with pytest.raises(InvalidRequest, match="not a mix") as err:
        prompt_list(parse_completion_body(body(prompt=prompt)).prompt)
    assert err.value.param == "prompt"


def test_too_many_prompts_are_refused() -> None:
    with pytest.raises(InvalidRequest, match=f"at most {MAX_PROMPTS}") as err:
        prompt_list(["x"] * (MAX_PROMPTS + 1))
    assert err.value.param == "prompt"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [-1]}, "prompt[0]"),
        ({"prompt": None}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"echo": True, "suffix": "x"}, "echo"),
        ({"logprobs": 6}, "logprobs"),
        ({"best_of": 0}, "best_of"),
        ({"n": 9}, "n"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"best_of": 3, "stream": True}, "best_of"),
        ({"n": 2, "best_of": 3, "stream": True}, "best_of"),
    ],
)
def test_bad_values_name_the_param(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_completion_body(body(**fields))
    assert err.value.param == param and err.value.status == 400


def test_an_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedParameter) as err:
        parse_completion_body(body(frobnicate=1))
    assert err.value.param == "frobnicate" and err.value.code == "unsupported_parameter"


@pytest.mark.parametrize("fields", [{"n": 2, "stream": True}, {"n": 2, "best_of": 2, "stream": True},
                                    {"n": 2, "best_of": 5}, {"logprobs": 5, "echo": True, "stream": True}])
def test_choices_and_logprobs_are_served(fields: dict) -> None:
    parse_completion_body(body(**fields))


def test_the_served_values_of_those_options_are_accepted() -> None:
    parsed = parse_completion_body(body(n=1, best_of=1, logprobs=0, logit_bias={}, suffix=None, user="u",
                                        echo=False, stream=True, stream_options={"include_usage": True}))
    assert parsed.n == 1 and parsed.suffix is None


def test_sampling_params_follow_the_body() -> None:
    stops = [f"\n{k}" for k in range(20)]  # Continue sends a dozen and more
    parsed = parse_completion_body(body(temperature=0.2, top_p=0.9, top_k=40, seed=7, stop=stops,
                                        presence_penalty=0.5, frequency_penalty=-0.5))
    params = to_text_sampling_params(parsed, 16)
    assert (params.max_tokens, params.temperature, params.top_p) == (16, 0.2, 0.9)
    assert (params.top_k, params.seed) == (40, 7)
    assert params.stop == tuple(stops) and (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert to_text_sampling_params(parse_completion_body(body(stop="\n")), 4).stop == ("\n",)
    default = to_text_sampling_params(parse_completion_body(body()), 16)
    assert (default.temperature, default.top_p, default.top_k, default.stop) == (1.0, 1.0, 0, ())


@pytest.mark.parametrize(
    ("fields", "logprobs", "prompt_logprobs"),
    [
        ({}, None, None),
        ({"logprobs": 0}, 0, None),
        ({"logprobs": 3, "echo": True}, 3, 3),
        ({"echo": True}, None, None),
        ({"n": 2, "best_of": 4}, 0, None),  # ranking needs the sampled tokens' logprobs
        ({"n": 2, "best_of": 4, "logprobs": 2}, 2, None),
        ({"n": 2, "best_of": 2}, None, None),  # nothing is dropped, so nothing is ranked
    ],
)
def test_logprobs_are_asked_when_returned_or_ranked(fields: dict, logprobs: int | None,
                                                    prompt_logprobs: int | None) -> None:
    params = to_text_sampling_params(parse_completion_body(body(**fields)), 16)
    assert (params.logprobs, params.prompt_logprobs) == (logprobs, prompt_logprobs)


def test_logit_bias_reaches_the_sampling_params_as_id_pairs() -> None:
    params = to_text_sampling_params(parse_completion_body(body(logit_bias={"50256": -100, "7": 2.5})), 16)
    assert params.logit_bias == ((50256, -100.0), (7, 2.5))


def test_choices_count_against_the_prompts_a_request_may_hold() -> None:
    assert len(prompt_list(["x"] * (MAX_PROMPTS // 8), 8)) == MAX_PROMPTS // 8
    with pytest.raises(InvalidRequest, match="8 choices each") as err:
        prompt_list(["x"] * (MAX_PROMPTS // 8 + 1), 8)
    assert err.value.param == "prompt"
