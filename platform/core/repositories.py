"""Repositories: queries over one aggregate each. They add, read and flush; they never commit.

Reads are plain ``SELECT``s; row-level security (set by the unit of work) already limits what a
tenant-scoped session can see, and tenant-facing queries still say ``tenant_id`` explicitly.
"""

from __future__ import annotations

import builtins
import datetime as dt
import hashlib
import operator
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

import psycopg
from sqlalchemy import Date, Integer, Select, delete, func, literal, literal_column, select, text, union_all, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from baton.core import errors
from baton.core import models as m
from baton.core.dberrors import translated

T = TypeVar("T", bound=m.Base)


#: Fewer rows than this go in with one ``INSERT ... SELECT FROM unnest(...)``; more, through ``COPY``.
STAGE_FROM_ROWS = 100
SYSTEM_ACTOR_PREFIX = "system:"
"""Audit actors that are Baton itself (``system:reconciler``, ``system:jobs``, ``system:default-grant``)."""
AuditBy = Literal["people", "platform"]

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


def _insert_few(session: Session, model: type[m.Base], key: str, rows: Sequence[dict[str, Any]]) -> int:
    """A few rows in one statement: one array per column through ``unnest`` (the statement text is the same
    for any number of rows, so the server prepares it once)."""
    table: Any = model.__table__
    names = tuple(rows[0])
    with translated():
        conn = session.connection()
        sql, procs = _unnest_insert(table, names, key, conn.dialect)
        arrays = tuple([r[name] for r in rows] if proc is None else [proc(r[name]) for r in rows]
                       for name, proc in zip(names, procs, strict=True))
        return max(int(conn.exec_driver_sql(sql, arrays).rowcount), 0)


#: (table, columns, conflict key) -> (statements, bind processor per column), built on first use.
_STAGED_INSERTS: dict[tuple[str, tuple[str, ...], str], tuple[tuple[str, str, str, str], list[Any]]] = {}


