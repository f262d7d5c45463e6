"""One error hierarchy for Baton.

Client errors (4xx) say what the caller did wrong in words the caller can act on; server errors (5xx)
never carry internal text. The API layers map these to HTTP in one place each (OpenAI error shape on
``/v1``, problem details on ``/admin/v1``).
"""

from __future__ import annotations

from typing import Any, ClassVar


class BatonError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, message: str | None = None, *, param: str | None = None, **extra: Any) -> None:
        self.message = message or self.title
        self.param = param
        self.extra = extra
        super().__init__(self.message)


class ClientError(BatonError):
    status = 400
    code = "invalid_request"
    title = "Invalid request"


class ValidationError(ClientError):
    status = 400
    code = "invalid_value"
    title = "Invalid value"


class NotFoundError(ClientError):
    status = 404
    code = "not_found"
    title = "Not found"


class ConflictError(ClientError):
    status = 409
    code = "conflict"
    title = "Conflict"


class PreconditionFailedError(ClientError):
    status = 412
    code = "precondition_failed"
    title = "Precondition failed"


class AuthenticationError(ClientError):
    status = 401
    code = "invalid_api_key"
    title = "Authentication failed"


class PermissionDeniedError(ClientError):
    status = 403
    code = "permission_denied"
    title = "Permission denied"


class RateLimitedError(ClientError):
    status = 429
    code = "rate_limit_exceeded"
    title = "Rate limit exceeded"


class ServerError(BatonError):
    status = 500
    code = "internal_error"
    title = "Internal error"


class ConfigurationError(ServerError):
    code = "configuration_error"
    title = "Configuration error"


class UnavailableError(ServerError):
    status = 503
    code = "service_unavailable"
    title = "Service unavailable"


class KeySecretMismatchError(ConfigurationError):
    """The process's key secret is not the one the live API keys were made with: it can neither mint a key
    that a gateway would accept nor check one. The message (for the operator and the log) names the
    secrets' fingerprints; a client reads the title."""

    status = 503
    code = "key_secret_mismatch"
    title = ("API keys cannot be made or checked here right now: this process is misconfigured (its log "
             "says why).")


class UpstreamError(ServerError):
    status = 502
    code = "upstream_error"
    title = "Upstream error"
