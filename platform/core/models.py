"""The control plane's schema: SQLAlchemy 2 declarative models.

Alembic's first migration creates exactly this (autogenerate finds no difference); the migration adds
what ORM metadata cannot say: the service role, its grants and the row-level-security policies of the
tenant-scoped tables (:data:`TENANT_SCOPED_TABLES`).
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Tables whose rows belong to one tenant; each has a ``tenant_id`` column and an RLS policy.
TENANT_SCOPED_TABLES = (
    "users",
    "api_keys",
    "tenant_models",
    "rate_limits",
    "usage_records",
    "usage_daily",
    "request_records",
    "console_sessions",
    "access_requests",
    "stored_responses",
    "files",
    "file_parts",
    "batches",
    "batch_lines",
)

#: Append-only tables: the service role may insert and read, never change or delete.
APPEND_ONLY_TABLES = ("audit_log",)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _uuid_pk() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()"))


def _created_at() -> Mapped[dt.datetime]:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


def _updated_at() -> Mapped[dt.datetime]:
    return mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), onupdate=func.now()
    )


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    # VARCHAR + CHECK rather than a native enum type: adding a value later is a one-line migration.
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda e: [m.value for m in e],
        validate_strings=True,
    )


def _tenant_fk(ondelete: str = "CASCADE") -> Mapped[uuid.UUID]:
    return mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete=ondelete), nullable=False, index=True
    )


class TenantStatus(enum.StrEnum):
    ACTIVE = "active"
    SUSPENDED = "suspended"


class UserRole(enum.StrEnum):
    TENANT_ADMIN = "tenant_admin"
    TENANT_MEMBER = "tenant_member"
    OPERATOR = "operator"


class DeploymentMode(enum.StrEnum):
    AGGREGATED = "aggregated"
    PD = "pd"


class DesiredState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    DELETED = "deleted"


class ObservedState(enum.StrEnum):
    PENDING = "pending"
    DEPLOYING = "deploying"
    RUNNING = "running"
    UNHEALTHY = "unhealthy"
    FAILED = "failed"
    STOPPED = "stopped"
    DELETED = "deleted"


class RequestStatus(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class KeyKind(enum.StrEnum):
    STANDARD = "standard"
    #: Short-lived, one model, at most one live per console user (the playground's).
    PLAYGROUND = "playground"


class AccessRequestState(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DECLINED = "declined"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    display_name: Mapped[str] = mapped_column(String(200), nullable=False)
    status: Mapped[TenantStatus] = mapped_column(
        _enum(TenantStatus, "tenant_status"), nullable=False, server_default=TenantStatus.ACTIVE.value
    )
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'"))
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = _updated_at()

    __mapper_args__ = {"version_id_col": version}
    __table_args__ = (CheckConstraint("name ~ '^[a-z0-9][a-z0-9-]{0,63}$'", name="name_slug"),)


class User(Base):
    """A console login: a tenant's admin or member, or a platform operator (no tenant)."""

    __tablename__ = "users"

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    email: Mapped[str] = mapped_column(String(320), nullable=False)
    password_hash: Mapped[str] = mapped_column(Text, nullable=False)
    role: Mapped[UserRole] = mapped_column(_enum(UserRole, "user_role"), nullable=False)
    disabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    created_at: Mapped[dt.datetime] = _created_at()
    last_login_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        CheckConstraint("(role = 'operator') = (tenant_id IS NULL)", name="operator_has_no_tenant"),
        Index("uq_users_email_lower", func.lower(email), unique=True),
    )