def _staged_insert(
    table: Any, names: tuple[str, ...], key: str, dialect: Any
) -> tuple[tuple[str, str, str, str], list[Any]]:
    known = _STAGED_INSERTS.get((table.name, names, key))
    if known is not None:
        return known
    cols = ", ".join(f'"{n}"' for n in names)
    # one staging table per table and column set: a connection may insert other columns another time
    stage = f'"_staged_{table.name}_{hashlib.sha1(cols.encode(), usedforsecurity=False).hexdigest()[:12]}"'
    statements = (
        # A temporary table of this connection: no row-level security, no indexes.
        f'CREATE TEMPORARY TABLE IF NOT EXISTS {stage} AS SELECT {cols} FROM "{table.name}" WITH NO DATA',
        f"COPY {stage} ({cols}) FROM STDIN",
        f'INSERT INTO "{table.name}" ({cols}) SELECT {cols} FROM {stage} ON CONFLICT ("{key}") DO NOTHING',
        f"TRUNCATE {stage}",
    )
    procs = [table.c[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names]
    known = _STAGED_INSERTS[(table.name, names, key)] = (statements, procs)
    return known


def _insert_ignoring_duplicates(
    session: Session, model: type[m.Base], key: str, rows: Sequence[dict[str, Any]]
) -> int:
    """INSERT ... ON CONFLICT DO NOTHING of many rows (all with the same keys); returns how many were new.
    Values go through the columns' own bind processing (enums, JSONB)."""
    if len(rows) < STAGE_FROM_ROWS:  # four statements per table cost more than they save on a few rows
        return _insert_few(session, model, key, rows)
    return _insert_staged(session, model, key, rows)


def _insert_staged(session: Session, model: type[m.Base], key: str, rows: Sequence[dict[str, Any]]) -> int:
    """Many rows ``COPY``'d into a temporary table, then inserted from it in one statement: the driver
    formats the rows in C and the server plans one ``INSERT`` per batch, several times cheaper than
    binding arrays or a multi-row ``VALUES`` (a ``COPY`` straight into the table would not be idempotent,
    and is refused under row-level security). A failed batch leaves nothing behind: the staged rows roll
    back with the transaction."""
    table: Any = model.__table__
    names = tuple(rows[0])
    with translated():
        conn = session.connection()
        (create, copy_in, insert_new, empty), procs = _staged_insert(table, names, key, conn.dialect)
        values = operator.itemgetter(*names) if len(names) > 1 else (lambda r: (r[names[0]],))
        convert = [(i, proc) for i, proc in enumerate(procs) if proc is not None]
        raw: Any = conn.connection.driver_connection
        try:
            with raw.cursor() as cur:
                cur.execute(create)
                with cur.copy(copy_in) as copy:
                    for r in rows:
                        row = values(r)
                        if convert:
                            row = list(row)
                            for i, proc in convert:
                                row[i] = proc(row[i])
                        copy.write_row(row)
                cur.execute(insert_new)
                written = max(int(cur.rowcount), 0)
                cur.execute(empty)
        except psycopg.Error as exc:  # the driver's own, not wrapped by SQLAlchemy: translated the same way
            if raw.closed or raw.broken:
                conn.invalidate(exc)  # the pool must not hand the dead connection out again (nor roll it back)
            raise DBAPIError.instance(copy_in, None, exc, psycopg.Error) from exc
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

    def existing(self, ids: Iterable[Any]) -> set[Any]:
        """Which of ``ids`` still have a row (one query)."""
        wanted = {i for i in ids if i is not None}
        if not wanted:
            return set()
        pk = self.model.__mapper__.primary_key[0]
        with translated():
            return set(self.session.scalars(select(pk).where(pk.in_(wanted))).all())

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

    def without_grants(self, *, limit: int = 200) -> Sequence[m.Tenant]:
        """Active tenants with no model grant, oldest first (the access queue)."""
        granted = select(m.TenantModel.tenant_id).where(m.TenantModel.tenant_id == m.Tenant.id).exists()
        stmt = (select(m.Tenant).where(m.Tenant.status == m.TenantStatus.ACTIVE, ~granted)
                .order_by(m.Tenant.created_at).limit(limit))
        with translated():
            return self.session.scalars(stmt).all()

    def list(self) -> Sequence[m.Tenant]:
        return self.scalars(select(m.Tenant).order_by(m.Tenant.name))

    def by_ids(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, m.Tenant]:
        if not ids:
            return {}
        return {t.id: t for t in self.scalars(select(m.Tenant).where(m.Tenant.id.in_(list(ids))))}

    def query(self, *, status: m.TenantStatus | None = None,
              name_contains: str | None = None) -> Select[tuple[m.Tenant]]:
        """Tenants by name; ``name_contains`` matches literally (``%`` and ``_`` are not wildcards)."""
        stmt = select(m.Tenant).order_by(m.Tenant.name)
        if status is not None:
            stmt = stmt.where(m.Tenant.status == status)
        if name_contains:
            stmt = stmt.where(m.Tenant.name.contains(name_contains, autoescape=True))
        return stmt

    def count(self) -> int:
        with translated():
            return int(self.session.scalar(select(func.count()).select_from(m.Tenant)) or 0)


class UserRepository(Repository[m.User]):
    model = m.User
    noun = "user"

    def by_email(self, email: str) -> m.User | None:
        with translated():
            return self.session.scalar(select(m.User).where(func.lower(m.User.email) == email.lower()))

    def for_tenant(self, tenant_id: uuid.UUID) -> Sequence[m.User]:
        return self.scalars(select(m.User).where(m.User.tenant_id == tenant_id).order_by(m.User.email))

    def emails_by_tenant(self, tenant_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[str]]:
        """Each tenant's users' emails (sorted), in one query."""
        if not tenant_ids:
            return {}
        out: dict[uuid.UUID, list[str]] = {}
        with translated():
            rows = self.session.execute(select(m.User.tenant_id, m.User.email)
                                        .where(m.User.tenant_id.in_(tenant_ids)).order_by(m.User.email)).all()
        for tid, email in rows:
            out.setdefault(tid, []).append(email)
        return out


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

    def live_fingerprints(self, now: dt.datetime) -> set[str]:
        """The key-secret fingerprints of the live keys (unrevoked, unexpired) that carry one."""
        k = m.ApiKey
        stmt = (select(k.secret_fingerprint).distinct()
                .where(k.secret_fingerprint.is_not(None), k.revoked_at.is_(None),
                       (k.expires_at.is_(None)) | (k.expires_at > now)))
        with translated():
            return {fp for fp in self.session.scalars(stmt) if fp}

    def expired_unrevoked(self, now: dt.datetime) -> Sequence[m.ApiKey]:
        return self.scalars(
            select(m.ApiKey).where(m.ApiKey.revoked_at.is_(None), m.ApiKey.expires_at <= now)
        )

    def unrevoked_playground(self, tenant_id: uuid.UUID, created_by: str) -> Sequence[m.ApiKey]:
        """The playground keys of one console user that are not revoked (at most one: a unique index)."""
        k = m.ApiKey
        return self.scalars(select(k).where(k.tenant_id == tenant_id, k.created_by == created_by,
                                            k.kind == m.KeyKind.PLAYGROUND, k.revoked_at.is_(None))
                            .with_for_update())

    def mark_used(self, used: Mapping[uuid.UUID, dt.datetime]) -> int:
        """Sets each key's ``last_used_at`` to its time in ``used`` (never back in time), in one UPDATE;
        returns the rows changed."""
        if not used:
            return 0
        stmt = text(
            "UPDATE api_keys AS k SET last_used_at = u.at "
            "FROM unnest(CAST(:ids AS uuid[]), CAST(:ats AS timestamptz[])) AS u(id, at) "
            "WHERE k.id = u.id AND (k.last_used_at IS NULL OR k.last_used_at < u.at)"
        )
        with translated():
            res = self.session.execute(stmt, {"ids": list(used), "ats": list(used.values())})
        return int(getattr(res, "rowcount", 0) or 0)


class ModelRepository(Repository[m.Model]):
    model = m.Model
    noun = "model"

    def by_name(self, name: str) -> m.Model | None:
        with translated():
            return self.session.scalar(select(m.Model).where(m.Model.name == name))

    def list(self) -> Sequence[m.Model]:
        return self.scalars(select(m.Model).order_by(m.Model.name))

    def query(self, *, name_contains: str | None = None) -> Select[tuple[m.Model]]:
        """Models by name; ``name_contains`` matches literally (``%`` and ``_`` are not wildcards)."""
        stmt = select(m.Model).order_by(m.Model.name)
        if name_contains:
            stmt = stmt.where(m.Model.name.contains(name_contains, autoescape=True))
        return stmt

    def names(self) -> dict[uuid.UUID, str]:
        with translated():
            return {id_: name for id_, name in self.session.execute(select(m.Model.id, m.Model.name)).all()}

    def for_tenant(self, tenant_id: uuid.UUID) -> Sequence[m.Model]:
        return self.scalars(
            select(m.Model)
            .join(m.TenantModel, m.TenantModel.model_id == m.Model.id)
            .where(m.TenantModel.tenant_id == tenant_id)
            .order_by(m.Model.name)
        )

    def names_by_tenant(self, tenant_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, builtins.list[str]]:
        """The names of the models each tenant may use (sorted), in one query."""
        if not tenant_ids:
            return {}
        out: dict[uuid.UUID, list[str]] = {}
        with translated():
            rows = self.session.execute(
                select(m.TenantModel.tenant_id, m.Model.name)
                .join(m.Model, m.Model.id == m.TenantModel.model_id)
                .where(m.TenantModel.tenant_id.in_(tenant_ids)).order_by(m.Model.name)).all()
        for tid, name in rows:
            out.setdefault(tid, []).append(name)
        return out


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

    def query(
        self,
        *,
        model_id: uuid.UUID | None = None,
        desired_state: m.DesiredState | None = None,
        observed_state: m.ObservedState | None = None,
    ) -> Select[tuple[m.Deployment]]:
        d = m.Deployment
        stmt = select(d).order_by(d.name)
        if model_id is not None:
            stmt = stmt.where(d.model_id == model_id)
        if desired_state is not None:
            stmt = stmt.where(d.desired_state == desired_state)
        if observed_state is not None:
            stmt = stmt.where(d.observed_state == observed_state)
        return stmt

    def count_by_observed_state(self) -> dict[m.ObservedState, int]:
        d = m.Deployment
        with translated():
            rows = self.session.execute(select(d.observed_state, func.count()).group_by(d.observed_state)).all()
        return {m.ObservedState(state): int(n) for state, n in rows}

    def try_reconcile_lock(self, key: int) -> bool:
        """Takes the advisory lock ``key`` for the rest of this transaction; False if another holds it."""
        with translated():
            return bool(self.session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key}).scalar())

    def write_observed(self, deployment_id: uuid.UUID, *, state: m.ObservedState, reason: str | None,
                       generation: int) -> None:
        """What the reconciler saw, as a plain UPDATE: the row's ``version`` (its ETag) stays as it is."""
        with translated():
            self.session.execute(
                update(m.Deployment)
                .where(m.Deployment.id == deployment_id)
                .values(observed_state=state, observed_reason=reason, observed_generation=generation,
                        observed_at=dt.datetime.now(dt.UTC))
                .execution_options(synchronize_session=False)
            )

    def write_memory(self, deployment_id: uuid.UUID, **values: Any) -> None:
        """The reconciler's memory of a row (``last_good``, ``failed_generation``, ``failed_reason``), as a
        plain UPDATE of the fields given: the ETag stays."""
        assert set(values) <= {"last_good", "failed_generation", "failed_reason"}, values
        with translated():
            self.session.execute(
                update(m.Deployment).where(m.Deployment.id == deployment_id)
                .values(**values).execution_options(synchronize_session=False)
            )

    def remove_deleted(self, deployment_id: uuid.UUID) -> None:
        """Deletes the row if (still) marked ``deleted``; a row brought back meanwhile is left alone."""
        with translated():
            self.session.execute(
                delete(m.Deployment)
                .where(m.Deployment.id == deployment_id, m.Deployment.desired_state == m.DesiredState.DELETED)
                .execution_options(synchronize_session=False)
            )


