"""The console's operator pages for tenants: the list, model grants, suspend and resume, and the access
requests (the queue of organisations waiting for a model, approve, decline), each organisation's users;
and the admin API's tokens.
Adapters over :class:`baton.control.tenancy.Tenancy`, acting as ``console:<email>``."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from baton.api.admin.schemas import AdminTokenCreate, AdminTokenIssued, RateLimitSet, UserCreate, UserUpdate
from baton.api.console.auth import ConsoleUser
from baton.api.console.common import ConsoleRoute, Ctx, OperatorUser
from baton.control.tenancy import (
    AccessRequestView,
    AdminTokenView,
    Limits,
    NewUser,
    RateLimitView,
    TenantView,
    UserChanges,
    UserView,
)
from baton.control.usecase import Actor
from baton.core import models as m
from baton.core.passwords import hash_password

router = APIRouter(prefix="/ops", tags=["console: operator"], route_class=ConsoleRoute)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ApproveAccess(_In):
    model_id: uuid.UUID | None = Field(
        None, description="The model to grant: required for a request for any model; else the requested one.")


class DeclineAccess(_In):
    reason: str | None = Field(None, max_length=1000, description="Shown to the organisation.")


def _actor(request: Request, user: ConsoleUser) -> Actor:
    return Actor(user.actor, (request.headers.get("x-request-id") or "")[:64] or None)


def _tenant_json(t: TenantView) -> dict[str, Any]:
    return {"id": str(t.id), "name": t.name, "display_name": t.display_name, "status": t.status,
            "settings": t.settings, "version": t.version, "created_at": t.created_at.isoformat(),
            "updated_at": t.updated_at.isoformat()}


def access_request_json(r: AccessRequestView) -> dict[str, Any]:
    return {
        "id": str(r.id), "tenant_id": str(r.tenant_id), "tenant_name": r.tenant_name,
        "tenant_display_name": r.tenant_display_name, "model_id": str(r.model_id) if r.model_id else None,
        "model": r.model, "note": r.note, "state": r.state, "requested_by": r.requested_by,
        "requested_at": r.requested_at.isoformat(),
        "resolved_at": r.resolved_at.isoformat() if r.resolved_at else None, "resolved_by": r.resolved_by,
        "reason": r.reason,
    }


@router.get("/tenants")
def list_tenants(ctx: Ctx, user: OperatorUser) -> list[dict[str, Any]]:
    return [{**_tenant_json(s.tenant), "models": list(s.models), "users": s.users,
             "pending_request_id": str(s.pending_request) if s.pending_request else None}
            for s in ctx.control.tenancy.summaries()]


@router.put("/tenants/{tenant_id}/models/{model_id}", status_code=204)
def grant_model(tenant_id: uuid.UUID, model_id: uuid.UUID, ctx: Ctx, request: Request,
                user: OperatorUser) -> Response:
    """Lets the tenant use the model (idempotent); answers its pending requests for it (or for any model)."""
    ctx.control.tenancy.grant_model(_actor(request, user), tenant_id, model_id)
    return Response(status_code=204)


@router.delete("/tenants/{tenant_id}/models/{model_id}", status_code=204)
def revoke_model(tenant_id: uuid.UUID, model_id: uuid.UUID, ctx: Ctx, request: Request,
                 user: OperatorUser) -> Response:
    ctx.control.tenancy.revoke_model(_actor(request, user), tenant_id, model_id)
    return Response(status_code=204)


@router.post("/tenants/{tenant_id}/suspend")
def suspend_tenant(tenant_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser) -> dict[str, Any]:
    return _tenant_json(ctx.control.tenancy.suspend(_actor(request, user), tenant_id))


@router.post("/tenants/{tenant_id}/resume")
def resume_tenant(tenant_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser) -> dict[str, Any]:
    return _tenant_json(ctx.control.tenancy.resume(_actor(request, user), tenant_id))


@router.get("/tenants/{tenant_id}/rate-limits", response_model=list[RateLimitView])
def list_rate_limits(tenant_id: uuid.UUID, ctx: Ctx, user: OperatorUser) -> list[RateLimitView]:
    """The tenant's limits: the tenant-wide one (``api_key_id`` null) and any per key."""
    return list(ctx.control.tenancy.list_rate_limits(tenant_id))


@router.put("/tenants/{tenant_id}/rate-limit", response_model=RateLimitView)
def set_rate_limit(tenant_id: uuid.UUID, body: RateLimitSet, ctx: Ctx, request: Request,
                   user: OperatorUser) -> RateLimitView:
    """Tenant-wide limits (a null field: no limit of that kind); every gateway applies them at once."""
    view = ctx.control.tenancy.set_rate_limit(_actor(request, user), tenant_id, Limits(**body.model_dump()))
    return view


@router.delete("/tenants/{tenant_id}/rate-limits/{limit_id}", status_code=204)
def delete_rate_limit(tenant_id: uuid.UUID, limit_id: uuid.UUID, ctx: Ctx, request: Request,
                      user: OperatorUser) -> Response:
    ctx.control.tenancy.delete_rate_limit(_actor(request, user), tenant_id, limit_id)
    return Response(status_code=204)


