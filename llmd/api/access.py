"""Who may call: the Host must name this server, POSTs must be JSON, optional API keys, CORS.

Localhost is not a web origin. A web page can make a browser send requests to
`127.0.0.1:8000`; two rules keep it from using a keyless daemon:

- POST bodies must be `Content-Type: application/json`. A page may send text/plain, form and
  multipart bodies anywhere without asking (a "simple request", the CSRF hole); a JSON body
  needs a CORS preflight first, and `Cors` refuses those unless the origin is in `cors_origins`.
- The `Host` header must name this server (`HostCheck`). DNS rebinding points a page's own
  name at 127.0.0.1, so its requests become same-origin and their answers readable; they still
  carry the page's name in `Host`, which is how they are told apart.

With no key configured every request that passes these is let in, as a local daemon on
loopback expects; with keys, every route but the open ones (`/health`, `/ready`, and
`/metrics` unless `protect_metrics`) needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import hmac
import ipaddress

from litestar.connection import ASGIConnection
from litestar.datastructures import Headers, MutableScopeHeaders
from litestar.enums import ScopeType
from litestar.handlers.base import BaseRouteHandler
from litestar.middleware import ASGIMiddleware
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from llmd.config import Settings
from llmd.errors import CorsNotAllowed, HostNotAllowed, Unauthorized, UnsupportedMediaType

OPEN = "open"  # route handler opt: reachable without a key
METRICS = "metrics"  # route handler opt: open unless protect_metrics
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::"})
CORS_METHODS = ("GET", "HEAD", "OPTIONS", "POST")


def host_name(header: str) -> str:
    """The name in a Host header value: lowercased, without port, IPv6 brackets or final dot."""
    value = header.strip().lower()
    if value.startswith("["):
        name = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        name = value.partition(":")[0]
    else:  # a bare name, or an IPv6 address without brackets (invalid HTTP, but unambiguous)
        name = value
    return name.removesuffix(".")


def ip_literal(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`name` as an IP address, or None for a DNS name."""
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class HostCheck:
    """A Litestar guard against DNS rebinding: the `Host` header must name this server.

    This server's names: `localhost` and `*.localhost` (RFC 6761: they always resolve to
    loopback), loopback IPs, the bound `host`, any IP when bound to a wildcard address, and
    the `allowed_hosts` setting (exact names, `.suffix` for a name and all under it, `*`).
    A request without Host (HTTP/1.0) is let in: no browser sends one. It guards every
    route, `/health` too: probes use loopback names or IPs, which pass, and an exempt route
    would still tell a rebinding page that llmd runs here.
    """

    def __init__(self, settings: Settings) -> None:
        entries = [host_name(entry) for entry in settings.allowed_hosts]
        self._any = "*" in entries
        self._bound = host_name(settings.host)
        self._names = {self._bound, "localhost"} | {e for e in entries if not e.startswith(".")}
        self._suffixes = (".localhost", *(e for e in entries if e.startswith(".")))

    async def __call__(self, connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        header = connection.headers.get("host", "")
        if not self.allows(header):
            name = host_name(header)
            raise HostNotAllowed(
                f"`Host: {name}` does not name this server, so the request is refused (a page "
                f"could reach llmd through DNS rebinding this way). To serve clients that "
                f"reach llmd as `{name}`, add it to the `allowed_hosts` setting.")

    def allows(self, header: str) -> bool:
        """Whether a Host header value (its port ignored) names this server."""
        name = host_name(header)
        if not name or self._any or name in self._names:
            return True
        if name.endswith(self._suffixes) or f".{name}" in self._suffixes:
            return True
        ip = ip_literal(name)
        # Rebinding needs a DNS name the attacker controls: an IP literal cannot be rebound,
        # so on a wildcard bind every address of this machine (or a NAT in front) is fine.
        return ip is not None and (ip.is_loopback or self._bound in WILDCARD_ADDRESSES)


def media_type(header: str | None) -> str:
    """The media type of a Content-Type value, lowercased, without parameters like charset."""
    return (header or "").partition(";")[0].strip().lower()


async def require_json(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """A Litestar guard: every POST body is declared JSON, which a page cannot send unasked."""
    if connection.scope.get("method") != "POST":
        return
    header = connection.headers.get("content-type")
    if media_type(header) != "application/json":
        sent = f"`Content-Type: {header}`" if header else "no Content-Type"
        raise UnsupportedMediaType(f"POST bodies must be JSON sent with `Content-Type: application/json`; "
                                   f"this request has {sent}.")


class KeyCheck:
    """A Litestar guard that accepts a request carrying one of `keys`."""

    def __init__(self, keys: frozenset[str], protect_metrics: bool) -> None:
        self._keys = [key.encode() for key in sorted(keys)]
        self._protect_metrics = protect_metrics

    async def __call__(self, connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        # OPTIONS answers only which methods a route has (and browsers never send keys on
        # a preflight); refusing it would break CORS without protecting anything.
        if not self._keys or handler.opt.get(OPEN) or connection.scope.get("method") == "OPTIONS":
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


class Cors(ASGIMiddleware):
    """CORS for the `cors_origins` only (none by default); a refused preflight is a 403 in the OpenAI shape.

    Litestar's own CORS answers refusals in plain text; this one raises `CorsNotAllowed`
    and lets the renderer answer. It runs inside routing, so unknown paths stay 404.
    """

    scopes = (ScopeType.HTTP,)

    def __init__(self, origins: tuple[str, ...]) -> None:
        self._origins = frozenset(origins)

    def allows(self, origin: str) -> bool:
        """Whether pages from `origin` may call the API."""
        return origin in self._origins or "*" in self._origins

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        headers = Headers.from_scope(scope)
        origin = headers.get("origin")
        asks = scope.get("method") == "OPTIONS" and "access-control-request-method" in headers
        if origin is not None and asks:
            await self.preflight(origin, headers)(scope, receive, send)
        elif origin is not None and self.allows(origin):
            await next_app(scope, receive, allow_origin(send, origin))
        else:
            await next_app(scope, receive, send)

    def preflight(self, origin: str, headers: Headers) -> ASGIResponse:
        """204 with the grants for an allowed origin and method; raise `CorsNotAllowed` otherwise."""
        method = headers["access-control-request-method"].upper()
        if not self.allows(origin):
            raise CorsNotAllowed(f"Browser pages from `{origin}` may not call this server. To allow "
                                 "them, add the origin to the `cors_origins` setting.")
        if method not in CORS_METHODS:
            raise CorsNotAllowed(f"CORS preflight for `{method}`: this API answers only "
                                 f"{', '.join(CORS_METHODS)}.")
        # An origin in cors_origins is trusted with any request header (the openai JS SDK
        # sends several x-stainless-* ones); the key, not the header list, guards the API.
        requested = headers.get("access-control-request-headers") or "Authorization, Content-Type"
        return ASGIResponse(status_code=204, headers={
            "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": ", ".join(CORS_METHODS),
            "Access-Control-Allow-Headers": requested, "Access-Control-Max-Age": "600", "Vary": "Origin"})


def allow_origin(send: Send, origin: str) -> Send:
    """`send`, with every response start granting `origin` the right to read it."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableScopeHeaders.from_message(message)
            headers["Access-Control-Allow-Origin"] = origin
            headers.add("Vary", "Origin")
        await send(message)

    return wrapped
