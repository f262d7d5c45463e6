"""Baton's settings: one typed tree, read from ``BATON_*`` environment variables.

Built once at start-up (:func:`load_settings`) and passed down; nothing reads the environment later.
Nested fields use ``__``: ``BATON_DB__URL``, ``BATON_REDIS__URL``, ``BATON_GATEWAY__PORT``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from baton.core.errors import ConfigurationError


class DatabaseSettings(BaseModel):
    url: str = Field(
        "postgresql+psycopg://postgres@127.0.0.1:5432/baton",
        description="Owner connection: migrations and schema management run as this role.",
    )
    app_role: str = Field(
        "baton_app",
        description="Role the services connect as. Neither superuser nor table owner, so row-level "
        "security applies to it.",
    )
    app_url: str | None = Field(
        None, description="Service connection; defaults to `url` with the user replaced by `app_role`."
    )
    pool_size: int = Field(5, ge=1, description="Connections kept per process.")
    statement_timeout_ms: int = Field(5000, ge=0, description="Per-statement timeout for services.")

    def service_url(self) -> str:
        if self.app_url:
            return self.app_url
        from sqlalchemy.engine import make_url  # deferred: SQLAlchemy, which reading settings never needs

        return make_url(self.url).set(username=self.app_role, password=None).render_as_string(
            hide_password=False
        )


class RedisSettings(BaseModel):
    url: str = Field("redis://127.0.0.1:6379/0", description="Rate limits, revocation fan-out, Celery.")
    lmcache_url: str = Field("redis://127.0.0.1:6379", description="LMCache's remote KV tier.")


class RaySettings(BaseModel):
    address: str = Field("127.0.0.1:6380", description="GCS address of the Ray head (`ray start`).")
    dashboard_url: str = Field("http://127.0.0.1:8265", description="Ray dashboard / Serve REST API.")
    token_file: Path = Field(Path.home() / ".ray" / "auth_token", description="Dashboard auth token.")
    serve_http_port: int = Field(8001, description="Ray Serve's HTTP proxy (the gateway owns 8000).")
    serve_host: str = Field(
        "127.0.0.1",
        description="Host the gateway reaches Ray Serve's HTTP proxy on (in Kubernetes: KubeRay's serve "
        "Service, e.g. baton-ray-serve-svc).",
    )
    num_cpus: int = Field(8, ge=1, description="Logical CPUs the local head advertises.")
    metrics_export_port: int = Field(
        8090, ge=1, le=65535, description="Port of the local head's metrics agent: Ray's and the vLLM engines' "
        "Prometheus metrics at http://127.0.0.1:<port>/metrics (`baton up`).")

    @property
    def serve_url(self) -> str:
        return f"http://{self.serve_host}:{self.serve_http_port}"


class FlowControlSettings(BaseModel):
    """The gateway's queue per model between rate limits and the engines (``docs/flow-control.md``)."""

    enabled: bool = Field(True, description="Queue requests per model when its pools are full: priority bands "
                          "from SLO policies, fair share by tokens inside a band, SLO shedding. Off: limits only.")
    queue_max: int = Field(256, ge=1, description="Requests waiting per model and process, all bands together; "
                           "beyond it the lowest band's newest waiter (or the arrival) gets 429.")
    ttl_s: float = Field(30.0, gt=0, description="The longest a request waits for room before its 429.")
    initial_limit: int = Field(8, ge=1, description="A model's concurrency limit when it first has a view.")
    max_limit: int = Field(256, ge=1, description="The largest concurrency limit a model's pools may learn.")
    tolerance: float = Field(1.3, gt=1, description="Time per output token over this multiple of its floor "
                             "shrinks the model's concurrency limit.")
    ttft_tolerance: float = Field(1.3, gt=1, description="Time to first token (after the queue, per prompt-length "
                                  "class) over this multiple of its floor shrinks it too, while two or more tenants "
                                  "use the model (a lone tenant keeps the pools' throughput).")
    window_s: float = Field(300.0, gt=0, description="A latency floor is the smallest of the last two windows.")
    min_samples: int = Field(8, ge=1, description="Completed requests of a model before its limit applies "
                             "(before: no queue, limits only).")


