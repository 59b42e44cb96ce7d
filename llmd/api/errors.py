"""One renderer: every error leaves as `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException

from llmd.errors import (
    InvalidRequest,
    LlmdError,
    MethodNotAllowed,
    PayloadTooLarge,
    RouteNotFound,
)
from llmd.protocol import ErrorDetail, ErrorResponse

log = logging.getLogger("llmd.api")


def error_body(error: LlmdError) -> ErrorResponse:
    """The OpenAI error object for `error`."""
    return ErrorResponse(ErrorDetail(error.message, error.error_type, error.param, error.code))


def render_llmd_error(request: Request, exc: LlmdError) -> Response[ErrorResponse]:
    """Our own typed errors, counted in llmd_errors_total by their code."""
    registry = request.app.state.get("metrics")
    if registry is not None:
        registry.observe_error(exc.code or exc.error_type)
    return Response(error_body(exc), status_code=exc.status, headers=exc.headers())


def render_http_exception(request: Request, exc: HTTPException) -> Response[ErrorResponse]:
    """Litestar's routing and body errors, in the OpenAI shape."""
    return render_llmd_error(request, translate_http_exception(request, exc))


def render_unexpected(request: Request, exc: Exception) -> Response[ErrorResponse]:
    """Anything else: log it, answer 500, keep serving."""
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return render_llmd_error(request, LlmdError(f"internal error: {type(exc).__name__}"))


def translate_http_exception(request: Request, exc: HTTPException) -> LlmdError:
    """Map a framework HTTP error to the matching llmd error."""
    path = request.url.path
    if exc.status_code == 404:
        return RouteNotFound(f"no route {request.method} {path}")
    if exc.status_code == 405:
        return MethodNotAllowed(f"{request.method} is not allowed on {path}")
    if exc.status_code == 413:
        return PayloadTooLarge("the request body is larger than this server accepts")
    return InvalidRequest(str(exc.detail))
