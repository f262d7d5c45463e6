"""Repositories: queries over one aggregate each. They add, read and flush; they never commit.

Reads are plain ``SELECT``s; row-level security (set by the unit of work) already limits what a
tenant-scoped session can see, and tenant-facing queries still say ``tenant_id`` explicitly.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import Date, Integer, Select, delete, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from baton.core import errors
from baton.core import models as m
from baton.core.db import translated

T = TypeVar("T", bound=m.Base)


_ROWS_PER_STATEMENT = 1000


#: (table, columns, conflict key) -> (statement, bind processor per column), built on first use.
_UNNEST_INSERTS: dict[tuple[str, tuple[str, ...], str], tuple[str, list[Any]]] = {}


def _unnest_insert(table: Any, names: tuple[str, ...], key: str, dialect: Any) -> tuple[str, list[Any]]:
    cache_key = (table.name, names, key)
    known = _UNNEST_INSERTS.get(cache_key)
    if known is not None:
        return known
    casts, procs = [], []
    for name in names:
        col_type = table.c[name].type
        casts.append(f"%s::{col_type.compile(dialect=dialect)}[]")
        procs.append(col_type.dialect_impl(dialect).bind_processor(dialect))
    cols = ", ".join(f'"{n}"' for n in names)
    sql = (f'INSERT INTO "{table.name}" ({cols}) SELECT * FROM unnest({", ".join(casts)}) '
           f'ON CONFLICT ("{key}") DO NOTHING')
    _UNNEST_INSERTS[cache_key] = (sql, procs)
    return sql, procs


def _insert_ignoring_duplicates(
    session: Session, model: type[m.Base], key: str, rows: Sequence[dict[str, Any]]
) -> int:
    """INSERT ... ON CONFLICT DO NOTHING of many rows (all with the same keys); returns how many were new.

    One array per column through ``unnest``: the statement text is the same for any number of rows, so
    nothing is compiled per batch (SQLAlchemy's PostgreSQL ``insert`` is never cached) and the server
    prepares it once; values go through the columns' own bind processing (enums, JSONB)."""
    table: Any = model.__table__
    conn = session.connection()
    names = tuple(rows[0])
    sql, procs = _unnest_insert(table, names, key, conn.dialect)
    written = 0
    with translated():
        for i in range(0, len(rows), _ROWS_PER_STATEMENT):
            chunk = rows[i : i + _ROWS_PER_STATEMENT]
            arrays = tuple([r[name] for r in chunk] if proc is None else [proc(r[name]) for r in chunk]
                           for name, proc in zip(names, procs, strict=True))
            written += max(conn.exec_driver_sql(sql, arrays).rowcount, 0)
    return written


class Repository(Generic[T]):
    model: type[T]
    noun: str = "record"

    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, obj: T) -> T:
        self.session.add(obj)
        self.flush()
        return obj

    def flush(self) -> None:
        with translated():
            self.session.flush()

    def get(self, id_: Any) -> T | None:
        with translated():
            return self.session.get(self.model, id_)

    def require(self, id_: Any) -> T:
        obj = self.get(id_)
        if obj is None:
            raise errors.NotFoundError(f"No {self.noun} with id {id_}.")
        return obj

    def delete(self, obj: T) -> None:
        self.session.delete(obj)
        self.flush()

    def scalars(self, stmt: Select[tuple[T]]) -> Sequence[T]:
        with translated():
            return self.session.scalars(stmt).all()

    def page(self, stmt: Select[tuple[T]], *, limit: int, offset: int) -> tuple[Sequence[T], int]:
        """One page of ``stmt`` and the total count of its rows."""
        with translated():
            total = self.session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery()))
            rows = self.session.scalars(stmt.limit(limit).offset(offset)).all()
        return rows, int(total or 0)


class TenantRepository(Repository[m.Tenant]):
    model = m.Tenant
    noun = "tenant"

    def by_name(self, name: str) -> m.Tenant | None:
        with translated():
            return self.session.scalar(select(m.Tenant).where(m.Tenant.name == name))

    def list(self) -> Sequence[m.Tenant]:
        return self.scalars(select(m.Tenant).order_by(m.Tenant.name))