class BatchSettings(BaseModel):
    """The Batch API (``/v1/files``, ``/v1/batches``; docs/batch.md)."""

    enabled: bool = Field(True, description="Serve `/v1/files` and `/v1/batches` and run batches' lines.")
    max_file_bytes: int = Field(
        200 * 2**20, ge=1024, description="Largest file `/v1/files` accepts (bytes), read and stored a part at a "
        "time (never whole in memory).")
    max_lines: int = Field(50_000, ge=1, description="Most requests one batch file may hold.")
    part_bytes: int = Field(2**20, ge=4096, description="Size of the parts a file is stored in (Postgres rows).")
    file_retention_days: float = Field(
        30.0, gt=0, description="How long a batch's output and error files are kept (input files are kept until "
        "deleted).")
    concurrency: int = Field(
        16, ge=1, description="Lines each gateway process has claimed at once, all batches together. With flow "
        "control on, they wait in the model's queue below every interactive band and at most three quarters of "
        "its learned limit go upstream; with it off, this is the cap.")
    lease_s: float = Field(10.0, gt=1, description="How long a claimed line is held without a renewal: a gateway "
                           "that dies mid-line loses its lines to another after this.")
    poll_s: float = Field(1.0, gt=0, description="How often a gateway looks for lines while a batch runs.")
    idle_poll_s: float = Field(5.0, gt=0, description="... and while none runs anywhere (a batch created on "
                               "this gateway starts at once; on another, within this).")
    max_attempts: int = Field(8, ge=1, description="Tries of a line refused for a passing reason (limits, a busy "
                              "or absent pool) before it fails.")


class GatewaySettings(BaseModel):
    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, description="Bind port of the gateway and console.")
    key_cache_ttl_s: float = Field(30.0, gt=0, description="How long a key lookup is cached.")
    upstream_timeout_s: float = Field(300.0, gt=0, description="Total time allowed per upstream call.")
    stream_stall_s: float = Field(
        45.0, gt=0, description="A streaming upstream call silent this long (no response yet, or no chunk) is "
        "broken: with resume on it is retried before the first token and resumed after it."
    )
    token_stall_s: float = Field(
        10.0, gt=0, description="Once a stream has sent its first token, a silence this long between chunks "
        "always breaks it (a stalled replica: resumed with resume on). Longer than the longest engine step under "
        "load. After its first few gaps a stream is held to a shorter silence, relative to its own pace "
        "(token_stall_multiple, token_stall_floor_s)."
    )
    upstream_client: Literal["baton", "httpx"] = Field(
        "baton", description="The HTTP client for upstream calls: Baton's own (httptools; the figure that keeps "
        "it is in docs/benchmarks.md) or httpx."
    )
    redis_client: Literal["baton", "redis-py"] = Field(
        "baton", description="The Redis client admission runs its rate-limit scripts on: Baton's pipelined RESP "
        "connection (plain TCP servers; otherwise redis-py anyway) or redis-py (with hiredis)."
    )
    token_stall_multiple: float = Field(
        4.0, gt=1, description="Once a stream has had 8 gaps between tokens, a silence this many times its longest "
        "gap so far breaks it (within token_stall_floor_s and token_stall_s)."
    )
    token_stall_floor_s: float = Field(
        1.0, gt=0, description="The shortest silence that breaks a running stream however fast its tokens came: "
        "above the slowest step an engine takes for a reason (a long prefill chunk joining its batch). A false "
        "break is resumed exactly but costs a re-prefill."
    )
    token_stall_floor_decode_s: float = Field(
        0.2, gt=0, description="token_stall_floor_s for a stream from a P/D deployment's decode pool: a decode "
        "engine prefills nothing (its prompts' KV arrives over NIXL), so its steps are never long for that "
        "reason, and a stalled decode replica is noticed after this much silence once the stream's pace is known."
    )
    keep_alive_s: float = Field(
        75.0, gt=0, description="How long an idle client connection is kept open. Longer than clients' own idle "
        "expiry (httpx and the OpenAI clients: 5 s), so the gateway never closes a connection that a client "
        "is reusing at that moment (the client would see a reset before any response)."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A request's head (request line and headers) must be whole this long after its "
        "first byte, or the connection gets 408 and is closed."
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body silent this long (no bytes) ends the connection."
    )
    max_unfinished_per_client: int = Field(
        64, ge=1, description="Connections of one client address that may be sending a request head at once "
        "(per gateway process); more are answered 429 and closed. Behind a proxy every client shares its "
        "address: raise it there."
    )
    usage_flush_interval_s: float = Field(0.2, gt=0, description="Usage batch flush interval.")
    usage_batch_size: int = Field(1000, ge=1, description="Usage records per batch write.")
    shutdown_grace_s: float = Field(
        330.0, gt=0, description="On SIGTERM, how long open streams may finish before the process exits "
        "(longer than the upstream timeout, so no accepted stream is cut)."
    )
    upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Static model -> OpenAI base URL routes (e.g. a bare engine in dev/tests). Models not "
        "listed are routed to their running deployment's Serve app: {ray.serve_url}/{deployment name}.",
    )
    fallback_upstreams: dict[str, str] = Field(
        default_factory=dict,
        description="Static model -> OpenAI base URL of a fallback engine for the model in `upstreams` (a P/D "
        "deployment's prefill pool): used when the upstream has no live replica. Deployment routes have theirs.",
    )
    route_cache_ttl_s: float = Field(2.0, gt=0, description="How long deployment routes are cached.")
    upstream_max_connections: int = Field(1000, ge=1, description="Pooled connections to upstreams per process.")
    ratelimit_lease_s: float = Field(
        30.0, gt=0, description="Concurrency lease: renewed while a request runs, expires if its process dies."
    )
    ratelimit_fail_open: bool = Field(
        True, description="When Redis is unreachable: serve without limits (true) or refuse with 503 (false)."
    )
    usage_buffer_max: int = Field(
        100_000, ge=1, description="Unwritten usage records held while Postgres is down; beyond it: 503."
    )
    default_completion_budget: int = Field(
        1024, ge=1, description="Tokens reserved against TPM for a request without max_tokens."
    )
    resume: bool = Field(
        True, description="Resume a stream whose upstream broke (prompt + tokens sent) and retry failed calls."
    )
    resume_budget_s: float = Field(
        90.0, gt=0, description="Time one recovery may take (from a failure until a new upstream stream "
        "answers) before the request fails; a new break later in the stream gets a new budget."
    )
    resume_attempts: int = Field(
        8, ge=0, description="Retries/resumes per request at most (a replica that just died may answer "
        "a few quick 5xx until Ray Serve routes around it)."
    )
    resume_backoff_s: float = Field(0.1, gt=0, description="First wait between attempts (doubles, max 2 s).")
    max_embedding_input_tokens: int = Field(
        300_000, ge=1, description="Input tokens one embeddings call may hold, all its inputs together (OpenAI's "
        "limit): a larger call is refused with 400 before an engine sees it."
    )
    max_request_bytes: int = Field(
        4 * 2**20, ge=1024, description="Largest request body any route accepts (bytes): a larger one is refused "
        "with 413 before it is read whole."
    )
    responses_retention_days: float = Field(
        30.0, gt=0, description="How long a stored `/v1/responses` answer is kept (then GET and "
        "`previous_response_id` no longer find it, and the worker deletes it)."
    )
    last_used_flush_s: float = Field(
        5.0, gt=0, description="How often the keys that authenticated are written as `api_keys.last_used_at` "
        "(one UPDATE per process and period, never on the request path; also on shutdown)."
    )
    flow: FlowControlSettings = Field(default_factory=FlowControlSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)


