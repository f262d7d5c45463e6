"""Rate limits for a whole tenant or for one of its keys (requests/min, tokens/min, concurrency).
Adapters over :class:`baton.control.tenancy.Tenancy`."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from baton.control.tenancy import Limits, RateLimitView

from ._common import actor
from .deps import Admin, Ctx
from .problems import ProblemRoute
from .schemas import RateLimitSet

router = APIRouter(prefix="/tenants/{tenant_id}", tags=["rate limits"], route_class=ProblemRoute)


@router.put("/rate-limit", response_model=RateLimitView)
def set_tenant_limit(*, tenant_id: uuid.UUID, body: RateLimitSet, ctx: Ctx, who: Admin) -> RateLimitView:
    """Tenant-wide limits (a null field means no limit of that kind)."""
    return ctx.control.tenancy.set_rate_limit(actor(who), tenant_id, Limits(**body.model_dump()))


@router.put("/keys/{key_id}/rate-limit", response_model=RateLimitView)
def set_key_limit(
    *, tenant_id: uuid.UUID, key_id: uuid.UUID, body: RateLimitSet, ctx: Ctx, who: Admin
) -> RateLimitView:
    """Limits for one key, on top of the tenant's."""
    return ctx.control.tenancy.set_rate_limit(actor(who), tenant_id, Limits(**body.model_dump()),
                                              key_id=key_id)


@router.get("/rate-limits", response_model=list[RateLimitView])
def list_limits(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin) -> list[RateLimitView]:
    return list(ctx.control.tenancy.list_rate_limits(tenant_id))


@router.delete("/rate-limits/{limit_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_limit(*, tenant_id: uuid.UUID, limit_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    ctx.control.tenancy.delete_rate_limit(actor(who), tenant_id, limit_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
