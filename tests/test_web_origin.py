"""Localhost is not a web origin: POSTs must be JSON-typed, the Host must name this server.

Plus the HTTP edges next to it: HEAD on every GET route, and a null text part's message.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmd.api.access import HostCheck, media_type
from llmd.api.app import create_app
from llmd.config import Settings
from llmd.metrics import Metrics
from tests.conftest import Daemon, start_daemon
from tests.helpers.fake_engine import FakeEngine

CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def lan(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Bound to every address, with names for the LAN in `allowed_hosts`."""
    tmp = tmp_path_factory.mktemp("lan")
    (tmp / "llmd.yaml").write_text("host: 0.0.0.0\nallowed_hosts: [llm.lan, .example.lan]\n")
    daemon = start_daemon(tmp, "--model", str(tiny_model), "--served-model-name", "tiny",
                          "--config", str(tmp / "llmd.yaml"))
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def post_chat(daemon: Daemon, headers: dict[str, str]) -> httpx.Response:
    """The chat body as raw bytes, with exactly the headers given (httpx adds no type for bytes)."""
    return httpx.post(f"{daemon.base_url}/chat/completions", content=json.dumps(CHAT).encode(),
                      headers=headers, timeout=30)


def get_models(daemon: Daemon, host: str) -> httpx.Response:
    return httpx.get(f"{daemon.base_url}/models", headers={"Host": host}, timeout=10)


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> dict[str, str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    return error


# --- Content-Type ---------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{"Content-Type": "text/plain"}, {},
                                     {"Content-Type": "application/x-www-form-urlencoded"},
                                     {"Content-Type": "multipart/form-data; boundary=x"}])
def test_a_post_body_not_typed_as_json_is_415(daemon: Daemon, headers: dict[str, str]) -> None:
    error = assert_openai_error(post_chat(daemon, headers), 415, "unsupported_media_type")
    assert "Content-Type: application/json" in error["message"]


@pytest.mark.parametrize("value", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON ;charset=UTF-8"])
def test_json_with_or_without_parameters_is_served(daemon: Daemon, value: str) -> None:
    assert post_chat(daemon, {"Content-Type": value}).status_code == 200


def test_media_type_ignores_parameters_and_case() -> None:
    assert media_type("Application/JSON; charset=utf-8") == "application/json"
    assert media_type(None) == "" and media_type("text/plain") == "text/plain"


# --- Host -----------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example:8000", "evil.example", "localhost.evil.example",
                                  "llm.lan", "192.168.1.20:8000"])
def test_a_host_that_is_not_this_server_is_403(daemon: Daemon, host: str) -> None:
    error = assert_openai_error(get_models(daemon, host), 403, "host_not_allowed")
    assert host.split(":")[0] in error["message"] and "allowed_hosts" in error["message"]


def test_a_foreign_host_is_refused_on_every_route(daemon: Daemon) -> None:
    for path in ("/health", "/ready", "/stats", "/metrics", "/v1/models"):
        response = httpx.get(f"{daemon.url}{path}", headers={"Host": "evil.example"}, timeout=10)
        assert response.status_code == 403, path
    refused = httpx.post(f"{daemon.base_url}/chat/completions", json=CHAT, timeout=30,
                         headers={"Host": "evil.example"})
    assert_openai_error(refused, 403, "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost:{port}", "localhost", "LOCALHOST.", "127.0.0.1",
                                  "127.0.0.1:{port}", "127.1.2.3", "[::1]:{port}", "app.localhost"])
def test_loopback_names_are_this_server(daemon: Daemon, host: str) -> None:
    assert get_models(daemon, host.format(port=daemon.port)).status_code == 200


def test_http_1_0_without_a_host_is_served(daemon: Daemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply


def test_the_openai_sdk_still_works(daemon: Daemon) -> None:
    sdk = openai.OpenAI(base_url=daemon.base_url, api_key="unused", max_retries=0)
    assert sdk.chat.completions.create(**CHAT).choices[0].finish_reason == "length"  # type: ignore[call-overload]


@pytest.mark.parametrize("host", ["llm.lan", "llm.lan:8000", "example.lan", "box.example.lan",
                                  "192.168.1.20:8000", "[fe80::1]"])
def test_allowed_hosts_and_ip_literals_on_a_wildcard_bind(lan: Daemon, host: str) -> None:
    assert get_models(lan, host).status_code == 200


@pytest.mark.parametrize("host", ["other.lan", "llm.lan.evil.example", "xexample.lan"])
def test_names_outside_allowed_hosts_stay_refused(lan: Daemon, host: str) -> None:
    assert_openai_error(get_models(lan, host), 403, "host_not_allowed")


@pytest.mark.parametrize(
    ("settings", "host", "allowed"),
    [
        (Settings(), "", True),  # HTTP/1.0: no Host header
        (Settings(), "[::1]", True),
        (Settings(), "::1", True),
        (Settings(), "10.0.0.5", False),
        (Settings(host="10.0.0.5"), "10.0.0.5:8000", True),
        (Settings(host="box.lan"), "BOX.LAN:8000", True),
        (Settings(host="::"), "[2001:db8::1]:8000", True),
        (Settings(host="::"), "evil.example", False),
        (Settings(allowed_hosts=("*",)), "anything.example", True),
        (Settings(allowed_hosts=(".lan",)), "a.b.lan", True),
        (Settings(allowed_hosts=(".lan",)), "alan", False),
        (Settings(allowed_hosts=("[FE80::1]", "Box.Lan.")), "[fe80::1]:8000", True),
        (Settings(allowed_hosts=("[FE80::1]", "Box.Lan.")), "box.lan", True),
    ],
)
def test_host_check(settings: Settings, host: str, allowed: bool) -> None:
    assert HostCheck(settings).allows(host) is allowed


# --- HEAD -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/ready", "/v1/models", "/stats", "/metrics"])
def test_head_answers_a_get_route_with_its_headers_and_no_body(daemon: Daemon, path: str) -> None:
    head = httpx.head(f"{daemon.url}{path}", timeout=10)
    got = httpx.get(f"{daemon.url}{path}", timeout=10)
    assert head.status_code == got.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if path in ("/health", "/v1/models"):  # the same body both times
        assert head.headers["content-length"] == str(len(got.content))


def test_every_get_route_also_answers_head() -> None:
    engine = FakeEngine()
    app = create_app(engine, Metrics(), Settings(), "m")
    for route in app.routes:
        methods = getattr(route, "methods", set())
        assert "GET" not in methods or "HEAD" in methods, route.path


# --- content parts --------------------------------------------------------------------------


def test_a_null_text_part_is_a_400_naming_the_text(daemon: Daemon) -> None:
    body = CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}
    response = httpx.post(f"{daemon.base_url}/chat/completions", json=body, timeout=30)
    error = assert_openai_error(response, 400, None)
    assert error["param"] == "messages[0].content[0].text" and "must be a string" in error["message"]
