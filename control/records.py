"""Read use cases of the request records, shared by every surface that lists them (the admin API's
``/requests`` and the operator console's): one query, one paging, a view chosen by the caller."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from baton.control.views import Page
from baton.core import models as m
from baton.core.db import Database

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RequestFilter:
    """Which request records to list; ``None`` leaves a field out of the filter."""

    tenant_id: uuid.UUID | None = None
    model: str | None = None
    status: m.RequestStatus | None = None
    since: dt.datetime | None = None
    deployment: str | None = None
    trace_id: str | None = None


def request_records(db: Database, where: RequestFilter, *, limit: int, offset: int,
                    view: Callable[[m.RequestRecord], T]) -> Page[T]:
    """Request records of every tenant (timings, KV handoff, recovery steps, trace id), newest first, each
    turned into ``view`` while its session is open."""
    with db.system() as uow:
        stmt = uow.requests.query(tenant_id=where.tenant_id, model=where.model, status=where.status,
                                  since=where.since, deployment=where.deployment, trace_id=where.trace_id)
        rows, total = uow.requests.page(stmt, limit=limit, offset=offset)
        return Page([view(r) for r in rows], total, limit, offset)
