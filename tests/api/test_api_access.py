"""Who may call, decided by the app alone: API keys, CORS, the Host check and JSON-only POSTs."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from litestar.testing import TestClient
from litestar.utils.sync import AsyncCallable

from llmd.config import Settings
from tests.helpers.api_client import CHAT, openai_error, post_chat, sdk, served

KEY = "settings-key-0123456789"
OTHER_KEY = "file-key-0123456789"
KEYS = frozenset({KEY, OTHER_KEY})
ORIGIN = "http://localhost:5173"
EVIL = "http://evil.example"
GUARDED = Settings(cors_origins=(ORIGIN,))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- API keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer not-the-key-at-all", f"Basic {KEY}", "Bearer  "])
def test_no_key_or_a_wrong_key_is_401_in_the_openai_shape(authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else None
    with served(keys=KEYS) as client:
        response = post_chat(client, headers=headers)
    error = openai_error(response, 401, "invalid_api_key")
    assert response.headers["www-authenticate"] == "Bearer" and error["type"] == "invalid_request_error"
    wrong = authorization == "Bearer not-the-key-at-all"
    assert ("Incorrect API key" if wrong else "didn't provide an API key") in error["message"]


@pytest.mark.parametrize("path", ["/v1/models", "/stats"])
def test_every_other_route_needs_the_key(path: str) -> None:
    with served(keys=KEYS) as client:
        openai_error(client.get(path), 401, "invalid_api_key")
        assert client.get(path, headers=bearer(KEY)).status_code == 200


@pytest.mark.parametrize("key", sorted(KEYS))
def test_each_key_is_accepted_by_the_sdk(key: str) -> None:
    with served(keys=KEYS) as client:
        reply = sdk(client, api_key=key).chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert reply.choices[0].finish_reason == "length"


def test_the_sdk_raises_authentication_error_for_a_wrong_key() -> None:
    with served(keys=KEYS) as client, pytest.raises(openai.AuthenticationError) as err:
        sdk(client, api_key="wrong-key-0123456789").models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def test_health_ready_and_metrics_stay_open() -> None:
    with served(keys=KEYS) as client:
        assert [client.get(p).status_code for p in ("/health", "/ready", "/metrics")] == [200, 200, 200]


def test_protect_metrics_puts_metrics_behind_the_key() -> None:
    with served(settings=Settings(protect_metrics=True), keys=KEYS) as client:
        openai_error(client.get("/metrics"), 401, "invalid_api_key")
        assert client.get("/metrics", headers=bearer(KEY)).status_code == 200


def test_without_keys_no_key_is_needed() -> None:
    with served() as client:
        assert client.get("/v1/models").status_code == 200 and post_chat(client).status_code == 200


def test_options_is_not_401_with_keys() -> None:
    with served(keys=KEYS) as client:
        for path in ("/health", "/v1/models", "/v1/chat/completions"):
            response = client.options(path)
            assert response.status_code == 204 and "OPTIONS" in response.headers["allow"], path


# --- CORS -------------------------------------------------------------------------------------


def preflight(client: TestClient, origin: str, method: str = "POST", headers: str | None = None
              ) -> httpx.Response:
    asked = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        asked["Access-Control-Request-Headers"] = headers
    return client.options("/v1/chat/completions", headers=asked)


def test_a_preflight_from_the_configured_origin_is_granted() -> None:
    with served(settings=GUARDED, keys=KEYS) as client:
        allowed = preflight(client, ORIGIN, headers="authorization, content-type")
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert allowed.headers["access-control-allow-headers"] == "authorization, content-type"
    assert allowed.headers["access-control-allow-methods"] == "GET, HEAD, OPTIONS, POST"
    assert allowed.headers["access-control-max-age"] == "600" and allowed.headers["vary"] == "Origin"


@pytest.mark.parametrize(("settings", "origin", "method", "named"), [
    (GUARDED, EVIL, "POST", EVIL),
    (Settings(), ORIGIN, "POST", ORIGIN),  # CORS is off by default
    (GUARDED, ORIGIN, "DELETE", "DELETE"),
])
def test_refused_preflights_are_403_in_the_openai_shape(settings: Settings, origin: str, method: str,
                                                        named: str) -> None:
    with served(settings=settings, keys=KEYS) as client:
        refused = preflight(client, origin, method)
    assert "access-control-allow-origin" not in refused.headers
    error = openai_error(refused, 403, "cors_not_allowed")
    assert named in error["message"] and "cors" in error["message"].lower()


def test_an_allowed_origin_can_read_answers_and_errors_and_others_cannot() -> None:
    with served(settings=GUARDED, keys=KEYS) as client:
        ok = client.get("/health", headers={"Origin": ORIGIN})
        denied = client.get("/v1/models", headers={"Origin": ORIGIN})
        other = client.get("/health", headers={"Origin": EVIL})
    assert ok.headers["access-control-allow-origin"] == ORIGIN and "Origin" in ok.headers["vary"]
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


def test_a_wildcard_origin_allows_any_page() -> None:
    with served(settings=Settings(cors_origins=("*",))) as client:
        assert preflight(client, EVIL).headers["access-control-allow-origin"] == EVIL


# --- Host -------------------------------------------------------------------------------------


def get_models(client: TestClient, host: str) -> httpx.Response:
    return client.get("/v1/models", headers={"Host": host})


@pytest.mark.parametrize("host", ["evil.example:8000", "evil.example", "localhost.evil.example",
                                  "llm.lan", "192.168.1.20:8000"])
def test_a_host_that_is_not_this_server_is_403(host: str) -> None:
    with served() as client:
        error = openai_error(get_models(client, host), 403, "host_not_allowed")
    assert host.split(":")[0] in error["message"] and "allowed_hosts" in error["message"]


def test_a_foreign_host_is_refused_on_every_route_before_the_key() -> None:
    with served(keys=KEYS) as client:
        for path in ("/health", "/ready", "/stats", "/metrics", "/v1/models"):
            openai_error(client.get(path, headers={"Host": "evil.example"}), 403, "host_not_allowed")
        refused = post_chat(client, headers={"Host": "evil.example"})
    openai_error(refused, 403, "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost:8000", "localhost", "LOCALHOST.", "127.0.0.1",
                                  "127.0.0.1:8000", "127.1.2.3", "[::1]:8000", "app.localhost"])
def test_loopback_names_are_this_server(host: str) -> None:
    with served() as client:
        assert get_models(client, host).status_code == 200


LAN = Settings(host="0.0.0.0", allowed_hosts=("llm.lan", ".example.lan"))


@pytest.mark.parametrize("host", ["llm.lan", "llm.lan:8000", "example.lan", "box.example.lan",
                                  "192.168.1.20:8000", "[fe80::1]"])
def test_allowed_hosts_and_ip_literals_on_a_wildcard_bind(host: str) -> None:
    with served(settings=LAN) as client:
        assert get_models(client, host).status_code == 200


@pytest.mark.parametrize("host", ["other.lan", "llm.lan.evil.example", "xexample.lan"])
def test_names_outside_allowed_hosts_stay_refused(host: str) -> None:
    with served(settings=LAN) as client:
        openai_error(get_models(client, host), 403, "host_not_allowed")


# --- Content-Type -----------------------------------------------------------------------------


def post_raw(client: TestClient, headers: dict[str, str]) -> httpx.Response:
    """The chat body as bytes, with exactly the headers given (httpx adds no type for bytes)."""
    return client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(), headers=headers)


@pytest.mark.parametrize("headers", [{"Content-Type": "text/plain"}, {},
                                     {"Content-Type": "application/x-www-form-urlencoded"},
                                     {"Content-Type": "multipart/form-data; boundary=x"}])
def test_a_post_body_not_typed_as_json_is_415(headers: dict[str, str]) -> None:
    with served() as client:
        error = openai_error(post_raw(client, headers), 415, "unsupported_media_type")
    assert "Content-Type: application/json" in error["message"]


@pytest.mark.parametrize("value", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON ;charset=UTF-8"])
def test_json_with_or_without_parameters_is_served(value: str) -> None:
    with served() as client:
        assert post_raw(client, {"Content-Type": value}).status_code == 200


# --- cost ---------------------------------------------------------------------------------------


def test_every_guard_runs_on_the_event_loop_not_in_a_thread() -> None:
    """Litestar runs a synchronous guard in its thread pool: three guards were three thread hops
    a request, before the handler, on a host whose cores the forward pass holds."""
    with served(keys=KEYS) as client:
        routes = client.app.routes
        handlers = [handler for route in routes for handler in getattr(route, "route_handlers", [])]
        assert handlers
        for handler in handlers:
            guards = handler.resolve_guards()
            assert len(guards) == 3
            assert not [guard for guard in guards if isinstance(guard, AsyncCallable)], handler
