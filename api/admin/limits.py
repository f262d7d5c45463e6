"""Rate limits for a whole tenant or for one of its keys (requests/min, tokens/min, concurrency)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from baton.control.audit import snapshot
from baton.core import errors

from ._common import audit
from .deps import Admin, Ctx
from .problems import ProblemRoute
from .schemas import RateLimitPublic, RateLimitSet

router = APIRouter(prefix="/tenants/{tenant_id}", tags=["rate limits"], route_class=ProblemRoute)


def _set(ctx: Ctx, who: Admin, tenant_id: uuid.UUID, key_id: uuid.UUID | None, body: RateLimitSet) -> RateLimitPublic:
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        if key_id is not None:
            key = uow.api_keys.get(key_id)
            if key is None or key.tenant_id != tenant_id:
                raise errors.NotFoundError(f"No API key with id {key_id}.")
        existing = [r for r in uow.rate_limits.for_tenant(tenant_id) if r.api_key_id == key_id]
        before = snapshot(existing[0]) if existing else None
        row = uow.rate_limits.upsert(tenant_id, key_id, **body.model_dump())
        audit(uow, who, "rate_limit.set", "rate_limit", row.id, tenant_id=tenant_id, before=before, after=row)
        uow.commit()
        out = RateLimitPublic.model_validate(row)
    ctx.invalidate("tenant", tenant_id)
    return out


@router.put("/rate-limit", response_model=RateLimitPublic)
def set_tenant_limit(*, tenant_id: uuid.UUID, body: RateLimitSet, ctx: Ctx, who: Admin) -> RateLimitPublic:
    """Tenant-wide limits (a null field means no limit of that kind)."""
    return _set(ctx, who, tenant_id, None, body)


@router.put("/keys/{key_id}/rate-limit", response_model=RateLimitPublic)
def set_key_limit(
    *, tenant_id: uuid.UUID, key_id: uuid.UUID, body: RateLimitSet, ctx: Ctx, who: Admin
) -> RateLimitPublic:
    """Limits for one key, on top of the tenant's."""
    return _set(ctx, who, tenant_id, key_id, body)


@router.get("/rate-limits", response_model=list[RateLimitPublic])
def list_limits(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin) -> list[RateLimitPublic]:
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        return [RateLimitPublic.model_validate(r) for r in uow.rate_limits.for_tenant(tenant_id)]


@router.delete("/rate-limits/{limit_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_limit(*, tenant_id: uuid.UUID, limit_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    with ctx.db.system() as uow:
        row = uow.rate_limits.get(limit_id)
        if row is None or row.tenant_id != tenant_id:
            raise errors.NotFoundError(f"No rate limit with id {limit_id}.")
        before = snapshot(row)
        uow.rate_limits.delete(row)
        audit(uow, who, "rate_limit.delete", "rate_limit", limit_id, tenant_id=tenant_id, before=before)
        uow.commit()
    ctx.invalidate("tenant", tenant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
