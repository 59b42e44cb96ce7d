"""API keys (settings, key file, $LLMD_API_KEY), 401 in the OpenAI shape, CORS, the exposure warning."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmd.api.access import KeyCheck
from llmd.config import Settings, api_keys
from llmd.errors import ConfigError
from tests.conftest import Daemon, start_daemon

SETTINGS_KEY = "settings-key-0123456789"
FILE_KEY = "file-key-0123456789"
ENV_KEY = "env-key-0123456789"
ORIGIN = "http://localhost:5173"
CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def guarded(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "keys").write_text(f"# one key per line\n{FILE_KEY}\n\n")
    (tmp / "llmd.yaml").write_text(
        f"api_keys: [{SETTINGS_KEY}]\napi_key_file: {tmp / 'keys'}\ncors_origins: ['{ORIGIN}']\n")
    os.environ["LLMD_API_KEY"] = ENV_KEY
    try:
        daemon = start_daemon(tmp, "--model", str(tiny_model), "--served-model-name", "tiny",
                              "--config", str(tmp / "llmd.yaml"))
    finally:
        del os.environ["LLMD_API_KEY"]
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def test_no_key_and_wrong_key_get_401_in_the_openai_shape(guarded: Daemon) -> None:
    url = f"{guarded.base_url}/chat/completions"
    missing = httpx.post(url, json=CHAT, timeout=10)
    wrong = httpx.post(url, json=CHAT, timeout=10, headers={"Authorization": "Bearer not-the-key-at-all"})
    basic = httpx.post(url, json=CHAT, timeout=10, headers={"Authorization": f"Basic {SETTINGS_KEY}"})
    for response in (missing, wrong, basic):
        assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
        assert set(error) == {"message", "type", "param", "code"}
    assert "didn't provide an API key" in missing.json()["error"]["message"]
    assert "Incorrect API key" in wrong.json()["error"]["message"]
    assert httpx.get(f"{guarded.base_url}/models", timeout=10).status_code == 401
    assert httpx.get(f"{guarded.url}/stats", timeout=10).status_code == 401


@pytest.mark.parametrize("key", [SETTINGS_KEY, FILE_KEY, ENV_KEY])
def test_each_configured_key_is_accepted_by_the_sdk(guarded: Daemon, key: str) -> None:
    client = openai.OpenAI(base_url=guarded.base_url, api_key=key)
    reply = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert reply.choices[0].finish_reason == "length"


def test_the_sdk_raises_authentication_error_for_a_wrong_key(guarded: Daemon) -> None:
    client = openai.OpenAI(base_url=guarded.base_url, api_key="wrong-key-0123456789", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        client.models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def test_health_and_ready_stay_open(guarded: Daemon) -> None:
    assert httpx.get(f"{guarded.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{guarded.url}/ready", timeout=10).status_code == 200


def test_cors_preflight_only_for_the_configured_origin(guarded: Daemon, daemon: Daemon) -> None:
    def preflight(target: Daemon, origin: str) -> httpx.Response:
        return httpx.options(f"{target.base_url}/chat/completions", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})

    allowed = preflight(guarded, ORIGIN)
    assert allowed.status_code in (200, 204)
    assert allowed.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "authorization" in allowed.headers["Access-Control-Allow-Headers"].lower()
    assert "Access-Control-Allow-Origin" not in preflight(guarded, "http://evil.example").headers
    assert "Access-Control-Allow-Origin" not in preflight(daemon, ORIGIN).headers  # off by default


def test_an_open_daemon_needs_no_key(daemon: Daemon) -> None:
    assert httpx.get(f"{daemon.base_url}/models", timeout=10).status_code == 200


def test_key_check_compares_against_every_key() -> None:
    check = KeyCheck(frozenset({"a" * 16, "b" * 16}), protect_metrics=False)
    assert check.accepts(b"b" * 16) and check.accepts(b"a" * 16)
    assert not check.accepts(b"c" * 16) and not check.accepts(b"a" * 15)


def test_key_sources_merge_and_short_keys_are_refused(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"{FILE_KEY}\n# {ENV_KEY} commented out\n")
    settings = Settings(api_keys=(SETTINGS_KEY,), api_key_file=str(tmp_path / "keys"))
    assert api_keys(settings, {"LLMD_API_KEY": ENV_KEY}) == {SETTINGS_KEY, FILE_KEY, ENV_KEY}
    assert api_keys(Settings(), {}) == frozenset()
    with pytest.raises(ConfigError, match="shorter than 8"):
        api_keys(Settings(api_keys=("short",)), {})
    with pytest.raises(ConfigError, match="api_key_file"):
        api_keys(Settings(api_key_file=str(tmp_path / "missing")), {})


def test_binding_beyond_loopback_without_a_key_warns_loudly(tiny_model: Path, tmp_path: Path) -> None:
    exposed = start_daemon(tmp_path, "--model", str(tiny_model), "--host", "0.0.0.0")
    assert exposed.stop() == 0
    assert "without an API key: anyone who can reach this port can use the model" in exposed.log()


def test_options_is_not_401_with_keys(guarded: Daemon) -> None:
    for path in ("/health", "/v1/models", "/v1/chat/completions"):
        response = httpx.options(f"{guarded.url}{path}", timeout=10)
        assert response.status_code == 204 and "OPTIONS" in response.headers["Allow"], path


def test_cors_refusals_are_in_the_openai_shape(guarded: Daemon, daemon: Daemon) -> None:
    def preflight(target: Daemon, origin: str, method: str = "POST") -> httpx.Response:
        return httpx.options(f"{target.base_url}/chat/completions", timeout=10, headers={
            "Origin": origin, "Access-Control-Request-Method": method})

    refusals = ((preflight(guarded, "http://evil.example"), "http://evil.example"),
                (preflight(daemon, ORIGIN), ORIGIN), (preflight(guarded, ORIGIN, "DELETE"), "DELETE"))
    for refused, named in refusals:
        assert refused.status_code == 403 and "Access-Control-Allow-Origin" not in refused.headers
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "cors_not_allowed"
        assert named in error["message"] and "cors" in error["message"].lower()


def test_an_allowed_origin_can_read_answers_and_errors(guarded: Daemon) -> None:
    ok = httpx.get(f"{guarded.url}/health", headers={"Origin": ORIGIN}, timeout=10)
    denied = httpx.get(f"{guarded.base_url}/models", headers={"Origin": ORIGIN}, timeout=10)
    other = httpx.get(f"{guarded.url}/health", headers={"Origin": "http://evil.example"}, timeout=10)
    assert ok.headers["Access-Control-Allow-Origin"] == ORIGIN and "Origin" in ok.headers["Vary"]
    assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other.headers
