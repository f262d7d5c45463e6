"""The console's operator pages. Every change goes through the admin API's own handlers (same
validation, audit rows, reconcile triggers and gateway cache invalidation as ``/admin/v1``), acting as
``console:<email>``; only read-only summaries are assembled here."""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel
from sqlalchemy import func, select

from baton.api.admin import deployments as admin_deployments
from baton.api.admin import models as admin_models
from baton.api.admin import slo as admin_slo
from baton.api.admin import tenants as admin_tenants
from baton.api.admin.deps import AdminContext, AdminPrincipal, PageParams
from baton.api.admin.deps import get_context as admin_context
from baton.api.admin.schemas import (
    DeploymentCreate,
    DeploymentUpdate,
    ModelCreate,
    SloAssignmentCreate,
    SloPolicyCreate,
)
from baton.api.console.auth import ConsoleUser
from baton.api.console.routes import ConsoleRoute, Ctx, OperatorUser
from baton.core import models as m
from baton.core.db import translated

router = APIRouter(prefix="/ops", tags=["console: operator"], route_class=ConsoleRoute)

ALL = PageParams(limit=500, offset=0)


def _admin(request: Request, user: ConsoleUser) -> tuple[AdminContext, AdminPrincipal]:
    rid = (request.headers.get("x-request-id") or "")[:64] or None
    return admin_context(request), AdminPrincipal(actor=user.actor, request_id=rid)


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return obj


@router.get("/overview")
def overview(ctx: Ctx, user: OperatorUser) -> dict[str, Any]:
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    r = m.RequestRecord
    with ctx.db.system() as uow, translated():
        tenants = uow.session.scalar(select(func.count()).select_from(m.Tenant)) or 0
        states: dict[str, int] = {
            str(state): int(count) for state, count in uow.session.execute(
                select(m.Deployment.observed_state, func.count()).group_by(m.Deployment.observed_state)).all()}
        reqs = uow.session.execute(
            select(func.count(), func.count().filter(r.status == m.RequestStatus.FAILED))
            .where(r.started_at >= since)).one()
    return {
        "tenants": int(tenants),
        "deployments": {m.ObservedState(k).value: int(v) for k, v in states.items()},
        "requests_last_hour": int(reqs[0]), "failed_last_hour": int(reqs[1]),
    }


@router.get("/tenants")
def list_tenants(request: Request, user: OperatorUser) -> list[dict[str, Any]]:
    actx, who = _admin(request, user)
    page = admin_tenants.list_tenants(ctx=actx, who=who, paging=ALL)
    out = []
    with actx.db.system() as uow:
        for t in page.data:
            row = t.model_dump(mode="json")
            row["models"] = [mod.name for mod in uow.models.for_tenant(t.id)]
            row["users"] = len(uow.users.for_tenant(t.id))
            out.append(row)
    return out


@router.put("/tenants/{tenant_id}/models/{model_id}", status_code=204)
def grant_model(tenant_id: uuid.UUID, model_id: uuid.UUID, request: Request, user: OperatorUser) -> Response:
    actx, who = _admin(request, user)
    out: Response = admin_tenants.grant_model(tenant_id=tenant_id, model_id=model_id, ctx=actx, who=who)
    return out


@router.delete("/tenants/{tenant_id}/models/{model_id}", status_code=204)
def revoke_model(tenant_id: uuid.UUID, model_id: uuid.UUID, request: Request, user: OperatorUser) -> Response:
    actx, who = _admin(request, user)
    out: Response = admin_tenants.revoke_model(tenant_id=tenant_id, model_id=model_id, ctx=actx, who=who)
    return out


@router.post("/tenants/{tenant_id}/suspend")
def suspend_tenant(tenant_id: uuid.UUID, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_tenants.suspend_tenant(tenant_id=tenant_id, ctx=actx, who=who, request=request,
                                              response=Response()))