class SloPolicyRepository(Repository[m.SloPolicy]):
    model = m.SloPolicy
    noun = "SLO policy"

    def list(self) -> Sequence[m.SloPolicy]:
        return self.scalars(self.query())

    def query(self) -> Select[tuple[m.SloPolicy]]:
        return select(m.SloPolicy).order_by(m.SloPolicy.name)


class SloAssignmentRepository(Repository[m.SloAssignment]):
    model = m.SloAssignment
    noun = "SLO assignment"

    def query(self, *, tenant_id: uuid.UUID | None = None,
              model_id: uuid.UUID | None = None) -> Select[tuple[m.SloAssignment]]:
        a = m.SloAssignment
        stmt = select(a).order_by(a.created_at, a.id)
        if tenant_id is not None:
            stmt = stmt.where(a.tenant_id == tenant_id)
        if model_id is not None:
            stmt = stmt.where(a.model_id == model_id)
        return stmt

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
        max_tokens_per_request: int | None = None,
    ) -> m.RateLimit:
        values = {
            "requests_per_minute": requests_per_minute,
            "tokens_per_minute": tokens_per_minute,
            "max_concurrency": max_concurrency,
            "max_tokens_per_request": max_tokens_per_request,
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

    def move_to_key(self, from_key_id: uuid.UUID, to_key_id: uuid.UUID) -> int:
        """A key's own limits go to another key (its successor on rotation); rows moved."""
        stmt = update(m.RateLimit).where(m.RateLimit.api_key_id == from_key_id).values(api_key_id=to_key_id)
        with translated():
            return int(self.session.execute(stmt).rowcount or 0)  # type: ignore[attr-defined]


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
        batch_id: str | None = None,
    ) -> Select[tuple[m.UsageRecord]]:
        stmt = select(m.UsageRecord)
        if batch_id is not None:
            stmt = stmt.where(m.UsageRecord.batch_id == batch_id)
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

    def daily_page(
        self, *, tenant_id: uuid.UUID | None = None, model: str | None = None, since: dt.date | None = None,
        until: dt.date | None = None, limit: int, offset: int,
    ) -> tuple[Sequence[m.UsageDaily], int]:
        """Roll-ups, newest day first, and how many match."""
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
        with translated():
            total = self.session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery()))
            rows = self.session.scalars(stmt.limit(limit).offset(offset)).all()
        return rows, int(total or 0)

    def series(
        self, tenant_id: uuid.UUID, *, since: dt.datetime, until: dt.datetime, bucket: str
    ) -> Sequence[tuple[dt.datetime, str, int, int, int, int]]:
        """``(bucket start (UTC, naive), model, requests, prompt, completion, cached tokens)`` per
        ``bucket`` (``hour`` or ``day``) and model over ``[since, until)``; empty buckets are absent."""
        if bucket not in ("hour", "day"):
            raise errors.ValidationError("bucket is 'hour' or 'day'.", param="bucket")
        u = m.UsageRecord
        b = func.date_trunc(literal_column(f"'{bucket}'"), func.timezone("UTC", u.created_at)).label("b")
        stmt = (
            select(b, u.model, func.count(), func.sum(u.prompt_tokens), func.sum(u.completion_tokens),
                   func.sum(u.cached_tokens))
            .where(u.tenant_id == tenant_id, u.created_at >= since, u.created_at < until)
            .group_by(b, u.model)
        )
        with translated():
            rows = self.session.execute(stmt).all()
        return [(bt, model, int(n), int(pt or 0), int(ct or 0), int(cached or 0))
                for bt, model, n, pt, ct, cached in rows]


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
        deployment: str | None = None,
        trace_id: str | None = None,
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
        if deployment is not None:
            stmt = stmt.where(r.deployment == deployment)
        if trace_id is not None:
            stmt = stmt.where(r.trace_id == trace_id)
        return stmt.order_by(r.started_at.desc(), r.id)

    def count_for_deployment(self, deployment: str, since: dt.datetime) -> int:
        """Requests a deployment served (by its name) that started at or after ``since``."""
        r = m.RequestRecord
        with translated():
            n = self.session.execute(select(func.count()).where(r.deployment == deployment,
                                                                r.started_at >= since)).scalar_one()
        return int(n)

    def counts_since(self, since: dt.datetime) -> tuple[int, int]:
        """Requests started at or after ``since``, and how many of them failed."""
        r = m.RequestRecord
        with translated():
            total, failed = self.session.execute(
                select(func.count(), func.count().filter(r.status == m.RequestStatus.FAILED))
                .where(r.started_at >= since)).one()
        return int(total), int(failed)

    def latency_by_model(
        self, tenant_id: uuid.UUID, *, since: dt.datetime, until: dt.datetime, percentiles: Sequence[float]
    ) -> Sequence[tuple[str, int, int, list[float | None] | None, list[float | None] | None]]:
        """Per model (by name) over requests started in ``[since, until)``: ``(model, requests,
        completed, TTFT percentiles, TPOT percentiles)`` (``percentiles`` as fractions; None: no value)."""
        r = m.RequestRecord
        pct = [float(p) for p in percentiles]
        stmt = (
            select(r.model, func.count(), func.count().filter(r.status == m.RequestStatus.COMPLETED),
                   func.percentile_cont(pct).within_group(r.ttft_ms),
                   func.percentile_cont(pct).within_group(r.tpot_ms))
            .where(r.tenant_id == tenant_id, r.started_at >= since, r.started_at < until)
            .group_by(r.model)
            .order_by(r.model)
        )
        with translated():
            rows = self.session.execute(stmt).all()
        return [(model, int(n), int(done), list(ttft) if ttft is not None else None,
                 list(tpot) if tpot is not None else None) for model, n, done, ttft, tpot in rows]

    def count_good(
        self, tenant_id: uuid.UUID, model: str, *, since: dt.datetime, until: dt.datetime, ttft_ms: float,
        tpot_ms: float,
    ) -> int:
        """Completed requests that met both targets (TPOT only where there is one: a single-token answer
        has none)."""
        r = m.RequestRecord
        with translated():
            return int(self.session.scalar(
                select(func.count()).where(
                    r.tenant_id == tenant_id, r.started_at >= since, r.started_at < until, r.model == model,
                    r.status == m.RequestStatus.COMPLETED, r.ttft_ms.is_not(None), r.ttft_ms <= ttft_ms,
                    r.tpot_ms.is_(None) | (r.tpot_ms <= tpot_ms),
                )) or 0)

    def flow_stats(
        self, tenant_id: uuid.UUID, *, since: dt.datetime, until: dt.datetime, by_class: bool = False,
    ) -> list[tuple[str, str | None, int, int, list[float | None] | None, int, int]]:
        """Flow control over requests started in ``[since, until)``, per model (and per SLO class with
        ``by_class``; the class is None without one): ``(model, class, requests, queued, queue wait p50 and
        p99 in ms, refused as overloaded (429 ``model_overloaded``), refused as unavailable (503
        ``model_unavailable``))``; queued: requests with a recorded wait."""
        r = m.RequestRecord
        cls = r.flow_class if by_class else literal_column("NULL").label("flow_class")
        stmt = (
            select(r.model, cls, func.count(), func.count(r.queue_ms),
                   func.percentile_cont([0.5, 0.99]).within_group(r.queue_ms),
                   func.count().filter(r.error_code == "model_overloaded"),
                   func.count().filter(r.error_code == "model_unavailable"))
            .where(r.tenant_id == tenant_id, r.started_at >= since, r.started_at < until)
            .group_by(r.model, *((r.flow_class,) if by_class else ()))
            .order_by(r.model, *((r.flow_class,) if by_class else ()))
        )
        with translated():
            rows = self.session.execute(stmt).all()
        return [(model, klass, int(n), int(queued), list(pcts) if pcts is not None else None, int(over),
                 int(unavail)) for model, klass, n, queued, pcts, over, unavail in rows]

    def count_ttft_met(self, tenant_id: uuid.UUID, model: str, *, since: dt.datetime, until: dt.datetime,
                       ttft_ms: float) -> int:
        """Requests of ``model`` started in ``[since, until)`` whose first token came within ``ttft_ms``."""
        r = m.RequestRecord
        with translated():
            return int(self.session.scalar(
                select(func.count()).where(
                    r.tenant_id == tenant_id, r.started_at >= since, r.started_at < until, r.model == model,
                    r.ttft_ms.is_not(None), r.ttft_ms <= ttft_ms,
                )) or 0)

    def timings(self, model: str, *, limit: int = 5000) -> list[dict[str, Any]]:
        """The newest ``limit`` completed requests of ``model`` as the planner's calibration reads them."""
        r = m.RequestRecord
        cols = (r.prompt_tokens, r.completion_tokens, r.ttft_ms, r.tpot_ms, r.handoff_ms, r.kv_bytes,
                r.started_at, r.finished_at, r.e2e_ms)
        stmt = (select(*cols).where(r.model == model, r.status == m.RequestStatus.COMPLETED)
                .order_by(r.started_at.desc(), r.id).limit(limit))
        with translated():
            return [dict(row._mapping) for row in self.session.execute(stmt).all()]


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
        self, *, target_type: str | None = None, tenant_id: uuid.UUID | None = None, target_id: str | None = None,
        actor: str | None = None, action: str | None = None, by: AuditBy | None = None,
    ) -> Select[tuple[m.AuditLog]]:
        """``by``: ``people`` keeps changes made by users and admin tokens, ``platform`` those Baton made
        itself (actors ``system:*``: the reconciler, background jobs, default grants)."""
        a = m.AuditLog
        stmt = select(a)
        if by == "people":
            stmt = stmt.where(a.actor.not_like(f"{SYSTEM_ACTOR_PREFIX}%"))
        elif by == "platform":
            stmt = stmt.where(a.actor.like(f"{SYSTEM_ACTOR_PREFIX}%"))
        if target_type is not None:
            stmt = stmt.where(a.target_type == target_type)
        if tenant_id is not None:
            stmt = stmt.where(a.tenant_id == tenant_id)
        if target_id is not None:
            stmt = stmt.where(a.target_id == target_id)
        if actor is not None:
            stmt = stmt.where(a.actor == actor)
        if action is not None:
            stmt = stmt.where(a.action == action)
        return stmt.order_by(a.id.desc())

    def names(self, rows: Sequence[m.AuditLog]) -> list[tuple[str | None, str | None]]:
        """``(target name, tenant name)`` of each row, in one query for all of them.

        Names are today's (a renamed model shows its new name); a target that no longer exists is named
        from the row's own snapshot (``name`` or ``email`` in ``before``/``after``), else None."""
        wanted: dict[str, set[uuid.UUID]] = {}
        for row in rows:
            table = _AUDIT_NAMED.get(row.target_type)
            target = _as_uuid(row.target_id)
            if table is not None and target is not None:
                wanted.setdefault(table, set()).add(target)
            if row.tenant_id is not None:
                wanted.setdefault("tenant", set()).add(row.tenant_id)
        found: dict[tuple[str, uuid.UUID], str] = {}
        parts = []
        for table, ids in wanted.items():
            if table == "slo_assignment":
                sa, sp = m.SloAssignment, m.SloPolicy
                parts.append(select(literal(table).label("t"), sa.id.label("id"), sp.name.label("name"))
                             .join(sp, sp.id == sa.policy_id).where(sa.id.in_(ids)))
            elif table == "access_request":  # named by the model asked for
                ar, mo = m.AccessRequest, m.Model
                parts.append(select(literal(table).label("t"), ar.id.label("id"),
                                    func.coalesce(mo.name, literal(ANY_MODEL)).label("name"))
                             .outerjoin(mo, mo.id == ar.model_id).where(ar.id.in_(ids)))
            else:
                model, column = _AUDIT_NAME_COLUMNS[table]
                parts.append(select(literal(table).label("t"), model.id.label("id"), column.label("name"))
                             .where(model.id.in_(ids)))
        if parts:
            with translated():
                for table, id_, name in self.session.execute(union_all(*parts)).all():
                    found[(table, id_)] = name
        out: list[tuple[str | None, str | None]] = []
        for row in rows:
            table = _AUDIT_NAMED.get(row.target_type)
            target = _as_uuid(row.target_id)
            name = found.get((table, target)) if table is not None and target is not None else None
            if name is None and row.target_type != "tenant_model":
                for snap in (row.after, row.before):
                    if isinstance(snap, dict) and isinstance(snap.get("name") or snap.get("email"), str):
                        name = snap.get("name") or snap.get("email")
                        break
            tenant = found.get(("tenant", row.tenant_id)) if row.tenant_id is not None else None
            out.append((name, tenant))
        return out


