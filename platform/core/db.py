"""Database access: engines and the unit of work (driver errors become Baton's in :mod:`baton.core.dberrors`).

The unit of work is the only place that commits. Every transaction it opens first sets the
row-level-security context (``baton.scope`` and ``baton.tenant_id``, transaction-local), so a session
for tenant A cannot read tenant B's rows even if a query forgets its ``WHERE tenant_id``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from baton.core import repositories as r
from baton.core.dberrors import translate, translated
from baton.core.settings import Settings

ScopeKind = Literal["tenant", "system"]


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose rows a unit of work may see: one tenant's, or all (``system``: admin, gateway lookups)."""

    kind: ScopeKind
    tenant_id: uuid.UUID | None = None

    @classmethod
    def tenant(cls, tenant_id: uuid.UUID) -> Scope:
        return cls("tenant", tenant_id)

    @classmethod
    def system(cls) -> Scope:
        return cls("system")


_SET_SCOPE = text("SELECT set_config('baton.scope', :scope, true), set_config('baton.tenant_id', :tid, true)")


def make_engine(url: str, *, pool_size: int = 5, statement_timeout_ms: int = 0, echo: bool = False) -> Engine:
    connect_args: dict[str, Any] = {"application_name": "baton"}
    if statement_timeout_ms:
        connect_args["options"] = f"-c statement_timeout={statement_timeout_ms}"
    return create_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True, echo=echo,
        connect_args=connect_args,
    )


class Database:
    """An engine and its session factory, built once at start-up and passed down."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False, autoflush=True)

    @classmethod
    def for_services(cls, settings: Settings) -> Database:
        """Connects as the service role, to which row-level security applies."""
        db = settings.db
        return cls(make_engine(db.service_url(), pool_size=db.pool_size,
                               statement_timeout_ms=db.statement_timeout_ms))

    @classmethod
    def for_owner(cls, settings: Settings) -> Database:
        """Connects as the schema owner (migrations, maintenance)."""
        return cls(make_engine(settings.db.url, pool_size=1))

    def unit_of_work(self, scope: Scope) -> UnitOfWork:
        return UnitOfWork(self._sessions, scope)

    def tenant(self, tenant_id: uuid.UUID) -> UnitOfWork:
        return self.unit_of_work(Scope.tenant(tenant_id))

    def system(self) -> UnitOfWork:
        return self.unit_of_work(Scope.system())

    def ping(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except DBAPIError as exc:
            raise translate(exc) from exc

    def dispose(self) -> None:
        self.engine.dispose()


class UnitOfWork:
    """One business transaction. Repositories hang off it; only :meth:`commit` commits.

    Leaving the ``with`` block without committing rolls back.
    """

    session: Session

    def __init__(self, sessions: sessionmaker[Session], scope: Scope) -> None:
        self._sessions = sessions
        self.scope = scope

    def __enter__(self) -> Self:
        self.session = self._sessions()
        params = {
            "scope": self.scope.kind,
            "tid": str(self.scope.tenant_id) if self.scope.tenant_id else "",
        }

        @event.listens_for(self.session, "after_begin")
        def _set_scope(_s: Session, _t: SessionTransaction, conn: Connection) -> None:
            conn.execute(_SET_SCOPE, params)

        s = self.session
        self.tenants = r.TenantRepository(s)
        self.users = r.UserRepository(s)
        self.api_keys = r.ApiKeyRepository(s)
        self.models = r.ModelRepository(s)
        self.tenant_models = r.TenantModelRepository(s)
        self.deployments = r.DeploymentRepository(s)
        self.slo_policies = r.SloPolicyRepository(s)
        self.slo_assignments = r.SloAssignmentRepository(s)
        self.rate_limits = r.RateLimitRepository(s)
        self.usage = r.UsageRepository(s)
        self.requests = r.RequestRecordRepository(s)
        self.audit = r.AuditRepository(s)
        self.jobs = r.JobRepository(s)
        self.admin_tokens = r.AdminTokenRepository(s)
        self.console_sessions = r.ConsoleSessionRepository(s)
        self.access_requests = r.AccessRequestRepository(s)
        self.responses = r.StoredResponseRepository(s)
        self.files = r.FileRepository(s)
        self.batches = r.BatchRepository(s)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.session.rollback()
        finally:
            self.session.close()

    def flush(self) -> None:
        with translated():
            self.session.flush()

    def commit(self) -> None:
        with translated():
            self.session.commit()

    def rollback(self) -> None:
        self.session.rollback()
