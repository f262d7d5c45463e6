"""Background jobs, as plain functions recorded in the ``jobs`` table; Celery tasks only call these.

Each run is one ``jobs`` row: queued -> running -> succeeded | failed, with the result or the error.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from baton.control import batches
from baton.control.audit import snapshot
from baton.control.keys import KeyEvents, NoKeyEvents
from baton.control.reconciler import Reconciler, ReconcileResult
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database
from baton.core.repositories import SYSTEM_ACTOR_PREFIX

log = logging.getLogger(__name__)
T = TypeVar("T")

SYSTEM_ACTOR = f"{SYSTEM_ACTOR_PREFIX}jobs"


def run_recorded(
    db: Database, kind: str, fn: Callable[[], T], *, payload: dict[str, Any] | None = None,
    task_id: str | None = None, summarize: Callable[[T], dict[str, Any]] | None = None,
) -> T:
    """Runs ``fn`` as a recorded job; the row ends ``succeeded`` with ``summarize(result)`` or ``failed``."""
    with db.system() as uow:
        job = uow.jobs.add(m.Job(kind=kind, payload=payload or {}, task_id=task_id))
        uow.jobs.mark(job, m.JobStatus.RUNNING)
        uow.commit()
        job_id = job.id
    try:
        out = fn()
    except Exception as exc:
        message = exc.message if isinstance(exc, errors.BatonError) else type(exc).__name__
        log.exception("job %s (%s) failed", kind, job_id)
        _finish(db, job_id, m.JobStatus.FAILED, error=message)
        raise
    _finish(db, job_id, m.JobStatus.SUCCEEDED, result=summarize(out) if summarize else None)
    return out


def _finish(db: Database, job_id: uuid.UUID, status: m.JobStatus, *, error: str | None = None,
            result: dict[str, Any] | None = None) -> None:
    with db.system() as uow:
        job = uow.jobs.require(job_id)
        uow.jobs.mark(job, status, error=error, result=result)
        uow.commit()


def reconcile(db: Database, reconciler: Reconciler, *, task_id: str | None = None,
              reason: str = "periodic") -> ReconcileResult:
    return run_recorded(db, "reconcile", reconciler.reconcile, payload={"reason": reason}, task_id=task_id,
                        summarize=lambda r: r.as_dict())


def roll_up_usage(db: Database, *, days: int = 2, today: dt.date | None = None,
                  task_id: str | None = None) -> int:
    """Recomputes ``usage_daily`` for the last ``days`` UTC days (today included). Idempotent."""
    today = today or dt.datetime.now(dt.UTC).date()

    def work() -> int:
        rows = 0
        with db.system() as uow:
            for i in range(days):
                rows += uow.usage.roll_up(today - dt.timedelta(days=i))
            uow.commit()
        return rows

    return run_recorded(db, "usage_rollup", work, payload={"days": days, "until": today.isoformat()},
                        task_id=task_id, summarize=lambda n: {"rows": n})


def expire_keys(db: Database, *, now: dt.datetime | None = None, task_id: str | None = None,
                events: KeyEvents | None = None) -> list[str]:
    """Closes keys past their expiry (``revoked_at`` = their expiry time) and tells every gateway to
    forget them; audited. Rotated keys whose overlap window has ended are among them."""
    def work() -> list[str]:
        at = now or dt.datetime.now(dt.UTC)
        done: list[str] = []
        with db.system() as uow:
            for key in uow.api_keys.expired_unrevoked(at):
                before = snapshot(key)
                key.revoked_at = key.expires_at or at
                uow.flush()
                uow.audit.record(actor=SYSTEM_ACTOR, action="api_key.expire", target_type="api_key",
                                 target_id=str(key.id), tenant_id=key.tenant_id, before=before,
                                 after=snapshot(key))
                done.append(str(key.id))
            uow.commit()
        for key_id in done:
            (events or NoKeyEvents()).key_changed(uuid.UUID(key_id))
        return done

    return run_recorded(db, "expire_keys", work, task_id=task_id, summarize=lambda ids: {"expired": ids})


def purge_responses(db: Database, *, now: dt.datetime | None = None, task_id: str | None = None) -> int:
    """Deletes stored ``/v1/responses`` answers past their expiry (reads already ignore them)."""

    def work() -> int:
        at = now or dt.datetime.now(dt.UTC)
        total = 0
        while True:
            with db.system() as uow:
                n = uow.responses.delete_expired(at)
                uow.commit()
            total += n
            if n == 0:
                return total

    return run_recorded(db, "purge_responses", work, task_id=task_id, summarize=lambda n: {"deleted": n})


def sweep_batches(db: Database, *, part_bytes: int, retention_days: float,
                  task_id: str | None = None) -> dict[str, Any]:
    """Ends the batches no gateway has ended (all lines done, past their window, or cancelled: gateways do
    this as they run lines; this covers a deployment whose gateways are all gone) and deletes the batch
    files past their retention."""

    def work() -> dict[str, Any]:
        ended: list[str] = []
        retention = dt.timedelta(days=retention_days)
        while found := batches.finalize_ready(db, part_bytes=part_bytes, retention=retention):
            ended += found
        deleted = 0
        while n := batches.delete_expired_files(db):
            deleted += n
        return {"ended": ended, "files_deleted": deleted}

    return run_recorded(db, "sweep_batches", work, task_id=task_id, summarize=lambda r: r)
