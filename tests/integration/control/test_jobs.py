"""Background jobs on real Postgres and Redis: recorded runs, usage roll-up, key expiry, and a real
Celery worker picking a task off Redis."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from sqlalchemy import select

from baton.control import jobs
from baton.core import models as m
from baton.core.secrets import hash_secret, new_secret

from .conftest import unique


def _job(db, job_kind: str, task_id: str | None = None) -> list[tuple[str, str | None, dict | None]]:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        stmt = select(m.Job).where(m.Job.kind == job_kind).order_by(m.Job.created_at)
        if task_id is not None:
            stmt = stmt.where(m.Job.task_id == task_id)
        return [(j.status.value, j.error, j.result) for j in uow.jobs.scalars(stmt)]


def test_runs_are_recorded_with_result_or_error(db) -> None:
    kind = unique("k")
    assert jobs.run_recorded(db, kind, lambda: 41 + 1, summarize=lambda n: {"n": n}) == 42

    def boom() -> None:
        raise RuntimeError("internal detail")

    with pytest.raises(RuntimeError):
        jobs.run_recorded(db, kind, boom)
    assert _job(db, kind) == [("succeeded", None, {"n": 42}), ("failed", "RuntimeError", None)]


def _tenant(db) -> uuid.UUID:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=unique("t"), display_name="T"))
        uow.commit()
        return t.id


def test_usage_roll_up(db) -> None:
    tid = _tenant(db)
    with db.system() as uow:
        uow.usage.insert_many([{"request_id": uuid.uuid4(), "tenant_id": tid, "model": "m",
                                "prompt_tokens": 3, "completion_tokens": 4} for _ in range(5)])
        uow.commit()
    jobs.roll_up_usage(db, days=1)
    with db.system() as uow:
        daily = uow.usage.daily(tid, dt.datetime.now(dt.UTC).date())
        assert [(d.requests, d.prompt_tokens, d.completion_tokens) for d in daily] == [(5, 15, 20)]


class Events:
    def __init__(self) -> None:
        self.changed: list[uuid.UUID] = []

    def key_changed(self, key_id: uuid.UUID) -> None:
        self.changed.append(key_id)


def test_expired_keys_are_closed_and_announced(db, settings) -> None:
    tid = _tenant(db)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    with db.system() as uow:
        rows = []
        for name, exp in (("old", past), ("live", None)):
            secret = new_secret()
            rows.append(uow.api_keys.add(m.ApiKey(tenant_id=tid, name=name, prefix=secret[:14],
                                                  key_hash=hash_secret("x", secret), expires_at=exp,
                                                  created_by="test")))
        uow.commit()
        old_id, live_id = rows[0].id, rows[1].id
    events = Events()
    done = jobs.expire_keys(db, events=events)
    assert str(old_id) in done and str(live_id) not in done and old_id in events.changed
    with db.system() as uow:
        assert uow.api_keys.require(old_id).revoked_at is not None
        assert uow.api_keys.require(live_id).revoked_at is None
        audit = uow.audit.scalars(select(m.AuditLog).where(m.AuditLog.target_id == str(old_id)))
        assert [a.action for a in audit] == ["api_key.expire"]


def test_a_real_worker_runs_tasks_from_redis(db, settings) -> None:
    from celery.contrib.testing.worker import start_worker

    from baton.control.celery_app import ROLLUP, create_celery

    queue = unique("baton-test")
    app = create_celery(settings, queue=queue)
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", queues=[queue]):
        sent = app.send_task(ROLLUP, kwargs={"days": 1}, queue=queue)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _job(db, "usage_rollup", sent.id):
            time.sleep(0.2)
        while time.monotonic() < deadline and _job(db, "usage_rollup", sent.id)[0][0] == "running":
            time.sleep(0.2)
    assert _job(db, "usage_rollup", sent.id)[0][0] == "succeeded"
