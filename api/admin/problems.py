"""RFC 9457 problem details for ``/admin/v1``, raised from inside the router itself.

:class:`ProblemRoute` is the admin router's route class: Baton errors, request validation errors and
HTTP exceptions raised by a route (or its dependencies) become ``application/problem+json`` there, so
the admin API answers the same way whatever app mounts it. Server errors never carry internal text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from baton.api.errors import PROBLEM_TYPE_PREFIX
from baton.core import errors

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = PROBLEM_TYPE_PREFIX  # one type namespace with the console's problems


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field(description="URI naming the kind of problem.")
    title: str = Field(description="Short summary of the kind of problem.")
    status: int = Field(description="HTTP status code.")
    detail: str | None = Field(None, description="What went wrong this time, for a human.")
    instance: str | None = Field(None, description="The request path.")
    code: str = Field(description="Stable machine-readable code.")
    param: str | None = Field(None, description="The offending field, where one is to blame.")
    errors: list[dict[str, Any]] | None = Field(None, description="Each invalid field (validation errors).")


def problem(
    status: int, code: str, title: str, detail: str | None = None, *, instance: str | None = None,
    param: str | None = None, errors_: list[dict[str, Any]] | None = None, headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = Problem(type=TYPE_BASE + code, title=title, status=status, detail=detail, instance=instance,
                   code=code, param=param, errors=errors_)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, media_type=PROBLEM_MEDIA_TYPE,
                        headers=headers)


def from_baton_error(exc: errors.BatonError, instance: str | None = None) -> JSONResponse:
    if exc.status >= 500:
        # Server errors: the class's title only, never the message (it may hold internal text).
        if not isinstance(exc, errors.UnavailableError | errors.UpstreamError):
            log.error("admin API server error: %s", exc.message)
        return problem(exc.status, exc.code, exc.title, exc.title, instance=instance)
    headers = {"WWW-Authenticate": 'Bearer realm="baton-admin"'} if exc.status == 401 else None
    return problem(exc.status, exc.code, exc.title, exc.message, instance=instance, param=exc.param,
                   headers=headers)


def from_validation_error(exc: RequestValidationError, instance: str | None = None) -> JSONResponse:
    # Only where and what: never echo the input back (it may be a secret).
    items = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
    first = items[0] if items else None
    param = ".".join(first["loc"][1:]) if first and len(first["loc"]) > 1 else None
    detail = f"{param}: {first['msg']}" if first and param else "The request is not valid."
    return problem(422, "invalid_request", "Invalid request", detail, instance=instance, param=param,
                   errors_=items)


def from_http_exception(exc: HTTPException, instance: str | None = None) -> JSONResponse:
    title = {401: "Authentication failed", 403: "Permission denied", 404: "Not found",
             405: "Method not allowed", 412: "Precondition failed", 428: "Precondition required"}.get(
        exc.status_code, "Error")
    detail = exc.detail if isinstance(exc.detail, str) else title
    return problem(exc.status_code, title.lower().replace(" ", "_"), title, detail, instance=instance,
                   headers=dict(exc.headers or {}) or None)


class ProblemRoute(APIRoute):
    """Turns every error of an admin route into problem details."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            path = request.url.path
            try:
                return await handler(request)
            except errors.BatonError as exc:
                return from_baton_error(exc, path)
            except RequestValidationError as exc:
                return from_validation_error(exc, path)
            except HTTPException as exc:
                return from_http_exception(exc, path)

        return route


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "content": {PROBLEM_MEDIA_TYPE: {}}, "description": desc}
    for code, desc in (
        (400, "Invalid value"), (401, "Missing or invalid admin credentials"),
        (403, "Credentials that are not admin credentials (e.g. a tenant API key)"), (404, "Not found"),
        (409, "Conflict"), (412, "If-Match does not match the current ETag"), (422, "Invalid request"),
        (503, "A dependency is unavailable"),
    )
}
