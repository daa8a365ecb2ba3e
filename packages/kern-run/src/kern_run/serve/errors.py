"""Errors of the server, each carrying the OpenAI error body it becomes (`{"error": {...}}`)."""

from __future__ import annotations

from typing import Any


class ServeError(Exception):
    """A refusal or fault answered with an OpenAI-style error body.

    `status`: the HTTP status; `kind`: the body's `type` (invalid_request_error, authentication_error,
    not_found_error, server_error, ...); `param`: the request field at fault (a JSON path such as
    `messages[1].content`) or None; `code`: a short machine-readable code or None."""

    status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status
        if kind is not None:
            self.kind = kind

    def __init_subclass__(cls, *, status: int | None = None, kind: str | None = None, **kwargs: Any) -> None:
        """`class X(ServeError, status=..., kind=...)`: the subclass's HTTP status and body `type`."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if kind is not None:
            cls.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class BadRequest(ServeError):
    """400: the request itself is wrong (a value out of range, a prompt longer than the context, ...)."""


class Unauthorized(ServeError, status=401, kind="authentication_error"):
    """401: a missing or wrong API key."""


class NotFound(ServeError, status=404, kind="not_found_error"):
    """404: the request names a model this server does not serve."""


class Overloaded(ServeError, status=429, kind="rate_limit_error"):
    """429: more requests in flight than `--max-queue`."""


class EngineFault(ServeError, status=500, kind="server_error"):
    """500: the engine failed the step this request was in (logged; /health turns unhealthy)."""


class Unavailable(ServeError, status=503, kind="server_error"):
    """503: the server is draining or unhealthy and takes no new requests."""


class ConfigError(ValueError):
    """A scheduler or server configuration value out of range (names the value and the allowed range)."""