#: Audit target types named from a table (``tenant_model`` rows target the model).
_AUDIT_NAMED: dict[str, str] = {
    "tenant": "tenant", "user": "user", "api_key": "api_key", "model": "model", "tenant_model": "model",
    "deployment": "deployment", "slo_policy": "slo_policy", "slo_assignment": "slo_assignment",
    "admin_token": "admin_token", "access_request": "access_request",
}
#: How an access request for no particular model is named.
ANY_MODEL = "any model"
_AUDIT_NAME_COLUMNS: dict[str, tuple[Any, Any]] = {
    "tenant": (m.Tenant, m.Tenant.name), "user": (m.User, m.User.email), "api_key": (m.ApiKey, m.ApiKey.name),
    "model": (m.Model, m.Model.name), "deployment": (m.Deployment, m.Deployment.name),
    "slo_policy": (m.SloPolicy, m.SloPolicy.name), "admin_token": (m.AdminToken, m.AdminToken.name),
}


def _as_uuid(value: Any) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


class JobRepository(Repository[m.Job]):
    model = m.Job
    noun = "job"

    def query(self, *, kind: str | None = None, status: m.JobStatus | None = None,
              deployment_id: uuid.UUID | None = None) -> Select[tuple[m.Job]]:
        j = m.Job
        stmt = select(j).order_by(j.created_at.desc(), j.id)
        if kind is not None:
            stmt = stmt.where(j.kind == kind)
        if status is not None:
            stmt = stmt.where(j.status == status)
        if deployment_id is not None:
            stmt = stmt.where(j.deployment_id == deployment_id)
        return stmt

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


