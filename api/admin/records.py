"""Read-only views: usage (raw and per day), request records, the audit log, background jobs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from baton.core import models as m

from .deps import Admin, Ctx, Paging
from .problems import ProblemRoute
from .schemas import AuditPublic, JobPublic, Page, RequestPublic, UsageDailyPublic, UsagePublic

router = APIRouter(route_class=ProblemRoute)

TenantQ = Annotated[uuid.UUID | None, Query(description="Only this tenant.")]
ModelQ = Annotated[str | None, Query(max_length=200, description="Only this model.")]
SinceQ = Annotated[dt.datetime | None, Query(description="From this time (inclusive).")]
UntilQ = Annotated[dt.datetime | None, Query(description="Until this time (exclusive).")]


@router.get("/usage", response_model=Page[UsagePublic], tags=["usage"])
def list_usage(*, ctx: Ctx, who: Admin, paging: Paging, tenant_id: TenantQ = None, model: ModelQ = None,
               since: SinceQ = None, until: UntilQ = None) -> Page[UsagePublic]:
    """One record per completed request, newest first."""
    with ctx.db.system() as uow:
        stmt = uow.usage.query(tenant_id=tenant_id, model=model, since=since, until=until)
        rows, total = uow.usage.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [UsagePublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/usage/daily", response_model=Page[UsageDailyPublic], tags=["usage"])
def list_usage_daily(*,
    ctx: Ctx, who: Admin, paging: Paging, tenant_id: TenantQ = None, model: ModelQ = None,
    since: Annotated[dt.date | None, Query(description="From this UTC day.")] = None,
    until: Annotated[dt.date | None, Query(description="Until this UTC day (exclusive).")] = None,
) -> Page[UsageDailyPublic]:
    """Usage rolled up per tenant, day and model (kept current by the roll-up job)."""
    u = m.UsageDaily
    stmt = select(u).order_by(u.day.desc(), u.tenant_id, u.model)
    if tenant_id is not None:
        stmt = stmt.where(u.tenant_id == tenant_id)
    if model is not None:
        stmt = stmt.where(u.model == model)
    if since is not None:
        stmt = stmt.where(u.day >= since)
    if until is not None:
        stmt = stmt.where(u.day < until)
    with ctx.db.system() as uow:
        rows, total = uow.usage.page(stmt, limit=paging.limit, offset=paging.offset)  # type: ignore[arg-type,unused-ignore]
        data = [UsageDailyPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/requests", response_model=Page[RequestPublic], tags=["usage"])
def list_requests(
    *, ctx: Ctx, who: Admin, paging: Paging, tenant_id: TenantQ = None, model: ModelQ = None,
    status: Annotated[m.RequestStatus | None, Query()] = None, since: SinceQ = None,
    deployment: Annotated[str | None, Query(max_length=63)] = None,
    trace_id: Annotated[str | None, Query(max_length=32)] = None,
) -> Page[RequestPublic]:
    """Request records (timings, KV handoff, recovery steps, trace id), newest first."""
    with ctx.db.system() as uow:
        stmt = uow.requests.query(tenant_id=tenant_id, model=model, status=status, since=since)
        if deployment is not None:
            stmt = stmt.where(m.RequestRecord.deployment == deployment)
        if trace_id is not None:
            stmt = stmt.where(m.RequestRecord.trace_id == trace_id)
        rows, total = uow.requests.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [RequestPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/audit", response_model=Page[AuditPublic], tags=["audit"])
def list_audit(*,
    ctx: Ctx, who: Admin, paging: Paging, tenant_id: TenantQ = None,
    target_type: Annotated[str | None, Query(max_length=64)] = None,
    target_id: Annotated[str | None, Query(max_length=64)] = None,
    actor: Annotated[str | None, Query(max_length=200)] = None,
    action: Annotated[str | None, Query(max_length=100)] = None,
) -> Page[AuditPublic]:
    with ctx.db.system() as uow:
        stmt = uow.audit.query(target_type=target_type, tenant_id=tenant_id)
        if target_id is not None:
            stmt = stmt.where(m.AuditLog.target_id == target_id)
        if actor is not None:
            stmt = stmt.where(m.AuditLog.actor == actor)
        if action is not None:
            stmt = stmt.where(m.AuditLog.action == action)
        rows, total = uow.audit.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [AuditPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/jobs", response_model=Page[JobPublic], tags=["jobs"])
def list_jobs(*,
    ctx: Ctx, who: Admin, paging: Paging, kind: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[m.JobStatus | None, Query()] = None,
) -> Page[JobPublic]:
    stmt = select(m.Job).order_by(m.Job.created_at.desc(), m.Job.id)
    if kind is not None:
        stmt = stmt.where(m.Job.kind == kind)
    if status is not None:
        stmt = stmt.where(m.Job.status == status)
    with ctx.db.system() as uow:
        rows, total = uow.jobs.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [JobPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)
