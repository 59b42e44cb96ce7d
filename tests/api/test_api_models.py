"""`GET /v1/models` and `GET /v1/models/{id}`: the served entry, its context window, the 404 for others."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import openai
import pytest
from litestar.testing import TestClient

from llmd.api.app import create_app
from llmd.config import Settings
from llmd.service.metrics import Metrics
from tests.helpers.api_client import BASE_URL, MODEL, openai_error, sdk, served
from tests.helpers.fake_engine import FakeEngine

HF_ID = "Qwen/Qwen2.5-7B-Instruct"
KEY = "models-key-0123456789"
ORIGIN = "http://localhost:5173"


@contextmanager
def serving(model_id: str, context_length: int) -> Iterator[TestClient]:
    """The app serving `model_id` with `context_length`, around a default fake."""
    engine = FakeEngine(max_context=context_length)
    app = create_app(engine, Metrics(engine_stats=engine.stats), Settings(), model_id,
                     context_length=context_length)
    with TestClient(app, base_url=BASE_URL) as client:
        yield client


def test_every_entry_carries_the_context_under_both_names() -> None:
    with served(FakeEngine(max_context=2048)) as client:
        listed = client.get("/v1/models").json()
        retrieved = client.get(f"/v1/models/{MODEL}").json()
    assert listed == {"object": "list", "data": [retrieved]}
    assert retrieved == {"id": MODEL, "object": "model", "created": retrieved["created"], "owned_by": "llmd",
                         "max_model_len": 2048, "context_length": 2048}
    assert isinstance(retrieved["created"], int)


def test_the_sdk_retrieves_the_served_model_and_reads_the_extra_fields() -> None:
    with served(FakeEngine(max_context=2048)) as client:
        model = sdk(client).models.retrieve(MODEL)
        listed = sdk(client).models.list().data
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "llmd")
    assert model.model_extra == {"max_model_len": 2048, "context_length": 2048}
    assert listed == [model]


def test_an_id_with_a_slash_is_found_however_the_slash_is_sent() -> None:
    with serving(HF_ID, 1234) as client:
        encoded = client.get("/v1/models/Qwen%2FQwen2.5-7B-Instruct")  # what openai-python sends
        raw = client.get(f"/v1/models/{HF_ID}")
        model = sdk(client).models.retrieve(HF_ID)
    assert encoded.status_code == raw.status_code == 200 and encoded.json() == raw.json()
    assert model.id == HF_ID and model.model_extra == {"max_model_len": 1234, "context_length": 1234}


@pytest.mark.parametrize("other", ["gpt-4o", "Qwen/other", f"{MODEL}/more", MODEL.upper()])
def test_another_id_is_404_model_not_found_in_the_openai_shape(other: str) -> None:
    with served() as client:
        error = openai_error(client.get(f"/v1/models/{other}"), 404, "model_not_found")
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    assert f"`{other}`" in error["message"] and f"`{MODEL}`" in error["message"]


def test_the_sdk_raises_not_found_for_another_id() -> None:
    with served() as client, pytest.raises(openai.NotFoundError) as err:
        sdk(client).models.retrieve("Qwen/other")
    assert err.value.status_code == 404 and err.value.code == "model_not_found"


def test_head_answers_like_the_get() -> None:
    with served() as client:
        head, got = client.head(f"/v1/models/{MODEL}"), client.get(f"/v1/models/{MODEL}")
        missing = client.head("/v1/models/other")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(got.content))
    assert missing.status_code == 404 and missing.content == b""


def test_it_needs_the_key_like_other_routes_and_answers_an_allowed_origin() -> None:
    headers = {"Origin": ORIGIN}
    with served(settings=Settings(cors_origins=(ORIGIN,)), keys=frozenset({KEY})) as client:
        refused = client.get(f"/v1/models/{MODEL}", headers=headers)
        allowed = client.get(f"/v1/models/{MODEL}", headers=headers | {"Authorization": f"Bearer {KEY}"})
    openai_error(refused, 401, "invalid_api_key")
    assert allowed.status_code == 200 and allowed.json()["id"] == MODEL
    assert [r.headers["access-control-allow-origin"] for r in (refused, allowed)] == [ORIGIN, ORIGIN]