class AccessRequestRepository(Repository[m.AccessRequest]):
    model = m.AccessRequest
    noun = "access request"

    def get_for_update(self, request_id: uuid.UUID) -> m.AccessRequest | None:
        """The request, locked until the transaction ends (two operators answering it at once: one wins)."""
        with translated():
            return self.session.get(m.AccessRequest, request_id, with_for_update=True)

    def query(self, *, tenant_id: uuid.UUID | None = None,
              state: m.AccessRequestState | None = None) -> Select[tuple[m.AccessRequest]]:
        """Pending requests oldest first (a queue); answered ones newest first."""
        a = m.AccessRequest
        stmt = select(a)
        if tenant_id is not None:
            stmt = stmt.where(a.tenant_id == tenant_id)
        if state is not None:
            stmt = stmt.where(a.state == state)
        if state is m.AccessRequestState.PENDING:
            return stmt.order_by(a.requested_at, a.id)
        return stmt.order_by(a.requested_at.desc(), a.id)

    def pending(self, tenant_id: uuid.UUID, model_id: uuid.UUID | None) -> m.AccessRequest | None:
        """The tenant's pending request for this model (``None``: for any model)."""
        a = m.AccessRequest
        cond = a.model_id.is_(None) if model_id is None else a.model_id == model_id
        with translated():
            return self.session.scalar(
                select(a).where(a.tenant_id == tenant_id, a.state == m.AccessRequestState.PENDING, cond))

    def satisfied_by(self, tenant_id: uuid.UUID, model_id: uuid.UUID) -> Sequence[m.AccessRequest]:
        """Pending requests a grant of ``model_id`` answers: those for it, and those for any model."""
        a = m.AccessRequest
        return self.scalars(select(a).where(
            a.tenant_id == tenant_id, a.state == m.AccessRequestState.PENDING,
            a.model_id.is_(None) | (a.model_id == model_id)).order_by(a.requested_at).with_for_update())

    def pending_by_tenant(self, tenant_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, m.AccessRequest]:
        """Each tenant's oldest pending request, in one query."""
        if not tenant_ids:
            return {}
        a = m.AccessRequest
        rows = self.scalars(select(a).where(a.tenant_id.in_(tenant_ids), a.state == m.AccessRequestState.PENDING)
                            .order_by(a.requested_at.desc()))
        return {r.tenant_id: r for r in rows}