class UserRepository(Repository[m.User]):
    model = m.User
    noun = "user"

    def by_email(self, email: str) -> m.User | None:
        with translated():
            return self.session.scalar(select(m.User).where(func.lower(m.User.email) == email.lower()))

    def for_tenant(self, tenant_id: uuid.UUID) -> Sequence[m.User]:
        return self.scalars(select(m.User).where(m.User.tenant_id == tenant_id).order_by(m.User.email))


class ApiKeyRepository(Repository[m.ApiKey]):
    model = m.ApiKey
    noun = "API key"

    def by_hash(self, key_hash: bytes) -> m.ApiKey | None:
        with translated():
            return self.session.scalar(select(m.ApiKey).where(m.ApiKey.key_hash == key_hash))

    def for_tenant(self, tenant_id: uuid.UUID, *, include_revoked: bool = False) -> Sequence[m.ApiKey]:
        stmt = select(m.ApiKey).where(m.ApiKey.tenant_id == tenant_id)
        if not include_revoked:
            stmt = stmt.where(m.ApiKey.revoked_at.is_(None))
        return self.scalars(stmt.order_by(m.ApiKey.created_at))

    def expired_unrevoked(self, now: dt.datetime) -> Sequence[m.ApiKey]:
        return self.scalars(
            select(m.ApiKey).where(m.ApiKey.revoked_at.is_(None), m.ApiKey.expires_at <= now)
        )


class ModelRepository(Repository[m.Model]):
    model = m.Model
    noun = "model"

    def by_name(self, name: str) -> m.Model | None:
        with translated():
            return self.session.scalar(select(m.Model).where(m.Model.name == name))

    def list(self) -> Sequence[m.Model]:
        return self.scalars(select(m.Model).order_by(m.Model.name))

    def for_tenant(self, tenant_id: uuid.UUID) -> Sequence[m.Model]:
        return self.scalars(
            select(m.Model)
            .join(m.TenantModel, m.TenantModel.model_id == m.Model.id)
            .where(m.TenantModel.tenant_id == tenant_id)
            .order_by(m.Model.name)
        )


class TenantModelRepository(Repository[m.TenantModel]):
    model = m.TenantModel
    noun = "model grant"

    def grant(self, tenant_id: uuid.UUID, model_id: uuid.UUID) -> None:
        with translated():
            self.session.execute(
                insert(m.TenantModel).values(tenant_id=tenant_id, model_id=model_id).on_conflict_do_nothing()
            )

    def revoke(self, tenant_id: uuid.UUID, model_id: uuid.UUID) -> bool:
        with translated():
            res = self.session.execute(
                delete(m.TenantModel).where(
                    m.TenantModel.tenant_id == tenant_id, m.TenantModel.model_id == model_id
                )
            )
        return bool(getattr(res, "rowcount", 0))


class DeploymentRepository(Repository[m.Deployment]):
    model = m.Deployment
    noun = "deployment"

    def by_name(self, name: str) -> m.Deployment | None:
        with translated():
            return self.session.scalar(select(m.Deployment).where(m.Deployment.name == name))

    def list(self) -> Sequence[m.Deployment]:
        return self.scalars(select(m.Deployment).order_by(m.Deployment.name))

    def for_model(self, model_id: uuid.UUID) -> Sequence[m.Deployment]:
        return self.scalars(
            select(m.Deployment)
            .where(m.Deployment.model_id == model_id, m.Deployment.desired_state != m.DesiredState.DELETED)
            .order_by(m.Deployment.name)
        )


class SloPolicyRepository(Repository[m.SloPolicy]):
    model = m.SloPolicy
    noun = "SLO policy"

    def list(self) -> Sequence[m.SloPolicy]:
        return self.scalars(select(m.SloPolicy).order_by(m.SloPolicy.name))