class ApiKey(Base):
    """A tenant's API key. Only an HMAC of the secret is kept; ``prefix`` is the visible part."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    name: Mapped[str] = mapped_column(String(100), nullable=False)
    prefix: Mapped[str] = mapped_column(String(32), nullable=False)
    key_hash: Mapped[bytes] = mapped_column(LargeBinary(32), nullable=False, unique=True)
    # Models this key may use; empty means every model the tenant may use.
    model_scope: Mapped[list[str]] = mapped_column(
        ARRAY(String(200)), nullable=False, server_default=text("'{}'")
    )
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    rotated_to_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="SET NULL")
    )
    created_by: Mapped[str] = mapped_column(String(200), nullable=False)
    created_at: Mapped[dt.datetime] = _created_at()
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    kind: Mapped[KeyKind] = mapped_column(
        _enum(KeyKind, "key_kind"), nullable=False, server_default=KeyKind.STANDARD.value
    )
    # The fingerprint of the key secret the hash was made with (``secrets.secret_fingerprint``); null for
    # keys made before Baton kept it.
    secret_fingerprint: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (
        # One live key per name and tenant; a rotated or revoked key gives its name up.
        Index(
            "uq_api_keys_tenant_id_name_live",
            "tenant_id",
            "name",
            unique=True,
            postgresql_where=text("revoked_at IS NULL AND rotated_to_id IS NULL"),
        ),
        # One unrevoked playground key per console user (``created_by`` is ``console:<email>``).
        Index(
            "uq_api_keys_playground_per_user",
            "tenant_id",
            "created_by",
            unique=True,
            postgresql_where=text("kind = 'playground' AND revoked_at IS NULL"),
        ),
    )


class Model(Base):
    """A model in the platform's catalogue, with the shape the planner needs."""

    __tablename__ = "models"

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(200), nullable=False, unique=True)
    source: Mapped[str] = mapped_column(Text, nullable=False)
    context_length: Mapped[int] = mapped_column(Integer, nullable=False)
    num_layers: Mapped[int] = mapped_column(Integer, nullable=False)
    num_kv_heads: Mapped[int] = mapped_column(Integer, nullable=False)
    head_dim: Mapped[int] = mapped_column(Integer, nullable=False)
    dtype: Mapped[str] = mapped_column(String(16), nullable=False)
    params_b: Mapped[float | None] = mapped_column(Float)
    #: ``generate`` (chat and completions) or ``embed`` (``/v1/embeddings``, vLLM's pooling runner).
    kind: Mapped[str] = mapped_column(String(16), nullable=False, default="generate",
                                      server_default=text("'generate'"))
    #: vLLM tool-call parser (e.g. ``hermes``): ``tool_choice="auto"`` needs one.
    tool_call_parser: Mapped[str | None] = mapped_column(String(64))
    #: vLLM reasoning parser (e.g. ``deepseek_r1``): the answer's reasoning goes to ``reasoning_content``.
    reasoning_parser: Mapped[str | None] = mapped_column(String(64))
    #: A Jinja chat template replacing the model's own (e.g. one that renders tools).
    chat_template: Mapped[str | None] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = _updated_at()

    __mapper_args__ = {"version_id_col": version}
    __table_args__ = (
        CheckConstraint(
            "context_length > 0 AND num_layers > 0 AND num_kv_heads > 0 AND head_dim > 0", name="shape"
        ),
        CheckConstraint("dtype IN ('float32', 'bfloat16', 'float16', 'fp8', 'int8')", name="dtype"),
        CheckConstraint("kind IN ('generate', 'embed')", name="kind"),
        CheckConstraint("kind = 'generate' OR (tool_call_parser IS NULL AND reasoning_parser IS NULL)",
                        name="embed_serving"),
    )


class TenantModel(Base):
    """Grants a tenant the use of a model."""

    __tablename__ = "tenant_models"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("models.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[dt.datetime] = _created_at()


class AccessRequest(Base):
    """A tenant's request to use a model (``model_id`` NULL: any model, the operator chooses), and how
    an operator answered it. Sign-up without a default grant files one."""

    __tablename__ = "access_requests"

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    model_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("models.id", ondelete="CASCADE"), index=True
    )
    note: Mapped[str | None] = mapped_column(String(1000))
    requested_by: Mapped[str] = mapped_column(String(200), nullable=False)
    requested_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    state: Mapped[AccessRequestState] = mapped_column(
        _enum(AccessRequestState, "access_request_state"), nullable=False,
        server_default=AccessRequestState.PENDING.value,
    )
    resolved_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    resolved_by: Mapped[str | None] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(String(1000))

    __table_args__ = (
        CheckConstraint("(state = 'pending') = (resolved_at IS NULL)", name="resolved_unless_pending"),
        # One pending request per tenant and model (and one for "any model").
        Index(
            "uq_access_requests_pending",
            "tenant_id",
            text("coalesce(model_id, '00000000-0000-0000-0000-000000000000'::uuid)"),
            unique=True,
            postgresql_where=text("state = 'pending'"),
        ),
        Index("ix_access_requests_state_requested_at", "state", "requested_at"),
    )


class StoredResponse(Base):
    """A ``/v1/responses`` answer kept for ``previous_response_id`` and ``GET /v1/responses/{id}`` until
    ``expires_at`` (``gateway.responses_retention_days``)."""

    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="SET NULL"), index=True
    )
    model: Mapped[str] = mapped_column(String(200), nullable=False)
    previous_response_id: Mapped[str | None] = mapped_column(String(64))
    #: The conversation up to and with this answer, as chat messages (instructions are not carried over).
    conversation: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False)
    #: The response object as the client received it.
    body: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[dt.datetime] = _created_at()
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, index=True)