class StoredResponseRepository(Repository[m.StoredResponse]):
    model = m.StoredResponse
    noun = "response"

    def live(self, response_id: str, now: dt.datetime) -> m.StoredResponse | None:
        """The stored response if it has not expired (row-level security keeps it to its tenant)."""
        r = m.StoredResponse
        with translated():
            return self.session.scalar(select(r).where(r.id == response_id, r.expires_at > now))

    def delete_expired(self, now: dt.datetime, *, batch: int = 10_000) -> int:
        """Deletes up to ``batch`` expired responses; returns how many."""
        r = m.StoredResponse
        ids = select(r.id).where(r.expires_at <= now).limit(batch).scalar_subquery()
        with translated():
            res = self.session.execute(delete(r).where(r.id.in_(ids)))
        return int(getattr(res, "rowcount", 0) or 0)


class AdminTokenRepository(Repository[m.AdminToken]):
    model = m.AdminToken
    noun = "admin token"

    def list(self) -> Sequence[m.AdminToken]:
        return self.scalars(select(m.AdminToken).order_by(m.AdminToken.name))

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

    def end_for_user(self, user_id: uuid.UUID) -> int:
        """Ends every session of one user (a password reset); sessions ended."""
        stmt = delete(m.ConsoleSession).where(m.ConsoleSession.user_id == user_id)
        with translated():
            return int(self.session.execute(stmt).rowcount or 0)  # type: ignore[attr-defined]

    def touch_user(self, user_id: uuid.UUID) -> None:
        with translated():
            self.session.execute(
                update(m.User).where(m.User.id == user_id).values(last_login_at=func.now())
            )


class FileRepository(Repository[m.StoredFile]):
    """``/v1/files`` rows and their parts (row-level security keeps a tenant to its own)."""

    model = m.StoredFile
    noun = "file"

    def live(self, file_id: str, now: dt.datetime) -> m.StoredFile | None:
        f = m.StoredFile
        with translated():
            return self.session.scalar(select(f).where(f.id == file_id, f.expires_at.is_(None) | (f.expires_at > now)))

    def listed(self, *, now: dt.datetime, purpose: str | None, after: str | None, limit: int,
               newest_first: bool) -> Sequence[m.StoredFile]:
        f = m.StoredFile
        stmt = select(f).where(f.expires_at.is_(None) | (f.expires_at > now))
        if purpose is not None:
            stmt = stmt.where(f.purpose == purpose)
        if after is not None:
            mark = select(f.created_at).where(f.id == after).scalar_subquery()
            stmt = stmt.where((f.created_at < mark) if newest_first else (f.created_at > mark))
        order = (f.created_at.desc(), f.id.desc()) if newest_first else (f.created_at, f.id)
        return self.scalars(stmt.order_by(*order).limit(limit))

    def add_part(self, file: m.StoredFile, seq: int, data: bytes) -> None:
        with translated():
            self.session.execute(insert(m.FilePart).values(file_id=file.id, seq=seq, tenant_id=file.tenant_id,
                                                           data=data))

    def parts(self, file_id: str, *, after: int = -1) -> Sequence[tuple[int, bytes]]:
        """The next few parts after ``after``, in order (a reader pages through a file, one part in memory)."""
        p = m.FilePart
        with translated():
            rows = self.session.execute(select(p.seq, p.data).where(p.file_id == file_id, p.seq > after)
                                        .order_by(p.seq).limit(4)).all()
        return [(int(seq), bytes(data)) for seq, data in rows]

    def delete_expired(self, now: dt.datetime, *, batch: int = 1000) -> int:
        f = m.StoredFile
        ids = select(f.id).where(f.expires_at <= now).limit(batch).scalar_subquery()
        with translated():
            res = self.session.execute(delete(f).where(f.id.in_(ids)))
        return int(getattr(res, "rowcount", 0) or 0)


