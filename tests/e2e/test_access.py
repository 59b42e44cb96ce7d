"""API keys (settings, key file, $LLMD_API_KEY), CORS and the Host check on a real daemon; the exposure
warning.

One daemon with keys from every source, a CORS origin and a wildcard bind with `allowed_hosts`
is the smoke of the settings' wiring; what the guards answer in every case is tested around a
fake engine in tests/api/test_api_access.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmd.api.access import KeyCheck
from llmd.config import Settings, api_keys
from llmd.daemon import warn_if_exposed
from llmd.errors import ConfigError
from tests.helpers.daemon import Daemon, start_daemon

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
        f"api_keys: [{SETTINGS_KEY}]\napi_key_file: {tmp / 'keys'}\ncors_origins: ['{ORIGIN}']\n"
        "host: 0.0.0.0\nallowed_hosts: [llm.lan]\n")
    os.environ["LLMD_API_KEY"] = ENV_KEY
    try:
        daemon = start_daemon(tmp, "--model", str(tiny_model), "--served-model-name", "tiny",
                              "--config", str(tmp / "llmd.yaml"))
    finally:
        del os.environ["LLMD_API_KEY"]
    yield daemon
    assert daemon.stop() == 0, daemon.log()


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


def test_cors_preflight_for_the_configured_origin(guarded: Daemon) -> None:
    allowed = httpx.options(f"{guarded.base_url}/chat/completions", timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert allowed.status_code == 204
    assert allowed.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "authorization" in allowed.headers["Access-Control-Allow-Headers"].lower()
    refused = httpx.options(f"{guarded.base_url}/chat/completions", timeout=10, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert refused.status_code == 403 and "Access-Control-Allow-Origin" not in refused.headers


def test_allowed_hosts_on_a_wildcard_bind_and_a_foreign_host_refused(guarded: Daemon) -> None:
    def models(host: str) -> httpx.Response:
        headers = {"Host": host, "Authorization": f"Bearer {ENV_KEY}"}
        return httpx.get(f"{guarded.base_url}/models", headers=headers, timeout=10)

    assert models("llm.lan:8000").status_code == 200 and models("192.168.1.20").status_code == 200
    refused = models("evil.example")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"


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



def test_binding_beyond_loopback_without_a_key_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="llmd"):
        warn_if_exposed(Settings(host="0.0.0.0"), frozenset())
        warn_if_exposed(Settings(host="127.0.0.2"), frozenset())
        warn_if_exposed(Settings(host="0.0.0.0"), frozenset({SETTINGS_KEY}))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "listening on 0.0.0.0 without an API key: anyone who can reach this port" \
        in warnings[0]
    assert "API keys: 1 accepted; /health and /ready are open" in caplog.text
