"""What every console route shares: the route class (problem details), who is asking, and CSRF."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from baton.api.console.auth import COOKIE_NAME, CSRF_HEADER, ConsoleUser, check_csrf, origin_allowed
from baton.api.console.context import ConsoleContext, get_context
from baton.api.errors import problem_response, validation_error
from baton.core import errors

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def problem(exc: errors.BatonError, path: str, headers: dict[str, str] | None = None) -> Response:
    """Problem details for a console error."""
    out: Response = problem_response(exc, instance=path, headers=headers)
    return out


class ConsoleRoute(APIRoute):
    """Every error of a console route becomes problem details (words a person can read, never internals)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            path = request.url.path
            try:
                response: Response = await handler(request)
            except errors.BatonError as exc:
                if not isinstance(exc, errors.ClientError):
                    log.error("console error: %s %s (%s)", request.method, path, exc.code, exc_info=exc)
                headers = exc.extra.get("headers")
                return problem(exc, path, headers if isinstance(headers, dict) else None)
            except RequestValidationError as exc:
                err = validation_error(exc.errors())
                return problem(err, path)
            except (HTTPException, StarletteHTTPException) as exc:
                cls = {401: errors.AuthenticationError, 403: errors.PermissionDeniedError,
                       404: errors.NotFoundError}.get(exc.status_code, errors.ClientError)
                return problem(cls(exc.detail if isinstance(exc.detail, str) else None), path)
            response.headers.setdefault("Cache-Control", "no-store")
            return response

        return route


Ctx = Annotated[ConsoleContext, Depends(get_context)]


def _same_origin(request: Request, allowed: Sequence[str]) -> bool:
    """No ``Origin`` (not a browser's cross-site request), or this console's own scheme, host and port (or
    one of ``console.allowed_origins``), as for signing in."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin_allowed(origin, own=f"{request.url.scheme}://{request.headers.get('host', '')}", allowed=allowed)


def current_user(request: Request, ctx: Ctx) -> ConsoleUser:
    """The signed-in user. Mutating requests must also carry the session's CSRF token and, when the
    browser names an origin, come from this one."""
    user = ctx.sessions.resolve(request.cookies.get(COOKIE_NAME))
    if user is None:
        raise errors.AuthenticationError("Sign in to continue.")
    if request.method not in SAFE_METHODS:
        if not _same_origin(request, ctx.settings.console.allowed_origins):
            raise errors.PermissionDeniedError("Cross-site requests are not accepted.")
        check_csrf(user, request.headers.get(CSRF_HEADER))
    return user


User = Annotated[ConsoleUser, Depends(current_user)]


def tenant_user(user: User) -> ConsoleUser:
    if user.tenant_id is None:
        raise errors.PermissionDeniedError("This page belongs to a tenant; operators use the operator pages.")
    return user


def operator_user(user: User) -> ConsoleUser:
    if not user.is_operator:
        raise errors.PermissionDeniedError("Only platform operators may open this page.")
    return user


TenantUser = Annotated[ConsoleUser, Depends(tenant_user)]
OperatorUser = Annotated[ConsoleUser, Depends(operator_user)]
