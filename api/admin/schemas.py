"""Request and response bodies of ``/admin/v1`` (``XCreate`` / ``XUpdate`` / ``XPublic`` / ``XsPublic``)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from baton.control.tenancy import AdminTokenView

T = TypeVar("T")

Slug = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", min_length=1, max_length=63)
ModelName = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", min_length=1, max_length=200)
Int32 = Field(ge=0, le=2_147_483_647)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Page(_Out, Generic[T]):
    data: list[T]
    count: int = Field(description="Total number of items matching the filters.")
    limit: int
    offset: int


# --- tenants ----------------------------------------------------------------------------------------

class TenantCreate(_In):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$", max_length=64, description="Slug, unique.")
    display_name: str = Field(min_length=1, max_length=200)
    settings: dict[str, Any] = Field(default_factory=dict, description="Free-form tenant settings.")


class TenantUpdate(_In):
    display_name: str | None = Field(None, min_length=1, max_length=200)
    settings: dict[str, Any] | None = None
    status: Literal["active", "suspended"] | None = None


# --- users ------------------------------------------------------------------------------------------

class UserCreate(_In):
    email: str = Field(pattern=r"^[^@\s\x00]+@[^@\s\x00]+\.[^@\s\x00]+$", max_length=320)
    password: str = Field(min_length=1, max_length=256, description="Baton's password policy (baton.core.passwords: "
                          "12 characters or more, not a common password); kept as argon2.")
    role: Literal["tenant_admin", "tenant_member"] = "tenant_member"


class UserUpdate(_In):
    role: Literal["tenant_admin", "tenant_member"] | None = None
    disabled: bool | None = None
    password: str | None = Field(None, min_length=1, max_length=256, description="As on creation.")


# --- keys -------------------------------------------------------------------------------------------

class KeyCreate(_In):
    name: str = Field(min_length=1, max_length=100)
    model_scope: list[str] = Field(default_factory=list, max_length=100,
                                   description="Models the key may use; empty: all the tenant's models.")
    expires_at: dt.datetime | None = Field(None, description="With a time zone; in the future.")


class KeyRotate(_In):
    overlap_s: int = Field(86_400, ge=0, le=30 * 86_400, description="How long the old key keeps working.")


class KeyPublic(_Out):
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    prefix: str
    model_scope: list[str]
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    rotated_to_id: uuid.UUID | None
    created_by: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    state: str


class KeyIssued(_Out):
    key: KeyPublic
    secret: str = Field(description="The key itself. Shown once; Baton keeps only its hash.")


# --- models -----------------------------------------------------------------------------------------

Dtype = Literal["float32", "bfloat16", "float16", "fp8", "int8"]
ModelKind = Literal["generate", "embed"]
_KIND = ("`generate`: chat and completions; `embed`: `/v1/embeddings` (aggregated deployments only, vLLM's "
         "pooling runner).")
_PARSER = r"^[a-z0-9_]*$"
ToolParserField = Field(None, max_length=64, pattern=_PARSER,
                        description="vLLM tool-call parser (e.g. `hermes`): lets `tool_choice` be `auto`. "
                        "`\"\"` clears it.")
ReasoningParserField = Field(None, max_length=64, pattern=_PARSER,
                             description="vLLM reasoning parser (e.g. `deepseek_r1`). `\"\"` clears it.")
ChatTemplateField = Field(None, max_length=65536,
                          description="A Jinja chat template replacing the model's own. `\"\"` clears it.")


class ModelCreate(_In):
    name: str = ModelName
    source: str = Field(min_length=1, max_length=4096, description="Local folder or cached HF repo id.")
    context_length: int = Field(ge=1, le=10_000_000)
    num_layers: int = Field(ge=1, le=10_000)
    num_kv_heads: int = Field(ge=1, le=10_000)
    head_dim: int = Field(ge=1, le=100_000)
    dtype: Dtype
    params_b: float | None = Field(None, gt=0, le=100_000, description="Parameters, in billions.")
    kind: ModelKind = Field("generate", description=_KIND)
    tool_call_parser: str | None = ToolParserField
    reasoning_parser: str | None = ReasoningParserField
    chat_template: str | None = ChatTemplateField


class ModelUpdate(_In):
    source: str | None = Field(None, min_length=1, max_length=4096)
    context_length: int | None = Field(None, ge=1, le=10_000_000)
    num_layers: int | None = Field(None, ge=1, le=10_000)
    num_kv_heads: int | None = Field(None, ge=1, le=10_000)
    head_dim: int | None = Field(None, ge=1, le=100_000)
    dtype: Dtype | None = None
    params_b: float | None = Field(None, gt=0, le=100_000)
    kind: ModelKind | None = Field(None, description=_KIND)
    tool_call_parser: str | None = ToolParserField
    reasoning_parser: str | None = ReasoningParserField
    chat_template: str | None = ChatTemplateField


# --- deployments ------------------------------------------------------------------------------------

class ReplicaRange(_In):
    min: int = Field(1, ge=0, le=1000)
    max: int = Field(1, ge=0, le=1000)


class DeploymentCreate(_In):
    name: str = Slug
    model_id: uuid.UUID
    mode: Literal["aggregated", "pd"] = "aggregated"
    prefill: ReplicaRange = Field(default_factory=lambda: ReplicaRange(min=0, max=0),
                                  description="P/D mode: the prefill pool.")
    decode: ReplicaRange = Field(default_factory=ReplicaRange,
                                 description="The decode pool (in aggregated mode: the only pool).")
    engine: dict[str, Any] = Field(default_factory=dict, description="vLLM engine settings (DeploymentSpec."
                                   "engine fields) plus placement: cpus_per_replica, accelerator_type, env; "
                                   "and nixl_progress_wakeup_ms, nixl_idle_step_pause_ms (DeploymentSpec.kv).")
    kv_connector: Literal["nixl", "none"] | None = None
    lmcache: dict[str, Any] | None = Field(None, description="LMCache tiers (DeploymentSpec.kv.lmcache).")
    device_profile: Literal["cpu", "gpu"] = "cpu"
    slo_policy_id: uuid.UUID | None = None
    desired_state: Literal["running", "stopped"] = "running"


class DeploymentUpdate(_In):
    mode: Literal["aggregated", "pd"] | None = None
    prefill: ReplicaRange | None = None
    decode: ReplicaRange | None = None
    engine: dict[str, Any] | None = None
    kv_connector: Literal["nixl", "none"] | None = None
    lmcache: dict[str, Any] | None = None
    device_profile: Literal["cpu", "gpu"] | None = None
    slo_policy_id: uuid.UUID | None = None
    desired_state: Literal["running", "stopped"] | None = None


# --- SLO --------------------------------------------------------------------------------------------

WEIGHT_HELP = "Share of the priority band's tokens relative to other tenants' weights (1 = equal)."
MAX_WAIT_HELP = ("The longest a request of this class waits in a model's queue before its 429 (null: the "
                 "gateway's setting, 30 s unless configured).")
MAX_WAITING_HELP = ("How many of one tenant's requests of this class may wait in a model's queue at once, per "
                    "gateway process; more are refused at once with 429 (null: only the queue's own size bounds it).")


class SloPolicyCreate(_In):
    name: str = Field(min_length=1, max_length=100)
    ttft_ms: int = Field(ge=1, le=3_600_000)
    tpot_ms: int = Field(ge=1, le=3_600_000)
    percentile: float = Field(99, gt=0, le=100)
    priority: int = Field(0, ge=0, le=100)
    sheddable: bool = False
    weight: float = Field(1.0, gt=0, le=100, description=WEIGHT_HELP)
    max_wait_s: float | None = Field(None, gt=0, le=3600, description=MAX_WAIT_HELP)
    max_waiting: int | None = Field(None, ge=1, le=100_000, description=MAX_WAITING_HELP)


class SloPolicyUpdate(_In):
    ttft_ms: int | None = Field(None, ge=1, le=3_600_000)
    tpot_ms: int | None = Field(None, ge=1, le=3_600_000)
    percentile: float | None = Field(None, gt=0, le=100)
    priority: int | None = Field(None, ge=0, le=100)
    sheddable: bool | None = None
    weight: float | None = Field(None, gt=0, le=100, description=WEIGHT_HELP)
    max_wait_s: float | None = Field(None, gt=0, le=3600, description=MAX_WAIT_HELP + " Null clears it.")
    max_waiting: int | None = Field(None, ge=1, le=100_000, description=MAX_WAITING_HELP + " Null clears it.")


class SloAssignmentCreate(_In):
    policy_id: uuid.UUID
    tenant_id: uuid.UUID | None = None
    model_id: uuid.UUID | None = None

    @model_validator(mode="after")
    def _has_target(self) -> SloAssignmentCreate:
        if self.tenant_id is None and self.model_id is None:
            raise ValueError("an assignment needs a tenant_id, a model_id, or both")
        return self


# --- rate limits ------------------------------------------------------------------------------------

class RateLimitSet(_In):
    requests_per_minute: int | None = Field(None, ge=1, le=2_147_483_647)
    tokens_per_minute: int | None = Field(None, ge=1, le=2_147_483_647)
    max_concurrency: int | None = Field(None, ge=1, le=2_147_483_647)
    max_tokens_per_request: int | None = Field(
        None, ge=1, le=2_147_483_647, description="One request's tokens at most: its prompt and the completion it "
        "may ask for (`max_tokens`, or what is left of the cap when it gives none), together; a larger request "
        "is a 400 before an engine sees it.")


# --- usage, requests, audit, jobs -------------------------------------------------------------------

class UsagePublic(_Out):
    id: int
    request_id: uuid.UUID
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    batch_id: str | None = None
    created_at: dt.datetime


class UsageDailyPublic(_Out):
    tenant_id: uuid.UUID
    day: dt.date
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class RequestPublic(_Out):
    id: uuid.UUID
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    model: str
    deployment: str | None
    endpoint: str
    stream: bool
    status: str
    http_status: int
    error_code: str | None
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_ms: float
    kv_bytes: int | None
    handoff_ms: float | None
    recovery_steps: list[dict[str, Any]]
    trace_id: str | None
    queue_ms: float | None = Field(None, description="Time the request waited in the gateway's flow-control "
                                   "queue (null: flow control off, or a record from before it).")
    flow_class: str | None = Field(None, description="The SLO class it was queued as: its policy's name, "
                                   "`default` without one.")
    started_at: dt.datetime
    finished_at: dt.datetime


class AuditPublic(_Out):
    id: int
    at: dt.datetime
    actor: str
    action: str
    target_type: str
    target_id: str | None
    target_name: str | None = Field(None, description="The target's name today (or as the entry recorded it, "
                                                      "if it is gone).")
    tenant_id: uuid.UUID | None
    tenant_name: str | None = Field(None, description="The tenant's name today.")
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    request_id: str | None


class JobPublic(_Out):
    id: uuid.UUID
    kind: str
    status: str
    deployment_id: uuid.UUID | None
    payload: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    attempts: int
    task_id: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


# --- flow control -----------------------------------------------------------------------------------


# --- admin tokens -----------------------------------------------------------------------------------

class AdminTokenCreate(_In):
    name: str = Field(min_length=1, max_length=100)


class AdminTokenIssued(_Out):
    token: AdminTokenView
    secret: str = Field(description="The token itself. Shown once; Baton keeps only its hash.")


# --- access requests --------------------------------------------------------------------------------


class AccessApprove(_In):
    model_id: uuid.UUID | None = Field(
        None, description="The model to grant: required for a request for any model; else the requested one.")


class AccessDecline(_In):
    reason: str | None = Field(None, max_length=1000, description="Shown to the organisation.")
