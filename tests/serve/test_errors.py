"""kern_run.serve.errors: each error class's HTTP status and OpenAI body `type` (given as class keywords)."""

from __future__ import annotations

import pytest

from kern_run.serve.errors import (
    BadRequest, EngineFault, NotFound, Overloaded, ServeError, Unauthorized, Unavailable,
)


@pytest.mark.parametrize("cls, status, kind", [
    (ServeError, 400, "invalid_request_error"),
    (BadRequest, 400, "invalid_request_error"),
    (Unauthorized, 401, "authentication_error"),
    (NotFound, 404, "not_found_error"),
    (Overloaded, 429, "rate_limit_error"),
    (EngineFault, 500, "server_error"),
    (Unavailable, 503, "server_error"),
])
def test_status_and_kind_of_each_class(cls: type[ServeError], status: int, kind: str) -> None:
    err = cls("no", param="model", code="c")
    assert (cls.status, cls.kind, err.status, err.kind) == (status, kind, status, kind)
    assert err.body() == {"error": {"message": "no", "type": kind, "param": "model", "code": "c"}}


def test_an_instance_overrides_status_and_kind_without_touching_its_class() -> None:
    err = NotFound("gone", status=410, kind="gone_error")
    assert (err.status, err.kind) == (410, "gone_error")
    assert (NotFound.status, NotFound.kind) == (404, "not_found_error")
