"""End to end: `n`, `logprobs` and `logit_bias` on the session daemon, through the official `openai` SDK.

The shapes and refusals are tested around a fake engine in tests/api/test_api_chat_choices.py and
tests/api/test_api_completions.py; here the real model answers: the SDK's stream helper assembles
`n` streamed choices, a seed reproduces all `n`, logprobs are the raw model's (greedy picks their
top token; a bias does not move them) and their bytes spell the text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionTokenLogprob

from llmd.engine.tokenizer import ChatTokenizer
from tests.helpers.daemon import Daemon

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the weather."}]
PROMPT = "The weather"


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)


def spelled(entries: list[ChatCompletionTokenLogprob]) -> str:
    """The text the tokens' raw bytes spell, joined (a character may span two tokens)."""
    return b"".join(bytes(entry.bytes or []) for entry in entries).decode()


def greedy_text(daemon: Daemon, max_tokens: int) -> str:
    result = client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, temperature=0,
                                                    max_tokens=max_tokens)
    return result.choices[0].message.content or ""


def test_n_streamed_choices_assemble_in_the_sdk_stream_helper(daemon: Daemon) -> None:
    with client(daemon).chat.completions.stream(model="tiny", messages=MESSAGES, n=2, max_tokens=8,
                                                temperature=1.0, seed=11) as stream:
        deltas = sum(1 for event in stream if event.type == "content.delta")
        # Read the snapshot: get_final_completion() raises LengthFinishReasonError on any "length".
        snapshot = stream.current_completion_snapshot
    assert [c.index for c in snapshot.choices] == [0, 1] and deltas >= 2
    assert all(c.message.content and c.finish_reason == "length" for c in snapshot.choices)


def test_the_stream_helpers_final_completion_holds_every_choice(daemon: Daemon) -> None:
    text = greedy_text(daemon, 12)
    stop = text[len(text) // 2:][:3]  # greedy choices all stop there, so none ends with "length"
    with client(daemon).chat.completions.stream(model="tiny", messages=MESSAGES, n=2, max_tokens=12,
                                                temperature=0, stop=[stop]) as stream:
        final = stream.get_final_completion()
    expected = text[: text.index(stop)]
    assert [(c.index, c.message.content, c.finish_reason) for c in final.choices] == [
        (0, expected, "stop"), (1, expected, "stop")]


def test_streamed_choices_open_in_index_order_on_the_wire(daemon: Daemon) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "n": 3, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{daemon.base_url}/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: {")]
    choices = [choice for chunk in chunks for choice in chunk["choices"]]
    assert [(c["index"], c["delta"].get("role")) for c in choices[:3]] == [(i, "assistant") for i in range(3)]
    assert sorted(c["index"] for c in choices if c["finish_reason"]) == [0, 1, 2]
    single = client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
    assert single.usage is not None and chunks[-1]["usage"]["prompt_tokens"] == single.usage.prompt_tokens


def test_n_choices_with_a_seed_are_reproducible_and_differ(daemon: Daemon) -> None:
    def sample() -> list[str]:
        result = client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, n=3, seed=21,
                                                        temperature=1.0, max_tokens=24)
        assert result.usage is not None and result.usage.completion_tokens <= 3 * 24
        return [c.message.content or "" for c in result.choices]

    first = sample()
    assert sample() == first and len(first) == 3
    assert len(set(first)) > 1  # choice i is seeded seed + i


def test_n_past_eight_is_a_400_naming_it(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, n=9, max_tokens=2)
    assert err.value.param == "n"


# --- logprobs and logit_bias: these need the engine side of issue 14 (logprobs, bias, prompt logprobs)


def test_chat_logprobs_are_the_raw_models_and_spell_the_text(daemon: Daemon) -> None:
    result = client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, temperature=0,
                                                    max_tokens=10, logprobs=True, top_logprobs=3)
    [choice] = result.choices
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert len(entries) == 10 and choice.finish_reason == "length"
    assert spelled(entries) == choice.message.content
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0.0
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs),
                                                                 reverse=True)
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob)
        if "\ufffd" not in entry.token:
            assert bytes(entry.bytes or []).decode() == entry.token


def test_streamed_logprobs_reach_each_choice_through_the_helper(daemon: Daemon) -> None:
    with client(daemon).chat.completions.stream(model="tiny", messages=MESSAGES, n=2, max_tokens=12,
                                                temperature=1.0, seed=5, logprobs=True) as stream:
        for _ in stream:
            pass
        snapshot = stream.current_completion_snapshot
    assert len(snapshot.choices) == 2
    for choice in snapshot.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        assert spelled(choice.logprobs.content) == choice.message.content


def test_completions_echo_with_logprobs_starts_with_the_prompts_tokens(daemon: Daemon) -> None:
    result = client(daemon).completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=2,
                                               max_tokens=5, temperature=0)
    [choice] = result.choices
    logprobs = choice.logprobs
    assert logprobs is not None and result.usage is not None and choice.text.startswith(PROMPT)
    tokens, offsets = logprobs.tokens or [], logprobs.text_offset or []
    assert len(tokens) == len(offsets) == result.usage.prompt_tokens + result.usage.completion_tokens
    assert (logprobs.token_logprobs or [])[0] is None and (logprobs.top_logprobs or [])[0] is None
    assert tokens[0] == "<|begin_of_text|>" and offsets[0] == 0  # the BOS the prompt starts with
    assert "".join(tokens[1:]) == choice.text  # the lead of the demo text is plain ASCII
    assert offsets == sorted(offsets) and offsets[result.usage.prompt_tokens] == len(PROMPT)
    assert all(choice.text[o:].startswith(t) for o, t in zip(offsets[1:], tokens[1:], strict=True))
    tops = (logprobs.top_logprobs or [])[1:]
    assert all(top is not None and 1 <= len(top) <= 3 for top in tops)


def test_a_completions_stream_carries_its_tokens_logprobs(daemon: Daemon) -> None:
    sdk = client(daemon)
    whole = sdk.completions.create(model="tiny", prompt=PROMPT, logprobs=1, max_tokens=6, temperature=0)
    chunks = list(sdk.completions.create(model="tiny", prompt=PROMPT, logprobs=1, max_tokens=6,
                                         temperature=0, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []]
    assert whole.choices[0].logprobs is not None and streamed == whole.choices[0].logprobs.tokens
    assert len(streamed) == 6


def test_logit_bias_forces_a_token_while_logprobs_stay_the_models(daemon: Daemon, tiny_model: Path) -> None:
    [the] = ChatTokenizer(tiny_model).encode_text(" the", literal=False)
    result = client(daemon).completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0,
                                               logit_bias={str(the): 100}, logprobs=1)
    [choice] = result.choices
    assert choice.text == " the" * 4
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs and logprobs.top_logprobs
    # The raw distribution, before the bias: " the" is not the model's own top pick every time.
    assert any(max(top.values()) > chosen for top, chosen in zip(logprobs.top_logprobs,
                                                                   logprobs.token_logprobs, strict=True)
               if top is not None and chosen is not None)


def test_a_token_id_beyond_the_vocabulary_is_a_400_naming_logit_bias(daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                               logit_bias={"99999999": 5})
    assert err.value.param == "logit_bias"
