"""The console's operator pages for the catalogue, SLO policies, the planner and the records.

Every change goes through the control plane's use cases (``ctx.control``: the same validation, audit
rows, reconcile triggers and gateway cache invalidation as ``/admin/v1``), acting as ``console:<email>``
and honouring ``If-Match``; bodies and answers are the admin API's schemas. Read-only pages (the
overview, requests, jobs, the audit log) read through the repositories.
"""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from baton.api.admin import convert
from baton.api.admin.deps import PageParams, Paging, check_if_match, set_etag
from baton.api.admin.schemas import (
    DeploymentCreate,
    DeploymentUpdate,
    JobPublic,
    ModelCreate,
    ModelUpdate,
    Page,
    RequestPublic,
    SloAssignmentCreate,
    SloPolicyCreate,
    SloPolicyUpdate,
)
from baton.api.console.auth import ConsoleUser
from baton.api.console.common import ConsoleRoute, Ctx, OperatorUser
from baton.control.catalogue import DeploymentStatusView, DeploymentView, ModelView
from baton.control.pd_cost_model import render_plot
from baton.control.planning import PlanRequest
from baton.control.policies import AssignmentView, PolicyChanges, PolicyView
from baton.control.records import RequestFilter, request_records
from baton.control.usecase import Actor
from baton.control.views import Precondition
from baton.core import models as m
from baton.core.repositories import AuditBy

router = APIRouter(prefix="/ops", tags=["console: operator"], route_class=ConsoleRoute)

ALL = PageParams(limit=500, offset=0)


