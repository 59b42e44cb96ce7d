"""Who may call: optional API keys (Bearer, compared in constant time) and CORS.

With no key configured every request is let in, as a local daemon on loopback expects;
with keys, every route but the open ones (`/health`, `/ready`, and `/metrics` unless
`protect_metrics`) needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import hmac

from litestar.config.cors import CORSConfig
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from llmd.config import Settings
from llmd.errors import Unauthorized

OPEN = "open"  # route handler opt: reachable without a key
METRICS = "metrics"  # route handler opt: open unless protect_metrics


class KeyCheck:
    """A Litestar guard that accepts a request carrying one of `keys`."""

    def __init__(self, keys: frozenset[str], protect_metrics: bool) -> None:
        self._keys = [key.encode() for key in sorted(keys)]
        self._protect_metrics = protect_metrics

    def __call__(self, connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        if not self._keys or handler.opt.get(OPEN):
            return
        if handler.opt.get(METRICS) and not self._protect_metrics:
            return
        header = connection.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized("You didn't provide an API key. Pass it as `Authorization: Bearer <key>` "
                               "(the openai SDKs' api_key).")
        if not self.accepts(presented.strip().encode()):
            raise Unauthorized("Incorrect API key provided.")

    def accepts(self, presented: bytes) -> bool:
        """Compare with every key, without stopping early, so timing says nothing about which."""
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        return matched


def cors_config(settings: Settings) -> CORSConfig | None:
    """CORS only for the configured origins; none by default (browsers get no access)."""
    if not settings.cors_origins:
        return None
    return CORSConfig(
        allow_origins=list(settings.cors_origins),
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type"],
        max_age=600,
    )
