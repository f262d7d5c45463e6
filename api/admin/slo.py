"""SLO policies and their assignment to tenants, models, or a tenant on one model."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status
from sqlalchemy import select

from baton.control.audit import snapshot
from baton.core import models as m

from ._common import audit
from .deps import Admin, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import Page, SloAssignmentCreate, SloAssignmentPublic, SloPolicyCreate, SloPolicyPublic, SloPolicyUpdate

router = APIRouter(tags=["slo"], route_class=ProblemRoute)


@router.post("/slo-policies", status_code=status.HTTP_201_CREATED, response_model=SloPolicyPublic)
def create_policy(*, body: SloPolicyCreate, ctx: Ctx, who: Admin, response: Response) -> SloPolicyPublic:
    with ctx.db.system() as uow:
        row = uow.slo_policies.add(m.SloPolicy(**body.model_dump()))
        audit(uow, who, "slo_policy.create", "slo_policy", row.id, after=row)
        uow.commit()
        out = SloPolicyPublic.model_validate(row)
    set_etag(response, out.version)
    return out


@router.get("/slo-policies", response_model=Page[SloPolicyPublic])
def list_policies(*, ctx: Ctx, who: Admin, paging: Paging) -> Page[SloPolicyPublic]:
    with ctx.db.system() as uow:
        rows, total = uow.slo_policies.page(select(m.SloPolicy).order_by(m.SloPolicy.name),
                                            limit=paging.limit, offset=paging.offset)
        data = [SloPolicyPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/slo-policies/{policy_id}", response_model=SloPolicyPublic)
def get_policy(*, policy_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> SloPolicyPublic:
    with ctx.db.system() as uow:
        out = SloPolicyPublic.model_validate(uow.slo_policies.require(policy_id))
    set_etag(response, out.version)
    return out


@router.patch("/slo-policies/{policy_id}", response_model=SloPolicyPublic)
def update_policy(*, policy_id: uuid.UUID, body: SloPolicyUpdate, ctx: Ctx, who: Admin, request: Request,
                  response: Response) -> SloPolicyPublic:
    """New targets re-render the autoscaling of the deployments that use the policy."""
    with ctx.db.system() as uow:
        row = uow.slo_policies.require(policy_id)
        check_if_match(request, row.version)
        before = snapshot(row)
        changes = body.model_dump(exclude_unset=True, exclude_none=True)
        for k, v in changes.items():
            setattr(row, k, v)
        if changes:
            uow.flush()
            audit(uow, who, "slo_policy.update", "slo_policy", row.id, before=before, after=row)
        uow.commit()
        out = SloPolicyPublic.model_validate(row)
    if changes:
        ctx.trigger_reconcile("SLO policy changed")
        ctx.invalidate("all", None)
    set_etag(response, out.version)
    return out


@router.delete("/slo-policies/{policy_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_policy(*, policy_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request) -> Response:
    with ctx.db.system() as uow:
        row = uow.slo_policies.require(policy_id)
        check_if_match(request, row.version)
        before = snapshot(row)
        uow.slo_policies.delete(row)
        audit(uow, who, "slo_policy.delete", "slo_policy", policy_id, before=before)
        uow.commit()
    ctx.trigger_reconcile("SLO policy deleted")
    ctx.invalidate("all", None)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/slo-assignments", status_code=status.HTTP_201_CREATED, response_model=SloAssignmentPublic)
def create_assignment(*, body: SloAssignmentCreate, ctx: Ctx, who: Admin) -> SloAssignmentPublic:
    with ctx.db.system() as uow:
        uow.slo_policies.require(body.policy_id)
        if body.tenant_id:
            uow.tenants.require(body.tenant_id)
        if body.model_id:
            uow.models.require(body.model_id)
        row = uow.slo_assignments.add(m.SloAssignment(**body.model_dump()))
        audit(uow, who, "slo_assignment.create", "slo_assignment", row.id, tenant_id=row.tenant_id, after=row)
        uow.commit()
        out = SloAssignmentPublic.model_validate(row)
    ctx.invalidate("tenant" if out.tenant_id else "all", out.tenant_id)
    return out


@router.get("/slo-assignments", response_model=list[SloAssignmentPublic])
def list_assignments(
    *, ctx: Ctx, who: Admin, tenant_id: Annotated[uuid.UUID | None, Query()] = None,
    model_id: Annotated[uuid.UUID | None, Query()] = None,
) -> list[SloAssignmentPublic]:
    stmt = select(m.SloAssignment).order_by(m.SloAssignment.created_at)
    if tenant_id is not None:
        stmt = stmt.where(m.SloAssignment.tenant_id == tenant_id)
    if model_id is not None:
        stmt = stmt.where(m.SloAssignment.model_id == model_id)
    with ctx.db.system() as uow:
        return [SloAssignmentPublic.model_validate(r) for r in uow.slo_assignments.scalars(stmt)]


@router.delete("/slo-assignments/{assignment_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_assignment(*, assignment_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    with ctx.db.system() as uow:
        row = uow.slo_assignments.require(assignment_id)
        tenant_id, before = row.tenant_id, snapshot(row)
        uow.slo_assignments.delete(row)
        audit(uow, who, "slo_assignment.delete", "slo_assignment", assignment_id, tenant_id=tenant_id, before=before)
        uow.commit()
    ctx.invalidate("tenant" if tenant_id else "all", tenant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
