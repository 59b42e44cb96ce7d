"""The api tier's harness: `create_app` around a `FakeEngine`, driven in-process by Litestar's test client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import httpx
import openai
from litestar.testing import TestClient

from llmd.api.app import create_app
from llmd.api.responses.store import ResponseStore
from llmd.config import Settings
from llmd.service.metrics import Metrics
from tests.helpers.fake_engine import FakeEngine

MODEL = "tiny"
# The Host every request carries: a loopback name, as a local client sends (Litestar's default,
# testserver.local, is a foreign name that `HostCheck` refuses).
BASE_URL = "http://127.0.0.1:8000"
MESSAGES = [{"role": "user", "content": "Say something."}]
CHAT = {"model": MODEL, "max_tokens": 2, "messages": MESSAGES}
ERROR_FIELDS = {"message", "type", "param", "code"}


@contextmanager
def served(engine: FakeEngine | None = None, settings: Settings | None = None,
           keys: frozenset[str] = frozenset(), metrics: Metrics | None = None,
           responses: ResponseStore | None = None) -> Iterator[TestClient]:
    """A test client of the app around `engine` (a default fake unless given), storing responses in
    `responses` when given."""
    engine = engine if engine is not None else FakeEngine()
    metrics = metrics if metrics is not None else Metrics(engine_stats=engine.stats)
    app = create_app(engine, metrics, settings or Settings(), MODEL, keys, context_length=engine.max_context,
                     responses=responses)
    with TestClient(app, base_url=BASE_URL) as client:
        yield client


def sdk(client: TestClient, api_key: str = "unused") -> openai.OpenAI:
    """The real `openai` SDK, sending through the in-process test client."""
    # An httpx.Client at run time; Litestar's `type: ignore[misc]` on its bases hides that from mypy.
    http_client = cast(httpx.Client, client)
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=api_key, max_retries=0,
                         http_client=http_client)  # type: ignore[arg-type]  # the SDK types its own httpx


def post_chat(client: TestClient, headers: dict[str, str] | None = None, **fields: object) -> httpx.Response:
    """POST a chat body (`CHAT` with `fields` over it) as JSON."""
    return client.post("/v1/chat/completions", json=CHAT | fields, headers=headers)


def openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, str]:
    """The `error` object of an OpenAI-shaped error response, after checking status, shape and code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS and error["code"] == code, error
    return error


def sse_payloads(response: httpx.Response) -> list[str]:
    """The raw `data:` payloads of an SSE body, checking the framing as it goes."""
    body = response.text
    assert body.endswith("\n\n"), body[-100:]
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e.removeprefix("data: ") for e in events]


def sse_chunks(response: httpx.Response) -> list[dict]:
    """The JSON events of an SSE body that ends in `[DONE]`."""
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads[:-1]]