class StoredFile(Base):
    """A file of ``/v1/files`` (a batch's input, output or errors); its bytes are in :class:`FilePart` rows."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="SET NULL"), index=True
    )
    purpose: Mapped[str] = mapped_column(String(32), nullable=False)
    filename: Mapped[str] = mapped_column(String(255), nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    #: Lines of a ``batch`` file (counted as it is stored).
    lines: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    created_at: Mapped[dt.datetime] = _created_at()
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), index=True)


class FilePart(Base):
    """One piece of a stored file, in order (``seq``): a file is read and written a part at a time."""

    __tablename__ = "file_parts"

    file_id: Mapped[str] = mapped_column(String(64), ForeignKey("files.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Batch(Base):
    """A ``/v1/batches`` batch: one endpoint, one model, its lines in :class:`BatchLine` rows."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    #: The key that created it: its lines run as that key (its limits, its models); None once deleted.
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="SET NULL"), index=True
    )
    endpoint: Mapped[str] = mapped_column(String(64), nullable=False)
    model: Mapped[str] = mapped_column(String(200), nullable=False, index=True)
    input_file_id: Mapped[str] = mapped_column(String(64), nullable=False)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16), nullable=False)
    #: validating | in_progress | finalizing | completed | failed | expired | cancelling | cancelled
    status: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    total: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB(none_as_null=True))
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    created_at: Mapped[dt.datetime] = _created_at()
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    in_progress_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finalizing_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    expired_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    cancelling_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    cancelled_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class BatchLine(Base):
    """One request of a batch. ``state``: pending -> running (claimed under a lease, ``attempt`` the fencing
    token) -> done | failed; pending or running lines of an expired or cancelled batch end ``expired`` or
    ``cancelled``. A result is written only by the attempt that holds the line, so a line is in the
    output once however often it ran."""

    __tablename__ = "batch_lines"

    batch_id: Mapped[str] = mapped_column(String(64), ForeignKey("batches.id", ondelete="CASCADE"),
                                          primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )
    custom_id: Mapped[str] = mapped_column(String(512), nullable=False)
    #: The request's body, JSON as bytes (JSONB cannot hold a NUL character, which a prompt or an answer may).
    body: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default=text("'pending'"))
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    lease_until: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: When a line put back (limits, a busy pool) may be claimed again.
    not_before: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    #: OpenAI's ``response`` of the output line, ``{"status_code", "request_id", "body"}``, JSON as bytes (the
    #: engine's answer as it came: a generated NUL character is ``\u0000`` in it, which JSONB refuses).
    response: Mapped[bytes | None] = mapped_column(LargeBinary)
    #: OpenAI's ``error`` of a line that did not run: ``{"code", "message"}``.
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("ix_batch_lines_open", "batch_id", "state", postgresql_where=text("state IN ('pending', 'running')")),
        UniqueConstraint("batch_id", "custom_id"),
    )


class SloPolicy(Base):
    __tablename__ = "slo_policies"

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(100), nullable=False, unique=True)
    ttft_ms: Mapped[int] = mapped_column(Integer, nullable=False)
    tpot_ms: Mapped[int] = mapped_column(Integer, nullable=False)
    percentile: Mapped[float] = mapped_column(Numeric(5, 2), nullable=False, server_default=text("99"))
    priority: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    sheddable: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    #: The policy's tenants' share of their band's tokens under flow control, relative to the others' (1 = equal).
    weight: Mapped[float] = mapped_column(Float, nullable=False, server_default=text("1"))
    #: The longest a request of the policy's class waits in a model's queue (null: the gateway's setting).
    max_wait_s: Mapped[float | None] = mapped_column(Float)
    #: How many of one tenant's requests may wait in a model's queue at once, per gateway process (null: no
    #: bound but the queue's own size).
    max_waiting: Mapped[int | None] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = _updated_at()

    __mapper_args__ = {"version_id_col": version}
    __table_args__ = (
        CheckConstraint("ttft_ms > 0 AND tpot_ms > 0", name="targets_positive"),
        CheckConstraint("percentile > 0 AND percentile <= 100", name="percentile_range"),
        CheckConstraint("priority BETWEEN 0 AND 100", name="priority_range"),
        CheckConstraint("weight > 0 AND weight <= 100", name="weight_range"),
        CheckConstraint("max_wait_s > 0 AND max_wait_s <= 3600", name="max_wait_range"),
        CheckConstraint("max_waiting >= 1 AND max_waiting <= 100000", name="max_waiting_range"),
    )


