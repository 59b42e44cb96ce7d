"""Route decorators the API's handlers share."""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, route
from litestar.handlers import HTTPRouteHandler


def get(path: str, **kwargs: Any) -> HTTPRouteHandler:
    """Litestar's `get` that answers HEAD too: the GET's status and headers, no body.

    Litestar routes HEAD only to handlers that declare it; the ASGI server drops the body.
    """
    return route(path, http_method=[HttpMethod.GET, HttpMethod.HEAD], **kwargs)
