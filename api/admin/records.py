"""Read-only views: usage (raw and per day), request records, the audit log, background jobs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from baton.control.records import RequestFilter, request_records
from baton.core import models as m
from baton.core.repositories import AuditBy

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
               since: SinceQ = None, until: UntilQ = None,
               batch_id: Annotated[str | None, Query(max_length=64, description="Only the lines of this batch.")]
               = None) -> Page[UsagePublic]:
    """One record per completed request, newest first (a batch's lines name it in ``batch_id``)."""
    with ctx.db.system() as uow:
        stmt = uow.usage.query(tenant_id=tenant_id, model=model, since=since, until=until, batch_id=batch_id)
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
    with ctx.db.system() as uow:
        rows, total = uow.usage.daily_page(tenant_id=tenant_id, model=model, since=since, until=until,
                                           limit=paging.limit, offset=paging.offset)
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
    where = RequestFilter(tenant_id=tenant_id, model=model, status=status, since=since, deployment=deployment,
                          trace_id=trace_id)
    page = request_records(ctx.db, where, limit=paging.limit, offset=paging.offset,
                           view=RequestPublic.model_validate)
    return Page(data=list(page.items), count=page.total, limit=page.limit, offset=page.offset)


@router.get("/audit", response_model=Page[AuditPublic], tags=["audit"])
def list_audit(*,
    ctx: Ctx, who: Admin, paging: Paging, tenant_id: TenantQ = None,
    target_type: Annotated[str | None, Query(max_length=64)] = None,
    target_id: Annotated[str | None, Query(max_length=64)] = None,
    actor: Annotated[str | None, Query(max_length=200)] = None,
    action: Annotated[str | None, Query(max_length=100)] = None,
    by: Annotated[AuditBy | None, Query(description="`people`: changes by users and admin tokens; `platform`: "
                                                    "changes Baton made itself (the reconciler, jobs).")] = None,
) -> Page[AuditPublic]:
    """Every change, newest first, with its target and tenant named (one look-up for the page)."""
    with ctx.db.system() as uow:
        stmt = uow.audit.query(target_type=target_type, tenant_id=tenant_id, target_id=target_id, actor=actor,
                               action=action, by=by)
        rows, total = uow.audit.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [AuditPublic.model_validate(r).model_copy(update={"target_name": target, "tenant_name": tenant})
                for r, (target, tenant) in zip(rows, uow.audit.names(rows), strict=True)]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/jobs", response_model=Page[JobPublic], tags=["jobs"])
def list_jobs(*,
    ctx: Ctx, who: Admin, paging: Paging, kind: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[m.JobStatus | None, Query()] = None,
) -> Page[JobPublic]:
    """Background jobs (reconciles, roll-ups, key expiry), newest first."""
    with ctx.db.system() as uow:
        rows, total = uow.jobs.page(uow.jobs.query(kind=kind, status=status), limit=paging.limit,
                                    offset=paging.offset)
        data = [JobPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)
