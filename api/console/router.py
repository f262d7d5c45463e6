"""The console backend: ``/console/api`` (JSON for the front end in ``web/``).

Sign-up, sign-in and sessions live here; the tenant pages in :mod:`baton.api.console.tenant` and the
operator pages in :mod:`baton.api.console.operator` hang off the same router.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from baton.api.console import operator, operator_batches, operator_flow, operator_tenants, static, tenant
from baton.api.console.auth import COOKIE_NAME, Account, ConsoleUser, NewSession, check_origin
from baton.api.console.common import ConsoleRoute, Ctx, User
from baton.control.tenancy import SignUp as SignUpCommand
from baton.control.tenancy import TenantView
from baton.control.usecase import Actor
from baton.core import errors
from baton.core import models as m
from baton.core.passwords import hash_password

API_PREFIX = "/console/api"

api = APIRouter(prefix=API_PREFIX, route_class=ConsoleRoute)

_EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SignUp(_In):
    organisation: str = Field(min_length=1, max_length=200, description="Display name of the new tenant.")
    tenant_name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$", max_length=64,
                             description="The tenant's id: lower-case letters, digits and '-'.")
    email: str = Field(min_length=3, max_length=320)
    password: str = Field(min_length=1, max_length=256)


class SignIn(_In):
    email: str = Field(min_length=1, max_length=320)
    password: str = Field(min_length=1, max_length=256)


def _client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def tenant_json(t: TenantView) -> dict[str, Any]:
    return {"id": str(t.id), "name": t.name, "display_name": t.display_name}


def session_json(user: ConsoleUser, tenant: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "user": {"id": str(user.user_id), "email": user.email, "role": user.role.value},
        "tenant": tenant,
        "csrf_token": user.csrf_token,
    }


def _set_cookie(ctx: Ctx, response: Response, s: NewSession) -> None:
    response.set_cookie(
        COOKIE_NAME, s.token, max_age=int(ctx.sessions.ttl.total_seconds()), path="/", httponly=True,
        samesite="strict", secure=ctx.settings.security.secure_cookies,
    )


def _tenant(ctx: Ctx, user: ConsoleUser) -> dict[str, Any] | None:
    if user.tenant_id is None:
        return None
    return tenant_json(ctx.control.tenancy.get_tenant(user.tenant_id))


def same_origin(request: Request, ctx: Ctx) -> None:
    """Sign-in and sign-up come from the console's own pages (or ``console.allowed_origins``): a
    browser on another site cannot sign someone in (login CSRF), nor create organisations in their name."""
    check_origin(request.headers.get("origin"), own=f"{request.url.scheme}://{request.url.netloc}",
                 allowed=ctx.settings.console.allowed_origins)


SIGNUP_UNDER_REVIEW = ("Thank you. An operator reviews new organisations; once yours is approved you can sign in "
                       "with this email and password. If the email already has an account, sign in with it instead.")


@api.post("/signup", status_code=201, tags=["console: session"], dependencies=[Depends(same_origin)],
          responses={202: {"description": "``tenancy.signup_review``: the same answer whether or not the email "
                                          "is registered; an operator approves the organisation"}})
def sign_up(body: SignUp, ctx: Ctx, request: Request, response: Response) -> dict[str, Any]:
    """Creates a tenant and its first admin user, and signs them in. The organisation gets the models
    ``tenancy.default_models`` names; with none, it waits for an operator (a pending access request).

    A registered email is a 409 that counts against the sign-in throttle of the client's address (so that
    trying emails costs what guessing passwords does). With ``tenancy.signup_review``, every sign-up gets
    the same 202 and no session: whether the email was known is not said."""
    email = body.email.strip()
    if not _EMAIL.match(email):
        raise errors.ValidationError("Enter a valid email address.", param="email")
    ip = _client_ip(request)
    ctx.throttle.check(email, ip)
    review = ctx.settings.tenancy.signup_review
    try:
        done = ctx.control.tenancy.sign_up(
            Actor(f"console:{email}", (request.headers.get("x-request-id") or "")[:64] or None),
            SignUpCommand(organisation=body.organisation, tenant_name=body.tenant_name, email=email,
                          password_hash=hash_password(body.password)),
            review=review,
        )
    except errors.ConflictError as exc:
        if exc.param == "email":
            ctx.throttle.failed(email, ip)
        raise
    if review or done is None:
        response.status_code = 202
        return {"status": "pending_review", "detail": SIGNUP_UNDER_REVIEW}
    tenant = tenant_json(done.tenant)
    account = Account(id=done.user_id, email=done.email, role=m.UserRole(done.role), tenant_id=done.tenant.id)
    s = ctx.sessions.start(account)
    _set_cookie(ctx, response, s)
    return session_json(s.user, tenant)


@api.post("/login", tags=["console: session"], dependencies=[Depends(same_origin)])
def sign_in(body: SignIn, ctx: Ctx, request: Request, response: Response) -> dict[str, Any]:
    ip = _client_ip(request)
    ctx.throttle.check(body.email, ip)
    try:
        user = ctx.sessions.authenticate(body.email, body.password)
    except errors.AuthenticationError:
        ctx.throttle.failed(body.email, ip)
        raise
    ctx.throttle.succeeded(body.email, ip)
    s = ctx.sessions.start(user)
    _set_cookie(ctx, response, s)
    return session_json(s.user, _tenant(ctx, s.user))


@api.post("/logout", status_code=204, tags=["console: session"])
def sign_out(ctx: Ctx, user: User, request: Request) -> Response:
    ctx.sessions.end(request.cookies.get(COOKIE_NAME))
    out = Response(status_code=204)
    out.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict",
                      secure=ctx.settings.security.secure_cookies)
    return out


@api.get("/session", tags=["console: session"])
def current_session(ctx: Ctx, user: User) -> dict[str, Any]:
    return session_json(user, _tenant(ctx, user))


api.include_router(tenant.router)
api.include_router(operator.router)
api.include_router(operator_tenants.router)
api.include_router(operator_flow.router)
api.include_router(operator_batches.router)

#: What the API process mounts: the JSON API under ``/console/api`` and the front end under ``/console/``.
router = APIRouter()
router.include_router(api)
router.include_router(static.router)
