"""Database access: engines, the unit of work, and translation of driver errors.

The unit of work is the only place that commits. Every transaction it opens first sets the
row-level-security context (``baton.scope`` and ``baton.tenant_id``, transaction-local), so a session
for tenant A cannot read tenant B's rows even if a query forgets its ``WHERE tenant_id``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from baton.core import errors
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
        from baton.core import repositories as r

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


@contextmanager
def translated() -> Iterator[None]:
    """Turns driver and ORM exceptions into Baton's own errors."""
    try:
        yield
    except StaleDataError as exc:
        raise errors.PreconditionFailedError(
            "The record was changed by someone else; read it again and retry."
        ) from exc
    except DBAPIError as exc:
        raise translate(exc) from exc


_FK_NAME = re.compile(r"^fk_(?P<table>.+?)_(?P<column>[a-z_]+?_id)_(?P<ref>[a-z_]+)$")
_NOT_NULL = "23502"
_FOREIGN_KEY = "23503"
_UNIQUE = "23505"
_CHECK = "23514"

#: Client-facing wording for the constraints a caller can run into.
CONSTRAINT_MESSAGES: dict[str, str] = {
    "uq_tenants_name": "A tenant with this name already exists.",
    "uq_users_email_lower": "A user with this email already exists.",
    "uq_api_keys_tenant_id_name_live": "This tenant already has a live API key with this name.",
    "uq_models_name": "A model with this name already exists.",
    "uq_deployments_name": "A deployment with this name already exists.",
    "uq_slo_policies_name": "An SLO policy with this name already exists.",
    "uq_slo_assignments_tenant_id_model_id": "An SLO policy is already assigned to this target.",
    "uq_rate_limits_tenant_id_api_key_id": "Rate limits for this target already exist.",
    "uq_usage_records_request_id": "Usage for this request was already recorded.",
    "uq_admin_tokens_name": "An admin token with this name already exists.",
    "pk_tenant_models": "The tenant already has access to this model.",
    "uq_access_requests_pending": "A request for this model is already waiting for an operator.",
    "uq_api_keys_playground_per_user": "You already have a playground key; try again.",
    "ck_tenants_name_slug": "Names are lower-case letters, digits and '-', at most 64 characters.",
    "ck_deployments_name_slug": "Names are lower-case letters, digits and '-', at most 63 characters.",
    "ck_deployments_prefill_range": "Prefill replicas: min must be >= 0 and <= max.",
    "ck_deployments_decode_range": "Decode replicas: min must be >= 0 and <= max, and max >= 1.",
    "ck_deployments_pd_needs_connector_and_prefill": "P/D mode needs a KV connector and a prefill pool.",
}


def translate(exc: DBAPIError) -> errors.BatonError:
    """Maps one driver exception to a Baton error; never passes the driver's text to a client."""
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or ""
    diag = getattr(orig, "diag", None)
    constraint = getattr(diag, "constraint_name", None) or ""
    column = getattr(diag, "column_name", None)
    primary = getattr(diag, "message_primary", None) or ""
    known = CONSTRAINT_MESSAGES.get(constraint)
    if isinstance(exc, IntegrityError) or sqlstate.startswith("23"):
        if sqlstate == _UNIQUE:
            return errors.ConflictError(known or "A record with these values already exists.")
        if sqlstate == _FOREIGN_KEY:
            m = _FK_NAME.match(constraint)
            what = m.group("ref").removesuffix("s").replace("_", " ") if m else "record"
            if primary.startswith("update or delete"):
                return errors.ConflictError(f"This {what} is still in use and cannot be removed.")
            return errors.NotFoundError(f"The referenced {what} does not exist.",
                                        param=m.group("column") if m else None)
        if sqlstate == _NOT_NULL:
            return errors.ValidationError(f"'{column}' is required.", param=column)
        if sqlstate == _CHECK:
            return errors.ValidationError(known or "A value is outside its allowed range.")
        return errors.ValidationError("The record is not valid.")
    # Data exceptions (bad text representation, value too long, ...), and values the driver itself
    # refuses before sending them (a NUL character in a text field).
    if sqlstate.startswith("22") or (isinstance(exc, DataError) and not sqlstate):
        return errors.ValidationError("A value has the wrong type or is too long.")
    if sqlstate == "57014":
        return errors.UnavailableError("The database took too long to answer.")
    if isinstance(exc, OperationalError) or sqlstate.startswith("08"):
        return errors.UnavailableError("The database is unavailable.")
    return errors.ServerError()