class SloAssignmentRepository(Repository[m.SloAssignment]):
    model = m.SloAssignment
    noun = "SLO assignment"

    def effective(self, tenant_id: uuid.UUID, model_id: uuid.UUID) -> m.SloPolicy | None:
        """The most specific policy: tenant+model, then tenant, then model."""
        a = m.SloAssignment
        specificity = a.tenant_id.is_not(None).cast(Integer) * 2 + a.model_id.is_not(None).cast(Integer)
        with translated():
            return self.session.scalar(
                select(m.SloPolicy)
                .join(a, a.policy_id == m.SloPolicy.id)
                .where(
                    (a.tenant_id == tenant_id) | a.tenant_id.is_(None),
                    (a.model_id == model_id) | a.model_id.is_(None),
                )
                .order_by(specificity.desc())
                .limit(1)
            )


class RateLimitRepository(Repository[m.RateLimit]):
    model = m.RateLimit
    noun = "rate limit"

    def for_tenant(self, tenant_id: uuid.UUID) -> Sequence[m.RateLimit]:
        return self.scalars(select(m.RateLimit).where(m.RateLimit.tenant_id == tenant_id))

    def upsert(
        self,
        tenant_id: uuid.UUID,
        api_key_id: uuid.UUID | None,
        *,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        max_concurrency: int | None,
    ) -> m.RateLimit:
        values = {
            "requests_per_minute": requests_per_minute,
            "tokens_per_minute": tokens_per_minute,
            "max_concurrency": max_concurrency,
        }
        stmt = (
            insert(m.RateLimit)
            .values(tenant_id=tenant_id, api_key_id=api_key_id, **values)
            .on_conflict_do_update(
                constraint="uq_rate_limits_tenant_id_api_key_id", set_={**values, "updated_at": func.now()}
            )
            .returning(m.RateLimit)
        )
        with translated():
            row = self.session.scalars(stmt, execution_options={"populate_existing": True}).one()
        return row


