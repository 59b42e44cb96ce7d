"""What clients send, accepted honestly: the SDK echo-back, harmless fields, the local-server
extensions reaching the engine, and one 400 naming every refused field; around a fake engine."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from llmd.engine.types import TemplateOptions
from tests.helpers.api_client import MESSAGES, MODEL, openai_error, post_chat, sdk, served
from tests.helpers.fake_engine import FakeEngine

HARMLESS: dict[str, Any] = {
    "store": False, "metadata": {"session": "a"}, "service_tier": "auto", "parallel_tool_calls": False,
    "prompt_cache_key": "k", "safety_identifier": "s", "verbosity": "low", "modalities": ["text"],
    "user": "u", "prompt_cache_retention": "24h", "n": 1, "logprobs": False, "logit_bias": {},
}
REPLY = {"role": "assistant", "content": "Hello, world!"}


@pytest.mark.parametrize("dump", [False, True])
def test_the_sdk_echo_back_loop_works(dump: bool) -> None:
    engine = FakeEngine()
    with served(engine) as client:
        api = sdk(client)
        messages: list[Any] = list(MESSAGES)
        for turn in range(3):
            reply = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
            message = reply.choices[0].message
            echoed = message.model_dump() if dump else message
            messages += [echoed, {"role": "user", "content": f"more {turn}"}]
    assert len(engine.encoded) == 3
    assert [m for m in engine.encoded[-1] if m["role"] == "assistant"] == [REPLY, REPLY]


def test_harmless_fields_are_accepted_through_the_sdk() -> None:
    with served() as client:
        reply = sdk(client).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=5, store=True, metadata={"run": "1"},  # type: ignore[arg-type]
            service_tier="auto", parallel_tool_calls=False, prompt_cache_key="k", safety_identifier="s",
            verbosity="low", modalities=["text"], user="u", n=1, logprobs=False, top_logprobs=0,
            extra_body={"stream_options": {"include_usage": True}})
    assert reply.choices[0].message.content == "Hello, world!"


@pytest.mark.parametrize("stream", [False, True])
def test_harmless_fields_on_the_raw_wire(stream: bool) -> None:
    with served() as client:
        response = post_chat(client, stream=stream, stream_options={"include_usage": True}, **HARMLESS)
    assert response.status_code == 200, response.text


def test_every_refused_field_is_named_in_one_400() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                             {"type": "image_url", "image_url": {"url": "data:,"}}]}]
    with served() as client:
        error = openai_error(post_chat(client, messages=messages, foo=1, bar=2), 400, "unsupported_parameter")
    assert error["type"] == "invalid_request_error" and error["param"] == "foo"
    assert all(f"`{name}`" in error["message"] for name in ("foo", "bar", "messages[0].content[1].type"))


def test_the_sdk_sees_one_bad_request_naming_all() -> None:
    with served() as client, pytest.raises(openai.BadRequestError) as bad:
        sdk(client).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": [{"type": "input_audio"}]}],  # type: ignore[list-item]
            modalities=["text", "audio"])  # type: ignore[list-item]
    assert bad.value.code == "unsupported_parameter" and bad.value.param == "modalities"
    assert all(f"`{name}`" in bad.value.message for name in ("modalities", "messages[0].content[0].type"))


def test_sampling_and_template_extensions_reach_the_engine() -> None:
    engine = FakeEngine()
    with served(engine) as client:
        response = post_chat(client, max_tokens=9, min_p=0.05, repetition_penalty=1.1, stop_token_ids=[7],
                             ignore_eos=True, min_tokens=3, top_k=40, reasoning_effort="high",
                             chat_template_kwargs={"enable_thinking": False}, add_generation_prompt=False)
    assert response.status_code == 200, response.text
    params = engine.submitted[0][1]
    assert (params.min_p, params.repetition_penalty, params.stop_token_ids) == (0.05, 1.1, (7,))
    assert params.ignore_eos and params.min_tokens == 3 and params.top_k == 40
    variables = {"reasoning_effort": "high", "enable_thinking": False}
    assert engine.templates == [TemplateOptions(False, False, variables)]


def test_continue_final_message_reaches_the_template() -> None:
    engine = FakeEngine()
    turn = {"role": "assistant", "content": "The answer is"}
    with served(engine) as client:
        assert post_chat(client, messages=[*MESSAGES, turn], continue_final_message=True).status_code == 200
    assert engine.templates == [TemplateOptions(add_generation_prompt=False, continue_final_message=True)]