@router.get("/access-queue")
def access_queue(ctx: Ctx, user: OperatorUser) -> list[dict[str, Any]]:
    """Organisations waiting for their first model grant, oldest first, each with its pending request
    (``request``: null when it has not asked, e.g. one made through the admin API)."""
    return [{"tenant_id": str(w.tenant.id), "name": w.tenant.name, "display_name": w.tenant.display_name,
             "signed_up_at": w.tenant.created_at.isoformat(), "users": list(w.users),
             "request": access_request_json(w.request) if w.request else None}
            for w in ctx.control.tenancy.access_queue()]


@router.get("/access-requests")
def list_access_requests(
    ctx: Ctx, user: OperatorUser,
    state: Annotated[Literal["pending", "approved", "declined", "all"], Query()] = "pending",
    limit: Annotated[int, Query(ge=1, le=500)] = 200, offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> dict[str, Any]:
    """Access requests: pending ones oldest first (the queue), answered ones newest first."""
    page = ctx.control.tenancy.access_requests(state=None if state == "all" else m.AccessRequestState(state),
                                               limit=limit, offset=offset)
    return {"data": [access_request_json(r) for r in page.items], "count": page.total, "limit": page.limit,
            "offset": page.offset}


@router.post("/access-requests/{request_id}/approve")
def approve_access(request_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser,
                   body: ApproveAccess | None = None) -> dict[str, Any]:
    """Grants the model and answers the request (409 once it is answered)."""
    view = ctx.control.tenancy.approve_access(_actor(request, user), request_id,
                                              model_id=(body or ApproveAccess()).model_id)
    return access_request_json(view)


@router.post("/access-requests/{request_id}/decline")
def decline_access(request_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser,
                   body: DeclineAccess | None = None) -> dict[str, Any]:
    """Declines the request, with a reason the organisation sees (409 once it is answered)."""
    view = ctx.control.tenancy.decline_access(_actor(request, user), request_id,
                                              reason=(body or DeclineAccess()).reason)
    return access_request_json(view)


# --- an organisation's users ------------------------------------------------------------------------

@router.get("/tenants/{tenant_id}/users", response_model=list[UserView])
def list_users(tenant_id: uuid.UUID, ctx: Ctx, user: OperatorUser) -> list[UserView]:
    return list(ctx.control.tenancy.list_users(tenant_id))


@router.post("/tenants/{tenant_id}/users", status_code=201, response_model=UserView)
def create_user(tenant_id: uuid.UUID, body: UserCreate, ctx: Ctx, request: Request, user: OperatorUser) -> UserView:
    """A console user of the organisation (409 for an email already in use)."""
    new = NewUser(email=body.email, password_hash=hash_password(body.password), role=body.role)
    return ctx.control.tenancy.create_user(_actor(request, user), tenant_id, new)


@router.patch("/tenants/{tenant_id}/users/{user_id}", response_model=UserView)
def update_user(*, tenant_id: uuid.UUID, user_id: uuid.UUID, body: UserUpdate, ctx: Ctx, request: Request,
                user: OperatorUser) -> UserView:
    """Role, disabled (a disabled user's sessions stop at once), or a new password."""
    changes = UserChanges(role=body.role, disabled=body.disabled,
                          password_hash=hash_password(body.password) if body.password is not None else None)
    return ctx.control.tenancy.update_user(_actor(request, user), tenant_id, user_id, changes)


@router.delete("/tenants/{tenant_id}/users/{user_id}", status_code=204)
def delete_user(tenant_id: uuid.UUID, user_id: uuid.UUID, ctx: Ctx, request: Request,
                user: OperatorUser) -> Response:
    ctx.control.tenancy.delete_user(_actor(request, user), tenant_id, user_id)
    return Response(status_code=204)


# --- admin tokens -----------------------------------------------------------------------------------

@router.get("/admin-tokens", response_model=list[AdminTokenView])
def list_admin_tokens(ctx: Ctx, user: OperatorUser) -> list[AdminTokenView]:
    """The /admin/v1 bearer tokens, live and revoked (never their secrets: Baton keeps only hashes)."""
    return list(ctx.control.tenancy.list_admin_tokens())


@router.post("/admin-tokens", status_code=201, response_model=AdminTokenIssued)
def create_admin_token(body: AdminTokenCreate, ctx: Ctx, request: Request, user: OperatorUser) -> AdminTokenIssued:
    """A new /admin/v1 token; its secret is in this answer only."""
    issued = ctx.control.tenancy.create_admin_token(_actor(request, user), body.name)
    return AdminTokenIssued(token=(issued.token), secret=issued.secret)


@router.delete("/admin-tokens/{token_id}", status_code=204)
def revoke_admin_token(token_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser) -> Response:
    """Revokes a token at once (404 for an unknown one)."""
    ctx.control.tenancy.revoke_admin_token(_actor(request, user), token_id)
    return Response(status_code=204)