class SloAssignment(Base):
    """Applies a policy to a tenant, a model, or a tenant on one model (the most specific wins)."""

    __tablename__ = "slo_assignments"

    id: Mapped[uuid.UUID] = _uuid_pk()
    policy_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("slo_policies.id", ondelete="CASCADE"), nullable=False, index=True
    )
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    model_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("models.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[dt.datetime] = _created_at()

    __table_args__ = (
        CheckConstraint("tenant_id IS NOT NULL OR model_id IS NOT NULL", name="has_target"),
        UniqueConstraint("tenant_id", "model_id", postgresql_nulls_not_distinct=True),
    )


class Deployment(Base):
    """Desired state of one model's serving app, and what the reconciler last observed."""

    __tablename__ = "deployments"

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(63), nullable=False, unique=True)
    model_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("models.id", ondelete="RESTRICT"), nullable=False, index=True
    )
    mode: Mapped[DeploymentMode] = mapped_column(_enum(DeploymentMode, "deployment_mode"), nullable=False)
    prefill_min_replicas: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    prefill_max_replicas: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    decode_min_replicas: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    decode_max_replicas: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    engine_settings: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'")
    )
    kv_connector: Mapped[str | None] = mapped_column(String(32))
    lmcache: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    device_profile: Mapped[str] = mapped_column(String(16), nullable=False, server_default="cpu")
    slo_policy_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("slo_policies.id", ondelete="SET NULL"), index=True
    )
    desired_state: Mapped[DesiredState] = mapped_column(
        _enum(DesiredState, "desired_state"), nullable=False, server_default=DesiredState.RUNNING.value
    )
    observed_state: Mapped[ObservedState] = mapped_column(
        _enum(ObservedState, "observed_state"), nullable=False, server_default=ObservedState.PENDING.value
    )
    observed_reason: Mapped[str | None] = mapped_column(Text)
    observed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Bumped on every change of the desired spec; the reconciler records which one it applied.
    generation: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    observed_generation: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    # The reconciler's own memory (plain UPDATEs, the ETag stays): the last generation seen running with its
    # Serve application entries, ``{"generation": g, "applications": [...]}`` (what it sends again when a
    # newer one fails to start), and a generation that failed to start in Ray with why (while it is the
    # row's generation, the last good one is sent instead).
    last_good: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    failed_generation: Mapped[int | None] = mapped_column(Integer)
    failed_reason: Mapped[str | None] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = _updated_at()

    __mapper_args__ = {"version_id_col": version}
    __table_args__ = (
        CheckConstraint("name ~ '^[a-z0-9][a-z0-9-]{0,62}$'", name="name_slug"),
        CheckConstraint(
            "prefill_min_replicas >= 0 AND prefill_min_replicas <= prefill_max_replicas", name="prefill_range"
        ),
        CheckConstraint(
            "decode_min_replicas >= 0 AND decode_min_replicas <= decode_max_replicas "
            "AND decode_max_replicas >= 1",
            name="decode_range",
        ),
        CheckConstraint(
            "mode = 'aggregated' OR (kv_connector IS NOT NULL AND prefill_max_replicas >= 1)",
            name="pd_needs_connector_and_prefill",
        ),
        CheckConstraint("device_profile IN ('cpu', 'gpu')", name="device_profile"),
    )


class RateLimit(Base):
    """Limits for a whole tenant (``api_key_id`` NULL) or for one of its keys."""

    __tablename__ = "rate_limits"

    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="CASCADE"), index=True
    )
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    #: One request's tokens at most: its prompt and the completion it may ask for, together (a cost cap;
    #: a larger request is refused before an engine sees it).
    max_tokens_per_request: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[dt.datetime] = _updated_at()

    __table_args__ = (
        UniqueConstraint("tenant_id", "api_key_id", postgresql_nulls_not_distinct=True),
        CheckConstraint(
            "coalesce(requests_per_minute, 1) > 0 AND coalesce(tokens_per_minute, 1) > 0 "
            "AND coalesce(max_concurrency, 1) > 0 AND coalesce(max_tokens_per_request, 1) > 0",
            name="positive",
        ),
    )