@router.post("/tenants/{tenant_id}/resume")
def resume_tenant(tenant_id: uuid.UUID, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_tenants.resume_tenant(tenant_id=tenant_id, ctx=actx, who=who, request=request,
                                             response=Response()))


@router.get("/models")
def list_models(request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_models.list_models(ctx=actx, who=who, paging=ALL).data)


@router.post("/models", status_code=201)
def create_model(body: ModelCreate, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_models.create_model(body=body, ctx=actx, who=who, response=Response()))


@router.post("/models/{model_id}/plan")
def plan_model(model_id: uuid.UUID, request: Request, user: OperatorUser,
               body: admin_models.PlanRequest | None = None) -> dict[str, Any]:
    """The planner's recommendation for one model, with its plot (PNG, base64)."""
    from baton.control.planner import render_plot

    actx, _ = _admin(request, user)
    result, meta = admin_models.run_plan(actx, model_id, body or admin_models.PlanRequest())
    out: dict[str, Any] = {**meta, **result.as_dict()}
    out["plot_png_base64"] = base64.b64encode(render_plot(result, "png")).decode()
    result_json: dict[str, Any] = _jsonable(out)
    return result_json


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


@router.get("/deployments")
def list_deployments(request: Request, user: OperatorUser) -> list[dict[str, Any]]:
    actx, who = _admin(request, user)
    page = admin_deployments.list_deployments(ctx=actx, who=who, paging=ALL)
    with actx.db.system() as uow:
        names = {mod.id: mod.name for mod in uow.models.list()}
    out = []
    for d in page.data:
        row = d.model_dump(mode="json")
        row["model"] = names.get(d.model_id)
        out.append(row)
    return out


@router.post("/deployments", status_code=201)
def create_deployment(body: DeploymentCreate, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_deployments.create_deployment(body=body, ctx=actx, who=who, response=Response()))


@router.patch("/deployments/{deployment_id}")
def update_deployment(deployment_id: uuid.UUID, body: DeploymentUpdate, request: Request,
                      user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_deployments.update_deployment(
        deployment_id=deployment_id, body=body, ctx=actx, who=who, request=request, response=Response()))


@router.delete("/deployments/{deployment_id}")
def delete_deployment(deployment_id: uuid.UUID, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_deployments.delete_deployment(
        deployment_id=deployment_id, ctx=actx, who=who, request=request, response=Response()))


@router.get("/slo-policies")
def list_policies(request: Request, user: OperatorUser) -> dict[str, Any]:
    actx, who = _admin(request, user)
    return {
        "policies": _dump(admin_slo.list_policies(ctx=actx, who=who, paging=ALL).data),
        "assignments": _dump(admin_slo.list_assignments(ctx=actx, who=who)),
    }


@router.post("/slo-policies", status_code=201)
def create_policy(body: SloPolicyCreate, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_slo.create_policy(body=body, ctx=actx, who=who, response=Response()))


@router.post("/slo-assignments", status_code=201)
def create_assignment(body: SloAssignmentCreate, request: Request, user: OperatorUser) -> Any:
    actx, who = _admin(request, user)
    return _dump(admin_slo.create_assignment(body=body, ctx=actx, who=who))


@router.get("/audit")
def audit_log(ctx: Ctx, user: OperatorUser, limit: Annotated[int, Query(ge=1, le=500)] = 100,
              offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
              target_type: Annotated[str | None, Query(max_length=64)] = None) -> dict[str, Any]:
    with ctx.db.system() as uow:
        rows, total = uow.audit.page(uow.audit.query(target_type=target_type), limit=limit, offset=offset)
        data = [{
            "id": a.id, "at": a.at.isoformat(), "actor": a.actor, "action": a.action,
            "target_type": a.target_type, "target_id": a.target_id,
            "tenant_id": str(a.tenant_id) if a.tenant_id else None, "before": a.before, "after": a.after,
        } for a in rows]
    return {"data": data, "count": total, "limit": limit, "offset": offset}