def _dump(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return obj


def _actor(request: Request, user: ConsoleUser) -> Actor:
    rid = (request.headers.get("x-request-id") or "")[:64] or None
    return Actor(name=user.actor, request_id=rid)


def _if_match(request: Request) -> Precondition:
    return lambda version: check_if_match(request, version)


# --- overview ---------------------------------------------------------------------------------------

@router.get("/overview")
def overview(ctx: Ctx, user: OperatorUser) -> dict[str, Any]:
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with ctx.db.system() as uow:
        tenants = uow.tenants.count()
        states = uow.deployments.count_by_observed_state()
        requests, failed = uow.requests.counts_since(since)
    return {
        "tenants": tenants, "deployments": {state.value: n for state, n in states.items()},
        "requests_last_hour": requests, "failed_last_hour": failed,
    }


# --- models -----------------------------------------------------------------------------------------

@router.get("/models", response_model=list[ModelView])
def list_models(ctx: Ctx, user: OperatorUser) -> list[ModelView]:
    page = ctx.control.catalogue.list_models(limit=ALL.limit, offset=ALL.offset)
    return list(page.items)


@router.post("/models", status_code=201, response_model=ModelView)
def create_model(body: ModelCreate, ctx: Ctx, request: Request, user: OperatorUser,
                 response: Response) -> ModelView:
    out = ctx.control.catalogue.create_model(_actor(request, user), convert.new_model(body))
    set_etag(response, out.version)
    return out


@router.get("/models/{model_id}", response_model=ModelView)
def get_model(model_id: uuid.UUID, ctx: Ctx, user: OperatorUser, response: Response) -> ModelView:
    out = ctx.control.catalogue.get_model(model_id)
    set_etag(response, out.version)
    return out


@router.patch("/models/{model_id}", response_model=ModelView)
def update_model(*, model_id: uuid.UUID, body: ModelUpdate, ctx: Ctx, request: Request, user: OperatorUser,
                 response: Response) -> ModelView:
    """Changing the source or shape re-renders the model's deployments (a reconcile follows)."""
    out = ctx.control.catalogue.update_model(_actor(request, user), model_id, convert.model_changes(body),
                                              expect=_if_match(request))
    set_etag(response, out.version)
    return out


@router.delete("/models/{model_id}", status_code=204)
def delete_model(model_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser) -> Response:
    """A model that deployments still use cannot be deleted (409): delete them first."""
    ctx.control.catalogue.delete_model(_actor(request, user), model_id, expect=_if_match(request))
    return Response(status_code=204)


@router.post("/models/{model_id}/plan")
def plan_model(model_id: uuid.UUID, ctx: Ctx, user: OperatorUser, body: PlanRequest | None = None) -> dict[str, Any]:
    """The planner's answer for one model (no recommendation when nothing meets the SLO), with its plot."""
    outcome = ctx.control.planning.plan(model_id, body or PlanRequest())
    out: dict[str, Any] = outcome.as_dict()
    out["plot_png_base64"] = base64.b64encode(render_plot(outcome.result, "png")).decode()
    # a phone gets the two charts one above the other (the page picks by its width)
    out["plot_narrow_png_base64"] = base64.b64encode(render_plot(outcome.result, "png", "narrow")).decode()
    return out


# --- deployments ------------------------------------------------------------------------------------

@router.get("/deployments", response_model=list[DeploymentView])
def list_deployments(ctx: Ctx, user: OperatorUser) -> list[DeploymentView]:
    """Every deployment, with its model's name."""
    page = ctx.control.catalogue.list_deployments(limit=ALL.limit, offset=ALL.offset)
    return list(page.items)


@router.post("/deployments", status_code=201, response_model=DeploymentView)
def create_deployment(body: DeploymentCreate, ctx: Ctx, request: Request, user: OperatorUser,
                      response: Response) -> DeploymentView:
    out = ctx.control.catalogue.create_deployment(_actor(request, user), convert.new_deployment(body))
    set_etag(response, out.version)
    return out


@router.post("/deployments/reconcile", status_code=202)
def request_reconcile(ctx: Ctx, request: Request, user: OperatorUser) -> dict[str, str]:
    """Enqueues a reconcile now (one also runs after every change and periodically)."""
    ctx.control.catalogue.request_reconcile(_actor(request, user))
    return {"status": "queued"}


@router.get("/deployments/{deployment_id}", response_model=DeploymentView)
def get_deployment(deployment_id: uuid.UUID, ctx: Ctx, user: OperatorUser,
                   response: Response) -> DeploymentView:
    out = ctx.control.catalogue.get_deployment(deployment_id)
    set_etag(response, out.version)
    return out


@router.get("/deployments/{deployment_id}/status", response_model=DeploymentStatusView)
def deployment_status(deployment_id: uuid.UUID, ctx: Ctx, user: OperatorUser) -> DeploymentStatusView:
    """What the reconciler last saw in Ray Serve for this deployment."""
    return ctx.control.catalogue.deployment_status(deployment_id)


@router.get("/deployments/{deployment_id}/serve-config")
def deployment_serve_config(deployment_id: uuid.UUID, ctx: Ctx, user: OperatorUser) -> dict[str, Any]:
    """The Ray Serve application entry Baton renders for this deployment (what the reconciler applies)."""
    out: dict[str, Any] = ctx.control.catalogue.serve_config(deployment_id)
    return out


@router.patch("/deployments/{deployment_id}", response_model=DeploymentView)
def update_deployment(*, deployment_id: uuid.UUID, body: DeploymentUpdate, ctx: Ctx, request: Request,
                      user: OperatorUser, response: Response) -> DeploymentView:
    out = ctx.control.catalogue.update_deployment(
        _actor(request, user), deployment_id, convert.deployment_changes(body), expect=_if_match(request))
    set_etag(response, out.version)
    return out


@router.delete("/deployments/{deployment_id}", response_model=DeploymentView)
def delete_deployment(deployment_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser, *,
                      response: Response, force: bool = False) -> DeploymentView:
    """Marks the deployment deleted; it disappears once Ray Serve no longer runs it. One that served requests
    in the last 15 minutes needs ``force=true`` (the page asks the operator to type its name)."""
    out = ctx.control.catalogue.delete_deployment(_actor(request, user), deployment_id, expect=_if_match(request),
                                                   force=force)
    set_etag(response, out.version)
    return out


# --- SLO policies -----------------------------------------------------------------------------------

@router.get("/slo-policies")
def list_policies(ctx: Ctx, user: OperatorUser) -> dict[str, Any]:
    """Every policy, and every assignment of one."""
    page = ctx.control.slo.list_policies(limit=ALL.limit, offset=ALL.offset)
    return {
        "policies": list(page.items),
        "assignments": list(ctx.control.slo.list_assignments()),
    }


@router.post("/slo-policies", status_code=201, response_model=PolicyView)
def create_policy(body: SloPolicyCreate, ctx: Ctx, request: Request, user: OperatorUser,
                  response: Response) -> PolicyView:
    out = ctx.control.slo.create_policy(_actor(request, user), convert.new_policy(body))
    set_etag(response, out.version)
    return out


@router.get("/slo-policies/{policy_id}", response_model=PolicyView)
def get_policy(policy_id: uuid.UUID, ctx: Ctx, user: OperatorUser, response: Response) -> PolicyView:
    out = ctx.control.slo.get_policy(policy_id)
    set_etag(response, out.version)
    return out


@router.patch("/slo-policies/{policy_id}", response_model=PolicyView)
def update_policy(*, policy_id: uuid.UUID, body: SloPolicyUpdate, ctx: Ctx, request: Request, user: OperatorUser,
                  response: Response) -> PolicyView:
    """New targets re-render the autoscaling of the deployments that use the policy."""
    changes = PolicyChanges.of(body.model_dump(exclude_unset=True))
    out = ctx.control.slo.update_policy(_actor(request, user), policy_id, changes, expect=_if_match(request))
    set_etag(response, out.version)
    return out


@router.delete("/slo-policies/{policy_id}", status_code=204)
def delete_policy(policy_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser) -> Response:
    """The policy's assignments go with it; deployments that used it keep running without one."""
    ctx.control.slo.delete_policy(_actor(request, user), policy_id, expect=_if_match(request))
    return Response(status_code=204)


@router.post("/slo-assignments", status_code=201, response_model=AssignmentView)
def create_assignment(body: SloAssignmentCreate, ctx: Ctx, request: Request, user: OperatorUser) -> AssignmentView:
    return ctx.control.slo.create_assignment(_actor(request, user), convert.new_assignment(body))


@router.delete("/slo-assignments/{assignment_id}", status_code=204)
def delete_assignment(assignment_id: uuid.UUID, ctx: Ctx, request: Request, user: OperatorUser) -> Response:
    ctx.control.slo.delete_assignment(_actor(request, user), assignment_id)
    return Response(status_code=204)


# --- records (read-only) ----------------------------------------------------------------------------

@router.get("/requests", response_model=Page[RequestPublic])
def list_requests(
    *, ctx: Ctx, user: OperatorUser, paging: Paging,
    tenant_id: Annotated[uuid.UUID | None, Query(description="Only this tenant.")] = None,
    model: Annotated[str | None, Query(max_length=200, description="Only this model.")] = None,
    status: Annotated[m.RequestStatus | None, Query()] = None,
    since: Annotated[dt.datetime | None, Query(description="From this time (inclusive).")] = None,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    trace_id: Annotated[str | None, Query(max_length=32)] = None,
) -> Page[RequestPublic]:
    """Request records of every tenant (timings, KV handoff, recovery steps, trace id), newest first."""
    where = RequestFilter(tenant_id=tenant_id, model=model, status=status, since=since, deployment=deployment,
                          trace_id=trace_id)
    page = request_records(ctx.db, where, limit=paging.limit, offset=paging.offset,
                           view=RequestPublic.model_validate)
    return Page(data=list(page.items), count=page.total, limit=page.limit, offset=page.offset)


@router.get("/jobs", response_model=Page[JobPublic])
def list_jobs(
    ctx: Ctx, user: OperatorUser, paging: Paging,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[m.JobStatus | None, Query()] = None,
) -> Page[JobPublic]:
    """Background jobs (reconciles, roll-ups, key expiry), newest first."""
    with ctx.db.system() as uow:
        rows, total = uow.jobs.page(uow.jobs.query(kind=kind, status=status), limit=paging.limit,
                                    offset=paging.offset)
        data = [JobPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/audit")
def audit_log(*, ctx: Ctx, user: OperatorUser, limit: Annotated[int, Query(ge=1, le=500)] = 100,
              offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
              target_type: Annotated[str | None, Query(max_length=64)] = None,
              target_id: Annotated[str | None, Query(max_length=64)] = None,
              tenant_id: Annotated[uuid.UUID | None, Query()] = None,
              actor: Annotated[str | None, Query(max_length=200)] = None,
              action: Annotated[str | None, Query(max_length=100)] = None,
              by: Annotated[AuditBy | None, Query()] = None) -> dict[str, Any]:
    """Every change, newest first, with its target and tenant named (today's names; a target that is
    gone is named from the entry itself)."""
    with ctx.db.system() as uow:
        stmt = uow.audit.query(target_type=target_type, target_id=target_id, tenant_id=tenant_id, actor=actor,
                               action=action, by=by)
        rows, total = uow.audit.page(stmt, limit=limit, offset=offset)
        names = uow.audit.names(rows)
        data = [{
            "id": a.id, "at": a.at.isoformat(), "actor": a.actor, "action": a.action,
            "target_type": a.target_type, "target_id": a.target_id, "target_name": target_name,
            "tenant_id": str(a.tenant_id) if a.tenant_id else None, "tenant_name": tenant_name,
            "before": a.before, "after": a.after,
        } for a, (target_name, tenant_name) in zip(rows, names, strict=True)]
    return {"data": data, "count": total, "limit": limit, "offset": offset}
