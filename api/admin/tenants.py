"""Tenants: create, list, read, update, suspend/resume, delete (with their keys); model grants; how the
gateway admits a tenant. Adapters over :class:`baton.control.tenancy.Tenancy`."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response, status

from baton.control.catalogue import ModelView
from baton.control.policies import AdmissionView
from baton.control.tenancy import NewTenant, TenantChanges, TenantView
from baton.core import models as m

from ._common import actor
from .deps import Admin, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import Page, TenantCreate, TenantUpdate

router = APIRouter(prefix="/tenants", tags=["tenants"], route_class=ProblemRoute)


def _etagged(response: Response, t: TenantView) -> TenantView:
    set_etag(response, t.version)
    return t


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantView)
def create_tenant(*, body: TenantCreate, ctx: Ctx, who: Admin, response: Response) -> TenantView:
    t = ctx.control.tenancy.create_tenant(actor(who), NewTenant(body.name, body.display_name, body.settings))
    response.headers["Location"] = f"tenants/{t.id}"
    return _etagged(response, t)


@router.get("", response_model=Page[TenantView])
def list_tenants(*,
    ctx: Ctx, who: Admin, paging: Paging,
    status_: Annotated[m.TenantStatus | None, Query(alias="status")] = None,
    name: Annotated[str | None, Query(max_length=64, description="Substring of the name.")] = None,
) -> Page[TenantView]:
    page = ctx.control.tenancy.list_tenants(status=status_, name_contains=name, limit=paging.limit,
                                            offset=paging.offset)
    return Page(data=list(page.items), count=page.total, limit=page.limit, offset=page.offset)


@router.get("/{tenant_id}", response_model=TenantView)
def get_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> TenantView:
    return _etagged(response, ctx.control.tenancy.get_tenant(tenant_id))


@router.patch("/{tenant_id}", response_model=TenantView)
def update_tenant(*, tenant_id: uuid.UUID, body: TenantUpdate, ctx: Ctx, who: Admin, request: Request,
                  response: Response) -> TenantView:
    changes = TenantChanges(**body.model_dump(exclude_unset=True, exclude_none=True))
    t = ctx.control.tenancy.update_tenant(actor(who), tenant_id, changes,
                                          expect=lambda v: check_if_match(request, v))
    return _etagged(response, t)


@router.post("/{tenant_id}/suspend", response_model=TenantView)
def suspend_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request,
                   response: Response) -> TenantView:
    """Suspended tenants' keys stop working at once (every gateway is told)."""
    return _etagged(response, ctx.control.tenancy.suspend(actor(who), tenant_id,
                                                          expect=lambda v: check_if_match(request, v)))


@router.post("/{tenant_id}/resume", response_model=TenantView)
def resume_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request,
                  response: Response) -> TenantView:
    return _etagged(response, ctx.control.tenancy.resume(actor(who), tenant_id,
                                                         expect=lambda v: check_if_match(request, v)))


@router.delete("/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request,
                  force: Annotated[bool, Query(description="Delete even though it has live API keys (409 "
                                                           "without).")] = False) -> Response:
    """Deletes the tenant with its users, keys, grants, limits and usage. A tenant with live API keys needs
    ``force=true``."""
    ctx.control.tenancy.delete_tenant(actor(who), tenant_id, expect=lambda v: check_if_match(request, v),
                                      force=force)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- model grants -----------------------------------------------------------------------------------

@router.get("/{tenant_id}/models", response_model=list[ModelView])
def list_grants(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin) -> list[ModelView]:
    return list(ctx.control.tenancy.list_grants(tenant_id))


ModelRef = Annotated[str, Path(max_length=128, description="The model's id or its name.")]


@router.put("/{tenant_id}/models/{model}", status_code=status.HTTP_204_NO_CONTENT)
def grant_model(*, tenant_id: uuid.UUID, model: ModelRef, ctx: Ctx, who: Admin) -> Response:
    """Lets the tenant use the model (idempotent); answers its pending access requests for it."""
    tenancy = ctx.control.tenancy
    tenancy.grant_model(actor(who), tenant_id, tenancy.model_id(model))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete("/{tenant_id}/models/{model}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_model(*, tenant_id: uuid.UUID, model: ModelRef, ctx: Ctx, who: Admin) -> Response:
    tenancy = ctx.control.tenancy
    tenancy.revoke_model(actor(who), tenant_id, tenancy.model_id(model))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{tenant_id}/admission", response_model=AdmissionView)
def tenant_admission(*,
    tenant_id: uuid.UUID, ctx: Ctx, who: Admin, model_id: Annotated[uuid.UUID | None, Query()] = None
) -> AdmissionView:
    """How the gateway admits this tenant's traffic (the SLO class in force, and when it is shed)."""
    return ctx.control.slo.admission(tenant_id, model_id)