#: The states of a line that has not ended.
OPEN_LINE_STATES = ("pending", "running")
#: The statuses of a batch that has not ended.
OPEN_BATCH_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")


class BatchRepository(Repository[m.Batch]):
    """Batches and their lines. The claim, result and finalize statements are written for many processes at
    once: a line is claimed under a lease with ``SKIP LOCKED`` and written back only by the attempt that
    holds it (``attempt`` is its fencing token)."""

    model = m.Batch
    noun = "batch"

    def listed(self, *, after: str | None, limit: int) -> Sequence[m.Batch]:
        b = m.Batch
        stmt = select(b)
        if after is not None:
            stmt = stmt.where(b.created_at < select(b.created_at).where(b.id == after).scalar_subquery())
        return self.scalars(stmt.order_by(b.created_at.desc(), b.id.desc()).limit(limit))

    def add_lines(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            with translated():
                self.session.execute(insert(m.BatchLine), list(rows))

    def counts(self, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """``{batch_id: {state: lines}}``."""
        if not batch_ids:
            return {}
        line = m.BatchLine
        out: dict[str, dict[str, int]] = {}
        with translated():
            rows = self.session.execute(select(line.batch_id, line.state, func.count())
                                        .where(line.batch_id.in_(batch_ids)).group_by(line.batch_id, line.state))
        for batch_id, state, n in rows:
            out.setdefault(batch_id, {})[state] = int(n)
        return out

    def claim(self, *, models: Sequence[str], limit: int, lease_s: float, now: dt.datetime) -> list[dict[str, Any]]:
        """Up to ``limit`` lines of running batches for ``models``, oldest batch first: pending ones whose
        ``not_before`` has passed, and running ones whose lease ran out (their runner died). Each comes back
        with its new ``attempt``."""
        sql = text("""
            UPDATE batch_lines l
               SET state = 'running', attempt = l.attempt + 1, lease_until = :lease, not_before = NULL
              FROM (SELECT bl.batch_id, bl.line, b.api_key_id, b.endpoint
                      FROM batch_lines bl JOIN batches b ON b.id = bl.batch_id
                     WHERE b.status = 'in_progress' AND b.model = ANY(:models) AND b.expires_at > :now
                       AND ((bl.state = 'pending' AND (bl.not_before IS NULL OR bl.not_before <= :now))
                            OR (bl.state = 'running' AND bl.lease_until < :now))
                     ORDER BY b.created_at, bl.line
                     LIMIT :limit
                       FOR UPDATE OF bl SKIP LOCKED) c
             WHERE l.batch_id = c.batch_id AND l.line = c.line
         RETURNING l.batch_id, l.line, l.attempt, l.tenant_id, l.custom_id, l.body, l.request_id, c.api_key_id,
                   c.endpoint""")
        lease = now + dt.timedelta(seconds=lease_s)
        with translated():
            rows = self.session.execute(sql, {"lease": lease, "models": list(models), "now": now, "limit": limit})
        return [dict(r._mapping) for r in rows]

    def renew(self, held: Sequence[tuple[str, int, int]], *, lease_until: dt.datetime) -> int:
        """Extends the leases of lines this runner still holds (``(batch_id, line, attempt)``)."""
        if not held:
            return 0
        sql = text("""
            UPDATE batch_lines l SET lease_until = :lease
              FROM unnest(CAST(:ids AS text[]), CAST(:lines AS int[]), CAST(:attempts AS int[])) AS h(b, n, a)
             WHERE l.batch_id = h.b AND l.line = h.n AND l.attempt = h.a AND l.state = 'running'""")
        with translated():
            res = self.session.execute(sql, {"lease": lease_until, "ids": [h[0] for h in held],
                                             "lines": [h[1] for h in held], "attempts": [h[2] for h in held]})
        return int(getattr(res, "rowcount", 0) or 0)

    def finish_line(self, batch_id: str, line: int, attempt: int, *, state: str, response: bytes | None,
                    error: dict[str, Any] | None, now: dt.datetime) -> bool:
        """Writes a line's result if ``attempt`` still holds it; False: another attempt took it over (the
        result is dropped, so the line is in the output once)."""
        bl = m.BatchLine
        with translated():
            res = self.session.execute(
                update(bl).where(bl.batch_id == batch_id, bl.line == line, bl.attempt == attempt,
                                 bl.state == "running")
                .values(state=state, response=response, error=error, finished_at=now, lease_until=None))
        return bool(getattr(res, "rowcount", 0))

    def finish_lines(self, rows: Sequence[tuple[str, int, int, str, bytes]], *,
                     now: dt.datetime) -> set[tuple[str, int]]:
        """:meth:`finish_line` of many lines in one statement (``(batch_id, line, attempt, state, response)``
        each); returns the ``(batch_id, line)`` of those whose attempt still held them."""
        if not rows:
            return set()
        sql = text("""
            UPDATE batch_lines l
               SET state = r.state, response = r.response, error = NULL, finished_at = :now, lease_until = NULL
              FROM unnest(CAST(:ids AS text[]), CAST(:lines AS int[]), CAST(:attempts AS int[]),
                          CAST(:states AS text[]), CAST(:responses AS bytea[])) AS r(b, n, a, state, response)
             WHERE l.batch_id = r.b AND l.line = r.n AND l.attempt = r.a AND l.state = 'running'
         RETURNING l.batch_id, l.line""")
        with translated():
            out = self.session.execute(sql, {"now": now, "ids": [r[0] for r in rows], "lines": [r[1] for r in rows],
                                             "attempts": [r[2] for r in rows], "states": [r[3] for r in rows],
                                             "responses": [r[4] for r in rows]})
            return {(str(b), int(n)) for b, n in out}

    def put_back(self, batch_id: str, line: int, attempt: int, *, not_before: dt.datetime) -> bool:
        """A line that could not run now (limits, a busy or absent pool) waits until ``not_before``."""
        bl = m.BatchLine
        with translated():
            res = self.session.execute(
                update(bl).where(bl.batch_id == batch_id, bl.line == line, bl.attempt == attempt,
                                 bl.state == "running")
                .values(state="pending", lease_until=None, not_before=not_before))
        return bool(getattr(res, "rowcount", 0))

    def end_open_lines(self, batch_id: str, *, state: str, error: dict[str, Any], now: dt.datetime,
                       running_too: bool) -> int:
        """Ends the lines that will not run (``expired``, ``cancelled``): pending ones, and running ones too
        when ``running_too`` (a late result of such a line is then dropped by :meth:`finish_line`)."""
        bl = m.BatchLine
        states = OPEN_LINE_STATES if running_too else ("pending",)
        with translated():
            res = self.session.execute(
                update(bl).where(bl.batch_id == batch_id, bl.state.in_(states))
                .values(state=state, error=error, finished_at=now, lease_until=None))
        return int(getattr(res, "rowcount", 0) or 0)

    def open_lines(self, batch_id: str) -> int:
        bl = m.BatchLine
        with translated():
            return int(self.session.scalar(select(func.count()).select_from(bl).where(
                bl.batch_id == batch_id, bl.state.in_(OPEN_LINE_STATES))) or 0)

    def to_finalize(self, *, now: dt.datetime, limit: int = 4) -> Sequence[m.Batch]:
        """Batches whose lines have all ended (or whose window has passed), locked for this transaction
        (``SKIP LOCKED``: another process finalizing one is left to it)."""
        b, bl = m.Batch, m.BatchLine
        open_ = select(bl.line).where(bl.batch_id == b.id, bl.state.in_(OPEN_LINE_STATES)).exists()
        held = select(bl.line).where(bl.batch_id == b.id, bl.state == "running", bl.lease_until > now).exists()
        stmt = (select(b).where(((b.status == "in_progress") & ((~open_) | (b.expires_at <= now)))
                                | ((b.status == "cancelling") & ~held))
                .order_by(b.created_at).limit(limit).with_for_update(of=b, skip_locked=True))
        return self.scalars(stmt)

    def lines_of(self, batch_id: str, *, states: Sequence[str], after: int, limit: int) -> Sequence[m.BatchLine]:
        bl = m.BatchLine
        with translated():
            return self.session.scalars(select(bl).where(bl.batch_id == batch_id, bl.state.in_(states),
                                                         bl.line > after).order_by(bl.line).limit(limit)).all()

    def running_models(self) -> list[str]:
        """The models with a batch in progress (a runner asks for lines of those it can serve)."""
        b = m.Batch
        with translated():
            return list(self.session.scalars(select(b.model).where(b.status == "in_progress").distinct()))

    # -- the operators' view, across tenants (a system session) --------------------------------------------

    def status_by_model(self, *, since: dt.datetime) -> list[tuple[str, str, int]]:
        """``(model, status, batches)`` of the batches still open or created since ``since``."""
        b = m.Batch
        with translated():
            rows = self.session.execute(select(b.model, b.status, func.count()).where(_shown_batch(since))
                                        .group_by(b.model, b.status))
        return [(model, status, int(n)) for model, status, n in rows]

    def lines_by_model(self, *, since: dt.datetime) -> list[tuple[str, str, int]]:
        """``(model, line state, lines)`` of the same batches as :meth:`status_by_model`."""
        b, bl = m.Batch, m.BatchLine
        with translated():
            rows = self.session.execute(select(b.model, bl.state, func.count()).join(bl, bl.batch_id == b.id)
                                        .where(_shown_batch(since)).group_by(b.model, bl.state))
        return [(model, state, int(n)) for model, state, n in rows]

    def open_with_tenants(self, *, limit: int) -> list[tuple[m.Batch, str, str]]:
        """Up to ``limit`` open batches, oldest first (the order the runners take their lines in), each with
        its tenant's name and display name."""
        b, t = m.Batch, m.Tenant
        with translated():
            rows = self.session.execute(select(b, t.name, t.display_name).join(t, t.id == b.tenant_id)
                                        .where(b.status.in_(OPEN_BATCH_STATUSES))
                                        .order_by(b.created_at, b.id).limit(limit)).all()
        return [(batch, name, display) for batch, name, display in rows]


def _shown_batch(since: dt.datetime) -> Any:
    """The batches the operators' view counts: every open one, and those created since ``since``."""
    b = m.Batch
    return b.status.in_(OPEN_BATCH_STATUSES) | (b.created_at >= since)
