"""One renderer: every error leaves as `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap

from llmd.errors import (
    InvalidRequest,
    LlmdError,
    MethodNotAllowed,
    PayloadTooLarge,
    RouteNotFound,
)
from llmd.protocol import ErrorDetail, ErrorResponse

log = logging.getLogger("llmd.api")

# Told the code (or type) of each error response and in-stream error: `Metrics.observe_error`.
ErrorCounter = Callable[[str], None]


def error_body(error: LlmdError) -> ErrorResponse:
    """The OpenAI error object for `error`."""
    return ErrorResponse(ErrorDetail(error.message, error.error_type, error.param, error.code))


class ErrorRenderer:
    """The app's exception handlers; each error response is counted by its code (or type)."""

    def __init__(self, count_error: ErrorCounter) -> None:
        self._count = count_error

    def handlers(self) -> ExceptionHandlersMap:
        """Litestar's `exception_handlers`: our typed errors, framework HTTP errors, anything else."""
        return {LlmdError: self.llmd_error, HTTPException: self.http_exception, Exception: self.unexpected}

    def llmd_error(self, request: Request, exc: LlmdError) -> Response[ErrorResponse]:
        """Our own typed errors, counted in llmd_errors_total by their code."""
        self._count(exc.code or exc.error_type)
        return Response(error_body(exc), status_code=exc.status, headers=exc.headers())

    def http_exception(self, request: Request, exc: HTTPException) -> Response[ErrorResponse]:
        """Litestar's routing and body errors, in the OpenAI shape."""
        return self.llmd_error(request, translate_http_exception(request, exc))

    def unexpected(self, request: Request, exc: Exception) -> Response[ErrorResponse]:
        """Anything else: log it, answer 500, keep serving."""
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return self.llmd_error(request, LlmdError(f"internal error: {type(exc).__name__}"))


def translate_http_exception(request: Request, exc: HTTPException) -> LlmdError:
    """Map a framework HTTP error to the matching llmd error."""
    path = request.url.path
    if exc.status_code == 404:
        return RouteNotFound(f"no route {request.method} {path}")
    if exc.status_code == 405:
        return MethodNotAllowed(f"{request.method} is not allowed on {path}")
    if exc.status_code == 413:
        return PayloadTooLarge("the request body is larger than this server accepts")
    extra = exc.extra if isinstance(exc.extra, list) else []
    problems = [problem for problem in extra if isinstance(problem, dict) and "key" in problem]
    if problems:  # a query or path parameter that failed validation: name it
        first = problems[0]
        return InvalidRequest(f"invalid value for `{first['key']}`: {first.get('message', 'invalid')}",
                              param=str(first["key"]))
    return InvalidRequest(str(exc.detail))
