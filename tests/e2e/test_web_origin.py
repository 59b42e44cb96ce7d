"""Localhost is not a web origin: POSTs must be JSON-typed, the Host must name this server.

The pure checks, and what only a real server shows: HTTP/1.0 without a Host, HEAD without a body.
What the app answers for every Host, Content-Type and route: tests/api/test_api_access.py and
tests/api/test_api_routes.py, around a fake engine.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from llmd.api.access import HostCheck, media_type
from llmd.config import Settings
from tests.helpers.daemon import Daemon

# --- Content-Type ---------------------------------------------------------------------------


def test_media_type_ignores_parameters_and_case() -> None:
    assert media_type("Application/JSON; charset=utf-8") == "application/json"
    assert media_type(None) == "" and media_type("text/plain") == "text/plain"


# --- Host -----------------------------------------------------------------------------------


def test_http_1_0_without_a_host_is_served(daemon: Daemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply


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


def test_head_answers_with_the_get_headers_and_no_body(daemon: Daemon) -> None:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"HEAD /v1/models HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    got = httpx.get(f"{daemon.base_url}/models", timeout=10)
    assert head.startswith(b"HTTP/1.1 200") and body == b"", reply
    assert f"content-length: {len(got.content)}".encode() in head.lower()
