"""Tenants: create, list, read, update, suspend/resume, delete (with their keys); model grants."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from sqlalchemy import select

from baton.control.audit import snapshot
from baton.control.slo import load_admission_table
from baton.core import models as m

from ._common import audit
from .deps import Admin, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import AdmissionPublic, ModelPublic, Page, TenantCreate, TenantPublic, TenantUpdate

router = APIRouter(prefix="/tenants", tags=["tenants"], route_class=ProblemRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantPublic)
def create_tenant(*, body: TenantCreate, ctx: Ctx, who: Admin, response: Response) -> TenantPublic:
    with ctx.db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=body.name, display_name=body.display_name, settings=body.settings))
        audit(uow, who, "tenant.create", "tenant", t.id, tenant_id=t.id, after=t)
        uow.commit()
        out = TenantPublic.model_validate(t)
    set_etag(response, out.version)
    response.headers["Location"] = f"tenants/{out.id}"
    return out


@router.get("", response_model=Page[TenantPublic])
def list_tenants(*,
    ctx: Ctx, who: Admin, paging: Paging,
    status_: Annotated[m.TenantStatus | None, Query(alias="status")] = None,
    name: Annotated[str | None, Query(max_length=64, description="Substring of the name.")] = None,
) -> Page[TenantPublic]:
    stmt = select(m.Tenant).order_by(m.Tenant.name)
    if status_ is not None:
        stmt = stmt.where(m.Tenant.status == status_)
    if name:
        stmt = stmt.where(m.Tenant.name.contains(name, autoescape=True))
    with ctx.db.system() as uow:
        rows, total = uow.tenants.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [TenantPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/{tenant_id}", response_model=TenantPublic)
def get_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> TenantPublic:
    with ctx.db.system() as uow:
        out = TenantPublic.model_validate(uow.tenants.require(tenant_id))
    set_etag(response, out.version)
    return out


def _update(*, ctx: Ctx, who: Admin, request: Request, tenant_id: uuid.UUID, body: TenantUpdate,
            action: str) -> TenantPublic:
    with ctx.db.system() as uow:
        t = uow.tenants.require(tenant_id)
        check_if_match(request, t.version)
        before = snapshot(t)
        changes = body.model_dump(exclude_unset=True, exclude_none=True)
        if "status" in changes:
            changes["status"] = m.TenantStatus(changes["status"])
        for k, v in changes.items():
            setattr(t, k, v)
        if changes:
            uow.flush()
            audit(uow, who, action, "tenant", t.id, tenant_id=t.id, before=before, after=t)
        uow.commit()
        out = TenantPublic.model_validate(t)
    if "status" in changes:
        ctx.invalidate("tenant", tenant_id)
    return out


@router.patch("/{tenant_id}", response_model=TenantPublic)
def update_tenant(*, tenant_id: uuid.UUID, body: TenantUpdate, ctx: Ctx, who: Admin, request: Request,
                  response: Response) -> TenantPublic:
    out = _update(ctx=ctx, who=who, request=request, tenant_id=tenant_id, body=body, action="tenant.update")
    set_etag(response, out.version)
    return out


@router.post("/{tenant_id}/suspend", response_model=TenantPublic)
def suspend_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request,
                   response: Response) -> TenantPublic:
    """Suspended tenants' keys stop working at once (every gateway is told)."""
    out = _update(ctx=ctx, who=who, request=request, tenant_id=tenant_id,
                  body=TenantUpdate(status="suspended"), action="tenant.suspend")
    set_etag(response, out.version)
    return out


@router.post("/{tenant_id}/resume", response_model=TenantPublic)
def resume_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request,
                  response: Response) -> TenantPublic:
    out = _update(ctx=ctx, who=who, request=request, tenant_id=tenant_id,
                  body=TenantUpdate(status="active"), action="tenant.resume")
    set_etag(response, out.version)
    return out


@router.delete("/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_tenant(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request) -> Response:
    """Deletes the tenant with its users, keys, grants, limits and usage."""
    with ctx.db.system() as uow:
        t = uow.tenants.require(tenant_id)
        check_if_match(request, t.version)
        keys = uow.api_keys.for_tenant(tenant_id, include_revoked=True)
        key_ids = [k.id for k in keys]
        before = {**(snapshot(t) or {}), "api_keys": [str(k) for k in key_ids]}
        uow.tenants.delete(t)
        audit(uow, who, "tenant.delete", "tenant", tenant_id, tenant_id=tenant_id, before=before)
        uow.commit()
    ctx.invalidate("tenant", tenant_id)
    for k in key_ids:
        ctx.invalidate("key", k)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- model grants -----------------------------------------------------------------------------------

@router.get("/{tenant_id}/models", response_model=list[ModelPublic])
def list_grants(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin) -> list[ModelPublic]:
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        return [ModelPublic.model_validate(r) for r in uow.models.for_tenant(tenant_id)]


@router.put("/{tenant_id}/models/{model_id}", status_code=status.HTTP_204_NO_CONTENT)
def grant_model(*, tenant_id: uuid.UUID, model_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    """Lets the tenant use the model (idempotent)."""
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        uow.models.require(model_id)
        if uow.tenant_models.get((tenant_id, model_id)) is None:
            uow.tenant_models.grant(tenant_id, model_id)
            audit(uow, who, "tenant_model.grant", "tenant_model", model_id, tenant_id=tenant_id,
                  after={"tenant_id": str(tenant_id), "model_id": str(model_id)})
        uow.commit()
    ctx.invalidate("tenant", tenant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete("/{tenant_id}/models/{model_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_model(*, tenant_id: uuid.UUID, model_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        if not uow.tenant_models.revoke(tenant_id, model_id):
            from baton.core.errors import NotFoundError

            raise NotFoundError("The tenant has no grant for this model.")
        audit(uow, who, "tenant_model.revoke", "tenant_model", model_id, tenant_id=tenant_id,
              before={"tenant_id": str(tenant_id), "model_id": str(model_id)})
        uow.commit()
    ctx.invalidate("tenant", tenant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{tenant_id}/admission", response_model=AdmissionPublic)
def tenant_admission(*,
    tenant_id: uuid.UUID, ctx: Ctx, who: Admin, model_id: Annotated[uuid.UUID | None, Query()] = None
) -> AdmissionPublic:
    """How the gateway admits this tenant's traffic (the SLO class in force, and when it is shed)."""
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        a = load_admission_table(uow).admission_for(tenant_id, model_id)
    return AdmissionPublic(slo_class=a.slo_class, priority=a.priority, sheddable=a.sheddable,
                           ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms, shed_threshold=a.shed_threshold)