class UsageRecord(Base):
    """Exactly one per completed request (``request_id`` is unique: writes are idempotent)."""

    __tablename__ = "usage_records"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    request_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False, unique=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="SET NULL"), index=True
    )
    model: Mapped[str] = mapped_column(String(200), nullable=False)
    prompt_tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    completion_tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    cached_tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    #: The batch the request was a line of (None: sent by a client itself).
    batch_id: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[dt.datetime] = _created_at()

    __table_args__ = (
        Index("ix_usage_records_tenant_id_created_at", "tenant_id", "created_at"),
        CheckConstraint(
            "prompt_tokens >= 0 AND completion_tokens >= 0 AND cached_tokens >= 0", name="non_negative"
        ),
    )


class UsageDaily(Base):
    """Usage rolled up per tenant, day and model (a Celery job keeps it current)."""

    __tablename__ = "usage_daily"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)


class RequestRecord(Base):
    """What happened to one request: timings, KV handoff, recovery steps and its trace."""

    __tablename__ = "request_records"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("api_keys.id", ondelete="SET NULL"), index=True
    )
    model: Mapped[str] = mapped_column(String(200), nullable=False)
    deployment: Mapped[str | None] = mapped_column(String(63))
    endpoint: Mapped[str] = mapped_column(String(64), nullable=False)
    stream: Mapped[bool] = mapped_column(Boolean, nullable=False)
    status: Mapped[RequestStatus] = mapped_column(_enum(RequestStatus, "request_status"), nullable=False)
    http_status: Mapped[int] = mapped_column(Integer, nullable=False)
    error_code: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    itl_p50_ms: Mapped[float | None] = mapped_column(Float)
    itl_p99_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float] = mapped_column(Float, nullable=False)
    kv_bytes: Mapped[int | None] = mapped_column(BigInteger)
    handoff_ms: Mapped[float | None] = mapped_column(Float)
    recovery_steps: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'")
    )
    #: The decode server's measured phases (`baton.core.contracts.Phase` JSON, ms from the request's start);
    #: None where it posted none (aggregated serving, Ray's own P/D flow, records from before 0002).
    phases: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    trace_id: Mapped[str | None] = mapped_column(String(32), index=True)
    #: Time the request waited in the gateway's flow-control queue (None: flow control off, records before 0006).
    queue_ms: Mapped[float | None] = mapped_column(Float)
    #: The SLO class it was queued as (its policy's name, ``default`` without one).
    flow_class: Mapped[str | None] = mapped_column(String(100))
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (
        Index("ix_request_records_tenant_id_started_at", "tenant_id", "started_at"),
        CheckConstraint("finished_at >= started_at", name="time_order"),
    )


class AuditLog(Base):
    """Every mutation, with who did it and the row before and after. Append-only for services."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    action: Mapped[str] = mapped_column(String(100), nullable=False)
    target_type: Mapped[str] = mapped_column(String(64), nullable=False)
    target_id: Mapped[str | None] = mapped_column(String(64))
    # No foreign key: the log outlives what it talks about.
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True), index=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    request_id: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_audit_log_at", "at"),
        Index("ix_audit_log_target_type_target_id", "target_type", "target_id"),
    )


class Job(Base):
    """A background job (deploy, reconcile, rollup, drill) and its outcome."""

    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = _uuid_pk()
    kind: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[JobStatus] = mapped_column(
        _enum(JobStatus, "job_status"), nullable=False, server_default=JobStatus.QUEUED.value
    )
    deployment_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("deployments.id", ondelete="SET NULL"), index=True
    )
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'"))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    task_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = _created_at()
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_jobs_status_created_at", "status", "created_at"),)


class AdminToken(Base):
    """Credentials for /admin/v1, separate from tenant keys; stored as HMACs like them."""

    __tablename__ = "admin_tokens"

    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(100), nullable=False, unique=True)
    prefix: Mapped[str] = mapped_column(String(32), nullable=False)
    token_hash: Mapped[bytes] = mapped_column(LargeBinary(32), nullable=False, unique=True)
    created_at: Mapped[dt.datetime] = _created_at()
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class ConsoleSession(Base):
    """A console sign-in. The cookie holds the secret; the row holds its hash."""

    __tablename__ = "console_sessions"

    id: Mapped[uuid.UUID] = _uuid_pk()
    token_hash: Mapped[bytes] = mapped_column(LargeBinary(32), nullable=False, unique=True)
    user_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True
    )
    # NULL for operators' sessions, like users.tenant_id.
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    csrf_token: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[dt.datetime] = _created_at()
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
