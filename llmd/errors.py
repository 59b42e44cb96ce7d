"""One exception hierarchy. Each error knows its HTTP status and its OpenAI error type.

The API layer renders any `LlmdError` as `{"error": {message, type, param, code}}`; the CLI
turns a `ConfigError`, `PreflightRefusal` or `DeviceUnavailable` into a documented exit code.
"""

from __future__ import annotations

# Exit codes the CLI and the systemd unit agree on: a restart cannot fix these.
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h
EXIT_PREFLIGHT = 77
EXIT_DEVICE_UNAVAILABLE = 69  # EX_UNAVAILABLE: the GPU is not up yet; a later restart may work


class LlmdError(Exception):
    """Base of every error llmd raises on purpose."""

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        """Extra response headers this error asks for."""
        return {}


class InvalidRequest(LlmdError):
    """The request is malformed or asks for something out of range (400)."""

    status = 400
    error_type = "invalid_request_error"


class UnsupportedParameter(InvalidRequest):
    """An OpenAI field llmd does not implement: refused, never silently ignored."""

    code = "unsupported_parameter"


class ContextLengthExceeded(InvalidRequest):
    """Prompt plus requested completion does not fit the context window."""

    code = "context_length_exceeded"


class Unauthorized(LlmdError):
    """No API key or a wrong one (401), as OpenAI answers it."""

    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(LlmdError):
    """Refused whatever the key: this request may not come from where it comes from (403)."""

    status = 403
    error_type = "invalid_request_error"


class HostNotAllowed(Forbidden):
    """The `Host` header names some other server: a DNS-rebinding page, or a name not in `allowed_hosts`."""

    code = "host_not_allowed"


class CorsNotAllowed(Forbidden):
    """A browser preflight from an origin, or for a method or header, that `cors_origins` does not allow."""

    code = "cors_not_allowed"


class ModelNotFound(LlmdError):
    """The request names a model this daemon does not serve (404)."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ResponseNotFound(LlmdError):
    """No stored response has this id (404): never stored, deleted, or past the store's bounds."""

    status = 404
    error_type = "invalid_request_error"


class RouteNotFound(LlmdError):
    """No such endpoint (404)."""

    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(LlmdError):
    """The endpoint exists but not for this HTTP method (405)."""

    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(LlmdError):
    """The request body exceeds the configured limit (413)."""

    status = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaType(LlmdError):
    """A POST body not declared as JSON (415): what a web page can send without asking first."""

    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_media_type"


class RequestTimeout(LlmdError):
    """The request head or body did not arrive in time; the connection closes (408)."""

    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class HeaderTooLarge(LlmdError):
    """The request line and headers exceed the configured limit; the connection closes (431)."""

    status = 431
    error_type = "invalid_request_error"
    code = "request_header_too_large"


class Overloaded(LlmdError):
    """The admission queue is full or the engine is not ready (503 + Retry-After)."""

    status = 503
    error_type = "server_error"

    def __init__(self, message: str, *, retry_after: int, code: str = "overloaded") -> None:
        super().__init__(message, code=code)
        self.retry_after = max(1, min(120, retry_after))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ShuttingDown(Overloaded):
    """The daemon is draining or stopping: a new request is refused, a running one cut (503)."""

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message, retry_after=retry_after, code="shutting_down")


class ClientDisconnected(LlmdError):
    """The client left before its completion was ready; nobody reads this (499, nginx's code)."""

    status = 499
    error_type = "invalid_request_error"
    code = "client_disconnected"


class EngineFailure(LlmdError):
    """Generation failed inside the engine (500); the daemon keeps serving."""

    status = 500
    error_type = "server_error"
    code = "engine_error"


class PreflightRefusal(LlmdError):
    """The model would not fit, or did not land where the profile says: refuse to serve."""

    status = 503
    code = "preflight_refused"


class DeviceUnavailable(PreflightRefusal):
    """The profile's device is missing right now (driver not loaded yet): retry later, never fall back."""

    code = "device_unavailable"


class ConfigError(LlmdError):
    """Settings or a profile are invalid; names the file, the key and a fix."""

    code = "config_error"


class StoreError(ConfigError):
    """The stored-responses database cannot be used: not an llmd store, another schema, or unreadable.

    Never repaired by deleting it: the message names the file so its owner can move it aside.
    """

    code = "response_store_error"
