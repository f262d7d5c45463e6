"""What admin routes depend on: the wiring (:class:`AdminContext`), the admin principal, ETags, paging.

The app's lifespan puts its composition root on ``app.state.services``
(:class:`baton.api.composition.AppServices`); tests may put an :class:`AdminContext` on ``app.state.admin``.
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from baton.control.keys import KeyService
from baton.control.services import ControlPlane
from baton.core import errors
from baton.core.contracts import InvalidationKind
from baton.core.db import Database
from baton.core.secrets import ADMIN_PREFIX, KEY_PREFIX, hash_secret
from baton.core.settings import Settings

if TYPE_CHECKING:
    from baton.api.composition import AppServices


@dataclass
class AdminContext:
    """What the admin routes use: the process's :class:`~baton.control.services.ControlPlane`."""

    settings: Settings
    db: Database
    control: ControlPlane
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, services: AppServices) -> AdminContext:
        return cls(settings=services.settings, db=services.db, control=services.control)

    @property
    def keys(self) -> KeyService:
        return self.control.keys

    def trigger_reconcile(self, reason: str) -> None:
        self.control.notify.reconcile(reason)

    def invalidate(self, kind: InvalidationKind, id_: uuid.UUID | None) -> None:
        self.control.notify.invalidate(kind, id_)


def get_context(request: Request) -> AdminContext:
    """``app.state.admin``, else the one made from ``app.state.services`` (the lifespan's composition root)."""
    state = request.app.state
    ctx = getattr(state, "admin", None)
    if ctx is None:
        services = getattr(state, "services", None)
        if services is None:
            raise errors.ConfigurationError("The admin API is not wired (app.state.services).")
        ctx = AdminContext.of(services)
        state.admin = ctx
    assert isinstance(ctx, AdminContext)
    return ctx


Ctx = Annotated[AdminContext, Depends(get_context)]


@dataclass(frozen=True, slots=True)
class AdminPrincipal:
    actor: str
    request_id: str | None = None


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


_bearer_scheme = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                            description="An admin token (bt_admin_...) or the bootstrap security.admin_token.")


def require_admin(
    request: Request, ctx: Ctx,
    _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer_scheme)] = None,
) -> AdminPrincipal:
    """Admin tokens (``bt_admin_...`` in ``admin_tokens``, or the bootstrap ``security.admin_token``).

    No or unknown credentials: 401. A tenant's API key, valid or not: 403 (it can never open this API).
    """
    token = _bearer(request)
    rid = (request.headers.get("x-request-id") or "")[:64] or None
    if token is None:
        raise errors.AuthenticationError("Admin credentials are required (Authorization: Bearer <admin token>).")
    secret = ctx.settings.security.key_secret.get_secret_value()
    digest = hash_secret(secret, token)
    boot = ctx.settings.security.admin_token
    if boot is not None and hmac.compare_digest(digest, hash_secret(secret, boot.get_secret_value())):
        return AdminPrincipal(actor="admin:bootstrap", request_id=rid)
    if token.startswith(ADMIN_PREFIX):
        with ctx.db.system() as uow:
            row = uow.admin_tokens.by_hash(digest)
            if row is not None:
                return AdminPrincipal(actor=f"admin:{row.name}", request_id=rid)
    if token.startswith(KEY_PREFIX):
        raise errors.PermissionDeniedError("Tenant API keys cannot use the admin API.")
    raise errors.AuthenticationError("Invalid admin credentials.")


Admin = Annotated[AdminPrincipal, Depends(require_admin)]


# --- ETags ------------------------------------------------------------------------------------------

def etag(version: int) -> str:
    return f'"{version}"'


def set_etag(response: Response, version: int) -> None:
    response.headers["ETag"] = etag(version)


def check_if_match(request: Request, version: int) -> None:
    """Honours ``If-Match`` (a list of ETags or ``*``): 412 when none is the row's current one."""
    header = request.headers.get("if-match")
    if header is None:
        return
    tags = [t.strip().removeprefix("W/") for t in header.split(",") if t.strip()]
    if "*" in tags or etag(version) in tags:
        return
    raise errors.PreconditionFailedError(
        f"The resource has changed (its ETag is now {etag(version)}); read it again and retry."
    )


# --- paging -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PageParams:
    limit: int
    offset: int


def page_params(
    limit: Annotated[int, Query(ge=1, le=500, description="Items per page.")] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="Items to skip.")] = 0,
) -> PageParams:
    return PageParams(limit=limit, offset=offset)


Paging = Annotated[PageParams, Depends(page_params)]
