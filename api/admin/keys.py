"""API keys issued on behalf of a tenant (:class:`baton.control.keys.KeyService`), and the admin tokens
that open this API (:class:`baton.control.tenancy.Tenancy`)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from baton.control.keys import ApiKeyView, IssuedKey
from baton.control.tenancy import AdminTokenView

from ._common import actor
from .deps import Admin, Ctx
from .problems import ProblemRoute
from .schemas import AdminTokenCreate, AdminTokenIssued, KeyCreate, KeyIssued, KeyPublic, KeyRotate

router = APIRouter(tags=["api keys"], route_class=ProblemRoute)


def _public(view: ApiKeyView) -> KeyPublic:
    return KeyPublic(
        id=view.id, tenant_id=view.tenant_id, name=view.name, prefix=view.prefix, model_scope=list(view.model_scope),
        expires_at=view.expires_at, revoked_at=view.revoked_at, rotated_to_id=view.rotated_to_id,
        created_by=view.created_by, created_at=view.created_at, last_used_at=view.last_used_at, state=view.state(),
    )


def _issued(issued: IssuedKey) -> KeyIssued:
    return KeyIssued(key=_public(issued.key), secret=issued.secret)


@router.post("/tenants/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, response_model=KeyIssued)
def issue_key(*, tenant_id: uuid.UUID, body: KeyCreate, ctx: Ctx, who: Admin) -> KeyIssued:
    """Issues a key for the tenant. The secret is in this response only."""
    return _issued(ctx.keys.issue(tenant_id=tenant_id, name=body.name, created_by=who.actor,
                                  model_scope=body.model_scope, expires_at=body.expires_at))


@router.get("/tenants/{tenant_id}/keys", response_model=list[KeyPublic])
def list_keys(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin,
              include_revoked: Annotated[bool, Query()] = False) -> list[KeyPublic]:
    return [_public(v) for v in ctx.keys.list(tenant_id=tenant_id, include_revoked=include_revoked)]


@router.get("/tenants/{tenant_id}/keys/{key_id}", response_model=KeyPublic)
def get_key(*, tenant_id: uuid.UUID, key_id: uuid.UUID, ctx: Ctx, who: Admin) -> KeyPublic:
    return _public(ctx.keys.get(tenant_id=tenant_id, key_id=key_id))


@router.post("/tenants/{tenant_id}/keys/{key_id}/revoke", response_model=KeyPublic)
def revoke_key(*, tenant_id: uuid.UUID, key_id: uuid.UUID, ctx: Ctx, who: Admin) -> KeyPublic:
    return _public(ctx.keys.revoke(tenant_id=tenant_id, key_id=key_id, actor=who.actor))


@router.post("/tenants/{tenant_id}/keys/{key_id}/rotate", response_model=KeyIssued)
def rotate_key(*, tenant_id: uuid.UUID, key_id: uuid.UUID, ctx: Ctx, who: Admin,
               body: KeyRotate | None = None) -> KeyIssued:
    """A successor key; the old one keeps working for ``overlap_s`` seconds."""
    overlap = dt.timedelta(seconds=(body or KeyRotate()).overlap_s)
    return _issued(ctx.keys.rotate(tenant_id=tenant_id, key_id=key_id, actor=who.actor, overlap=overlap))


# --- admin tokens -----------------------------------------------------------------------------------

@router.post("/admin-tokens", status_code=status.HTTP_201_CREATED, response_model=AdminTokenIssued,
             tags=["admin tokens"])
def create_admin_token(*, body: AdminTokenCreate, ctx: Ctx, who: Admin) -> AdminTokenIssued:
    issued = ctx.control.tenancy.create_admin_token(actor(who), body.name)
    return AdminTokenIssued(token=issued.token, secret=issued.secret)


@router.get("/admin-tokens", response_model=list[AdminTokenView], tags=["admin tokens"])
def list_admin_tokens(*, ctx: Ctx, who: Admin) -> list[AdminTokenView]:
    return list(ctx.control.tenancy.list_admin_tokens())


@router.delete("/admin-tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT, tags=["admin tokens"])
def revoke_admin_token(*, token_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    ctx.control.tenancy.revoke_admin_token(actor(who), token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