class SecuritySettings(BaseModel):
    key_secret: SecretStr = Field(
        SecretStr("dev-insecure-key-secret-change-me"),
        description="HMAC-SHA256 secret for API key hashes and cache salts. Set it in production.",
    )
    admin_token: SecretStr | None = Field(
        None, description="Bootstrap admin bearer token for /admin/v1 (hashed before comparison)."
    )
    session_secret: SecretStr = Field(
        SecretStr("dev-insecure-session-secret-change-me"), description="Console session signing."
    )
    secure_cookies: bool = Field(False, description="Mark console cookies Secure (HTTPS deployments).")


class TelemetrySettings(BaseModel):
    enabled: bool = Field(True, description="Create spans at all.")
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP endpoint, e.g. http://collector:4318.")
    service_name: str = Field("baton", description="`service.name` resource attribute.")
    sample_ratio: float = Field(
        1.0, ge=0, le=1, description="Share of new traces recorded (by trace id). A request that arrives with a "
        "`traceparent` follows its caller's decision; trace ids reach request records and engines either way."
    )
    link_bandwidth_gbps: float = Field(
        1.9, gt=0, description="KV link bandwidth (GB/s) used for the handoff's ideal time."
    )
    metrics_token: SecretStr | None = Field(
        None, description="Bearer token a scraper sends to the gateway's /metrics. Unset: /metrics answers "
        "loopback clients only."
    )
    metrics_tenant_labels: bool = Field(
        False, description="Label the gateway's request metrics with tenant ids (every scraper then sees every "
        "tenant's traffic); off: the tenant label is empty."
    )


