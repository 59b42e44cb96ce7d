"""End to end: `models.list` and `models.retrieve` with the real `openai` SDK against a real daemon.

The shapes, the 404 and the guards are tested around a fake engine in tests/api/test_api_models.py;
here the context the daemon advertises is the one its engine enforces.
"""

from __future__ import annotations

import openai
import pytest

from tests.helpers.daemon import Daemon


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)


def test_the_sdk_lists_and_retrieves_the_model_with_the_context_the_engine_enforces(daemon: Daemon) -> None:
    sdk = client(daemon)
    listed = sdk.models.list().data
    model = sdk.models.retrieve("tiny")
    assert listed == [model] and (model.id, model.owned_by) == ("tiny", "llmd")
    extra = model.model_extra or {}
    context = extra["max_model_len"]
    assert extra == {"max_model_len": context, "context_length": context}
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                    max_tokens=context + 1)
    assert f"maximum context length is {context} tokens" in too_long.value.message


def test_the_sdk_gets_not_found_for_another_id_even_with_a_slash(daemon: Daemon) -> None:
    with pytest.raises(openai.NotFoundError) as missing:  # sent as /models/Qwen%2Fother
        client(daemon).models.retrieve("Qwen/other")
    assert missing.value.code == "model_not_found" and "`Qwen/other`" in missing.value.message
