"""End to end: what real clients send is accepted honestly, on the session daemon with the real SDK.

The SDK's echo-back multi-turn loop, a bundle of harmless fields, the local-server sampling and
template extensions, and the one 400 that names every refused field.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.helpers.daemon import Daemon

MESSAGES: list[Any] = [{"role": "user", "content": "Say something in Korean."}]
HARMLESS = {"store": False, "metadata": {"run": "e2e"}, "service_tier": "auto", "parallel_tool_calls": False,
            "prompt_cache_key": "session-1", "safety_identifier": "user-1", "verbosity": "low",
            "modalities": ["text"], "user": "someone"}


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("dump", [False, True], ids=["message", "model_dump"])
def test_the_sdk_echo_back_multi_turn_loop(daemon: Daemon, dump: bool) -> None:
    sdk = client(daemon)
    messages = list(MESSAGES)
    for turn in range(3):
        reply = sdk.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=8)
        message = reply.choices[0].message
        assert message.refusal is None and message.content
        messages += [message.model_dump() if dump else message, {"role": "user", "content": f"and {turn}?"}]
    assert len(messages) == 7


def test_a_bundle_of_harmless_fields_is_accepted(daemon: Daemon) -> None:
    for stream in (False, True):
        reply = client(daemon).chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=0, max_tokens=6, stream=stream,
            extra_body=HARMLESS | {"stream_options": {"include_usage": True}})
        chunks = list(reply) if stream else [reply]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_local_server_sampling_extensions(daemon: Daemon) -> None:
    sdk = client(daemon)
    result = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0.8, max_tokens=8, seed=5,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2, "min_tokens": 8,
                    "ignore_eos": True, "stop_token_ids": [1],
                    "chat_template_kwargs": {"enable_thinking": False}})
    assert result.usage is not None and result.usage.completion_tokens == 8
    assert result.choices[0].finish_reason == "length"


def test_continue_final_message_goes_on_inside_the_last_turn(daemon: Daemon) -> None:
    turn = {"role": "assistant", "content": "안녕"}
    result = client(daemon).chat.completions.create(
        model="tiny", messages=[*MESSAGES, turn], temperature=0, max_tokens=4,  # type: ignore[list-item]
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert result.choices[0].finish_reason == "length"


@pytest.mark.parametrize(("extra", "param"), [
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"min_tokens": 9}, "min_tokens"),
])
def test_extension_misuse_is_a_400_naming_it(daemon: Daemon, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client(daemon).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8,
                                               extra_body=extra)
    assert bad.value.param == param


def test_every_refused_field_in_one_400_on_the_wire(daemon: Daemon) -> None:
    def error_of(**fields: object) -> dict[str, str]:
        body = {"model": "tiny", "messages": MESSAGES} | fields
        response = httpx.post(f"{daemon.base_url}/chat/completions", json=body, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported_parameter"
        return dict(response.json()["error"])

    unknown = error_of(foo=1, prediction={"type": "content", "content": "x"}, modalities=["audio"])
    assert unknown["param"] == "foo" and "`prediction`" in unknown["message"]
    turns = [*MESSAGES, {"role": "user", "content": "x", "tool_call_id": "c"}]
    values = error_of(modalities=["audio"], messages=turns)
    assert values["param"] == "modalities" and "`messages[1].tool_call_id`" in values["message"]