class ControlSettings(BaseModel):
    reconcile_interval_s: float = Field(30.0, gt=0, description="Beat period of the drift-repair reconcile.")
    apply_attempts: int = Field(4, ge=1, description="Tries of one Serve config PUT before giving up.")
    apply_backoff_s: float = Field(1.0, ge=0, description="First retry delay of a failed apply (doubles).")
    ray_timeout_s: float = Field(15.0, gt=0, description="Timeout of one call to the Ray dashboard.")
    rollup_interval_s: float = Field(900.0, gt=0, description="Beat period of the usage roll-up.")
    expire_keys_interval_s: float = Field(60.0, gt=0, description="Beat period of key expiry.")
    prefill_tokens_per_s: float = Field(
        20000.0, gt=0, description="Prefill throughput of one replica (planner and SLO compilation)."
    )
    decode_step_ms: float = Field(5.0, gt=0, description="One decode step of one replica at batch 1 (ms).")
    decode_ms_per_seq: float = Field(0.3, ge=0, description="Extra decode-step time per batched sequence (ms).")
    mean_prompt_tokens: int = Field(512, ge=1, description="Prompt length assumed when compiling SLOs.")
    check_model_sources: bool = Field(
        True, description="Before Ray sees a deployment, the reconciler checks its model's source on its own host "
        "(the folder exists, config.json parses, the shape matches the catalogue). Turn off where the control "
        "plane cannot see the model volume (the k8s manifests' worker does not mount it)."
    )


class TenancySettings(BaseModel):
    signup_review: bool = Field(
        False,
        description="Sign-ups wait for an operator: the console answers every sign-up alike (202) whether or "
        "not the email is registered, the new organisation is suspended and its admin cannot sign in until an "
        "operator resumes it. Off: the organisation works at once, and a registered email is a 409 (tries count "
        "against the sign-in throttle of the client's address).",
    )
    default_models: list[str] = Field(
        default_factory=list,
        description="Models a new organisation may use from its sign-up (names; [\"*\"]: every model). "
        "Empty: it waits for an operator's grant.",
    )


class ConsoleSettings(BaseModel):
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Origins (scheme://host[:port]) besides the console's own from which a browser may sign "
        "in or sign up, e.g. a front end served elsewhere. A request with another Origin header is refused "
        "(403); one without (a non-browser client) is not.",
    )


class Settings(BaseSettings):
    """The whole tree. Build it with :func:`load_settings` at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="BATON_", env_nested_delimiter="__", env_file=None, extra="ignore"
    )

    env: str = Field("dev", description="dev | test | prod. prod refuses the dev secrets.")
    state_dir: Path = Field(Path("var"), description="Local state: model builds, pid files, logs.")
    db: DatabaseSettings = Field(default_factory=DatabaseSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    tenancy: TenancySettings = Field(default_factory=TenancySettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)

    def check_production(self) -> None:
        """Refuse to run in prod with the development secrets."""
        if self.env != "prod":
            return
        for name, secret in (
            ("BATON_SECURITY__KEY_SECRET", self.security.key_secret),
            ("BATON_SECURITY__SESSION_SECRET", self.security.session_secret),
        ):
            if secret.get_secret_value().startswith("dev-insecure"):
                raise ConfigurationError(f"{name} must be set in production")


def stack_env_file(cwd: Path | None = None) -> Path | None:
    """The settings file ``baton up`` writes: ``$BATON_STATE_DIR/baton.env``, else ``var/baton.env`` in the
    current folder or the nearest folder above it (as git finds ``.git``), so the CLI works from anywhere
    inside the checkout. None when there is none."""
    state = os.environ.get("BATON_STATE_DIR")
    if state:
        path = Path(state) / "baton.env"
        return path if path.is_file() else None
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / "var" / "baton.env"
        if path.is_file():
            return path
    return None


def load_settings(**overrides: object) -> Settings:
    """Settings from ``BATON_*`` variables, the stack's settings file (:func:`stack_env_file`) and
    ``overrides``. Found above the current folder, the file's folder is the state folder too."""
    found = stack_env_file()
    if (found is not None and found.parent != Path("var").resolve() and "state_dir" not in overrides
            and not os.environ.get("BATON_STATE_DIR")):
        overrides = {"state_dir": found.parent, **overrides}
    values: dict[str, Any] = dict(overrides)
    settings = Settings(_env_file=found, **values)
    settings.check_production()
    return settings