class UsageRepository(Repository[m.UsageRecord]):
    model = m.UsageRecord
    noun = "usage record"

    def insert_many(self, rows: Sequence[dict[str, Any]]) -> int:
        """Idempotent batch insert: a request already recorded is skipped. Returns rows written."""
        if not rows:
            return 0
        return _insert_ignoring_duplicates(self.session, m.UsageRecord, "request_id", rows)

    def query(
        self,
        *,
        tenant_id: uuid.UUID | None = None,
        model: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> Select[tuple[m.UsageRecord]]:
        stmt = select(m.UsageRecord)
        if tenant_id is not None:
            stmt = stmt.where(m.UsageRecord.tenant_id == tenant_id)
        if model is not None:
            stmt = stmt.where(m.UsageRecord.model == model)
        if since is not None:
            stmt = stmt.where(m.UsageRecord.created_at >= since)
        if until is not None:
            stmt = stmt.where(m.UsageRecord.created_at < until)
        return stmt.order_by(m.UsageRecord.created_at.desc(), m.UsageRecord.id.desc())

    def roll_up(self, day: dt.date) -> int:
        """Recomputes ``usage_daily`` for one UTC day from the raw records. Idempotent."""
        start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
        end = start + dt.timedelta(days=1)
        u = m.UsageRecord
        src = (
            select(
                u.tenant_id,
                literal(day, Date).label("day"),
                u.model,
                func.count().label("requests"),
                func.sum(u.prompt_tokens),
                func.sum(u.completion_tokens),
                func.sum(u.cached_tokens),
            )
            .where(u.created_at >= start, u.created_at < end)
            .group_by(u.tenant_id, u.model)
        )
        stmt = insert(m.UsageDaily).from_select(
            ["tenant_id", "day", "model", "requests", "prompt_tokens", "completion_tokens", "cached_tokens"],
            src,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["tenant_id", "day", "model"],
            set_={
                "requests": stmt.excluded.requests,
                "prompt_tokens": stmt.excluded.prompt_tokens,
                "completion_tokens": stmt.excluded.completion_tokens,
                "cached_tokens": stmt.excluded.cached_tokens,
            },
        )
        with translated():
            res = self.session.execute(stmt)
        return int(getattr(res, "rowcount", 0) or 0)

    def daily(self, tenant_id: uuid.UUID, since: dt.date) -> Sequence[m.UsageDaily]:
        with translated():
            return self.session.scalars(
                select(m.UsageDaily)
                .where(m.UsageDaily.tenant_id == tenant_id, m.UsageDaily.day >= since)
                .order_by(m.UsageDaily.day)
            ).all()


class RequestRecordRepository(Repository[m.RequestRecord]):
    model = m.RequestRecord
    noun = "request"

    def insert_many(self, rows: Sequence[dict[str, Any]]) -> int:
        if not rows:
            return 0
        return _insert_ignoring_duplicates(self.session, m.RequestRecord, "id", rows)

    def query(
        self,
        *,
        tenant_id: uuid.UUID | None = None,
        model: str | None = None,
        status: m.RequestStatus | None = None,
        since: dt.datetime | None = None,
    ) -> Select[tuple[m.RequestRecord]]:
        r = m.RequestRecord
        stmt = select(r)
        if tenant_id is not None:
            stmt = stmt.where(r.tenant_id == tenant_id)
        if model is not None:
            stmt = stmt.where(r.model == model)
        if status is not None:
            stmt = stmt.where(r.status == status)
        if since is not None:
            stmt = stmt.where(r.started_at >= since)
        return stmt.order_by(r.started_at.desc(), r.id)


class AuditRepository(Repository[m.AuditLog]):
    model = m.AuditLog
    noun = "audit entry"

    def record(
        self,
        *,
        actor: str,
        action: str,
        target_type: str,
        target_id: str | None = None,
        tenant_id: uuid.UUID | None = None,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> m.AuditLog:
        return self.add(
            m.AuditLog(
                actor=actor, action=action, target_type=target_type, target_id=target_id,
                tenant_id=tenant_id, before=before, after=after, request_id=request_id,
            )
        )

    def query(
        self, *, target_type: str | None = None, tenant_id: uuid.UUID | None = None
    ) -> Select[tuple[m.AuditLog]]:
        stmt = select(m.AuditLog)
        if target_type is not None:
            stmt = stmt.where(m.AuditLog.target_type == target_type)
        if tenant_id is not None:
            stmt = stmt.where(m.AuditLog.tenant_id == tenant_id)
        return stmt.order_by(m.AuditLog.id.desc())


class JobRepository(Repository[m.Job]):
    model = m.Job
    noun = "job"

    def mark(self, job: m.Job, status: m.JobStatus, *, error: str | None = None,
             result: dict[str, Any] | None = None) -> None:
        now = dt.datetime.now(dt.UTC)
        job.status = status
        if status is m.JobStatus.RUNNING:
            job.started_at = now
            job.attempts += 1
        elif status in (m.JobStatus.SUCCEEDED, m.JobStatus.FAILED):
            job.finished_at = now
        job.error = error
        if result is not None:
            job.result = result
        self.flush()


class AdminTokenRepository(Repository[m.AdminToken]):
    model = m.AdminToken
    noun = "admin token"

    def by_hash(self, token_hash: bytes) -> m.AdminToken | None:
        with translated():
            return self.session.scalar(
                select(m.AdminToken).where(
                    m.AdminToken.token_hash == token_hash, m.AdminToken.revoked_at.is_(None)
                )
            )


class ConsoleSessionRepository(Repository[m.ConsoleSession]):
    model = m.ConsoleSession
    noun = "session"

    def by_hash(self, token_hash: bytes, now: dt.datetime) -> m.ConsoleSession | None:
        with translated():
            return self.session.scalar(
                select(m.ConsoleSession).where(
                    m.ConsoleSession.token_hash == token_hash, m.ConsoleSession.expires_at > now
                )
            )

    def end(self, token_hash: bytes) -> None:
        with translated():
            self.session.execute(delete(m.ConsoleSession).where(m.ConsoleSession.token_hash == token_hash))

    def touch_user(self, user_id: uuid.UUID) -> None:
        with translated():
            self.session.execute(
                update(m.User).where(m.User.id == user_id).values(last_login_at=func.now())
            )
