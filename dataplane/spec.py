"""The deployment spec: what the control plane stores and what the data-plane builders consume.

Every model is strict (``extra="forbid"``) and every field carries a description, so a spec with a
typo, a P/D deployment without a KV connector or an inverted replica range is rejected here, with a
readable pydantic ``ValidationError``, before anything reaches Ray. This module imports neither ray
nor vllm.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DeploymentMode = Literal["aggregated", "pd"]
DeviceKind = Literal["cpu", "gpu"]
KVConnectorKind = Literal["nixl", "none"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Strict):
    """Which weights to load and under which name clients call them."""

    path: str = Field(
        min_length=1,
        description="Local model folder (e.g. the output of `baton model make-tiny`) or a Hugging Face "
        "repository id already present in the local cache; nothing is downloaded at run time.",
    )
    served_name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="The model name clients send in the OpenAI `model` field.",
    )
    kind: Literal["generate", "embed"] = Field(
        default="generate",
        description="`generate`: chat and completions; `embed`: embeddings through vLLM's pooling runner "
        "(aggregated only: there is no decode).",
    )
    tool_call_parser: str | None = Field(
        default=None, pattern=r"^[a-z0-9_]+$",
        description="vLLM tool-call parser (e.g. `hermes`); with one, the engine accepts `tool_choice: auto`.",
    )
    reasoning_parser: str | None = Field(
        default=None, pattern=r"^[a-z0-9_]+$", description="vLLM reasoning parser (e.g. `deepseek_r1`)."
    )
    chat_template: str | None = Field(
        default=None, min_length=1, description="Jinja chat template replacing the model's own."
    )


class ReplicaRange(_Strict):
    """Autoscaling bounds of one pool of engine replicas."""

    min: int = Field(default=1, ge=0, description="Fewest replicas the pool scales down to.")
    max: int = Field(default=1, ge=1, description="Most replicas the pool scales up to.")
    target_ongoing_requests: int | None = Field(
        default=None,
        ge=1,
        description="Ongoing requests per replica that autoscaling aims at (Ray Serve's default if unset).",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"replica range inverted: min ({self.min}) > max ({self.max})")
        return self

    @property
    def initial(self) -> int:
        """Replicas started before autoscaling has any data (at least one, so the pool can serve)."""
        return max(self.min, 1)


class EngineSettings(_Strict):
    """vLLM engine settings. Fields left unset take the device profile's default."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        default=None, description="Weight/activation dtype. Profile default: cpu float32, gpu bfloat16."
    )
    max_model_len: int = Field(default=4096, ge=16, description="Longest prompt + completion, in tokens.")
    max_num_seqs: int = Field(default=16, ge=1, description="Most sequences an engine batches at once.")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=16, description="Token budget of one scheduler step (vLLM's default if unset)."
    )
    enforce_eager: bool | None = Field(
        default=None,
        description="Disable CUDA graphs / torch.compile. Profile default: cpu true (compiling doubles load "
        "time for nothing at small sizes), gpu false.",
    )
    enable_prefix_caching: bool = Field(default=True, description="vLLM's in-engine prefix cache.")
    kv_cache_space_gib: float | None = Field(
        default=None,
        gt=0,
        description="CPU only: KV cache size per engine in GiB (VLLM_CPU_KVCACHE_SPACE). Profile default 1.",
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="GPU only: fraction of GPU memory vLLM may use. Default 0.9."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs (or CPU ranks) per replica.")
    seed: int = Field(default=0, description="Engine sampling seed.")


class LMCacheTiers(_Strict):
    """LMCache KV tiers. Keys include the model, the chunk's token hash and the tenant's cache salt."""

    chunk_size: int = Field(
        default=256,
        ge=128,
        multiple_of=128,
        description="Tokens per stored chunk; a multiple of the CPU backend's KV block size (128).",
    )
    local_cpu_gib: float = Field(
        default=1.0, ge=0, description="Local CPU-memory tier size per engine in GiB (0 disables it)."
    )
    local_disk_path: str | None = Field(default=None, description="Directory of the disk tier (unset: no disk tier).")
    disk_kind: Literal["fs", "local_disk"] = Field(
        default="fs",
        description="`fs`: LMCache's fs storage plugin, persistent across restarts and shareable between "
        "engines, no size limit; `local_disk`: LMCache's local disk backend, size-limited by "
        "local_disk_gib, index kept in memory (lost on restart).",
    )
    local_disk_gib: float = Field(default=4.0, gt=0, description="Size limit of a `local_disk` tier in GiB.")
    redis_url: str | None = Field(
        default=None,
        pattern=r"^rediss?://",
        description="Remote tier shared by all engines of the model, e.g. redis://127.0.0.1:6379.",
    )

    @property
    def enabled_tiers(self) -> list[str]:
        tiers = ["cpu"] if self.local_cpu_gib > 0 else []
        if self.local_disk_path:
            tiers.append("disk")
        if self.redis_url:
            tiers.append("redis")
        return tiers


class TelemetryRef(_Strict):
    """Where the data plane sends spans and per-request facts (rendered into the replicas' env)."""

    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP endpoint (e.g. http://collector:4318); also given to vLLM."
    )
    link_bandwidth_gbps: float = Field(default=1.9, gt=0, description="KV link bandwidth for the handoff's ideal time.")
    facts_redis_url: str | None = Field(
        default=None, description="Redis for per-request facts (handoff, recovery); default: the LMCache Redis tier."
    )
    enabled: bool = Field(default=True, description="Create data-plane spans at all.")


class KVTransferSettings(_Strict):
    """How KV moves between engines: the P/D transport and the LMCache tiers."""

    connector: KVConnectorKind = Field(
        default="none", description="P->D transport: `nixl` (NixlConnector) or `none` (aggregated only)."
    )
    lmcache: LMCacheTiers | None = Field(
        default=None, description="LMCache tiers (local CPU, disk, Redis); unset disables LMCache."
    )
    nixl_backends: list[str] = Field(default=["UCX"], min_length=1, description="NIXL transport backends.")
    nixl_progress_wakeup_ms: float | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="How NIXL's UCX progress thread waits between events. A period in ms: it sleeps on UCX's "
        "wake-up fds and wakes at least this often (a safety net for a lost event; transfers complete on the "
        "events). 0: it busy-polls, a whole core per engine, for the lowest completion latency on RDMA. "
        "Profile default: cpu 10 ms (cores are scarce, loopback transfers gain nothing from polling), "
        "gpu 0 (NIXL's own default).",
    )
    nixl_idle_step_pause_ms: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Pause (ms) before an engine step that computes nothing while KV is held for the decode "
        "side or awaited from prefill: vLLM otherwise steps such an engine in a loop to see the notification "
        "or the finished transfer at once. It bounds what the pause adds to noticing either. Profile default: "
        "cpu 1 ms, gpu 0 (vLLM's loop).",
    )
    nixl_port_base: int = Field(
        default=20000,
        ge=1024,
        le=60000,
        description="First NIXL side-channel port of the prefill pool (replica rank is added); the decode "
        "pool uses base + 2000. Give each deployment sharing a host its own range.",
    )


class DeploymentSpec(_Strict):
    """A model deployment: one Ray Serve application."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        description="Deployment name (DNS label); also the Ray Serve application name.",
    )
    model: ModelRef = Field(description="The weights and the served model name.")
    mode: DeploymentMode = Field(
        default="aggregated",
        description="`aggregated`: each replica prefills and decodes; `pd`: prefill and decode pools "
        "with KV handed off by the connector.",
    )
    device: DeviceKind = Field(default="cpu", description="Device profile that renders engine settings/env.")
    accelerator_type: str | None = Field(
        default=None, description="GPU only: Ray accelerator type to schedule on, e.g. `H100`."
    )
    replicas: ReplicaRange = Field(
        default_factory=ReplicaRange, description="Aggregated mode: the one pool's replica range."
    )
    prefill: ReplicaRange = Field(default_factory=ReplicaRange, description="P/D mode: prefill pool range.")
    decode: ReplicaRange = Field(default_factory=ReplicaRange, description="P/D mode: decode pool range.")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="vLLM engine settings.")
    kv: KVTransferSettings = Field(default_factory=KVTransferSettings, description="KV transport and tiers.")
    cpus_per_replica: float = Field(
        default=0.5,
        gt=0,
        description="CPU only: CPUs each engine replica reserves in Ray (fractional, so a 2-core machine "
        "can hold 4 replicas).",
    )
    route_prefix: str = Field(default="/", pattern=r"^/", description="HTTP route of the app in Ray Serve.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables for engine replicas (they override the profile's).",
    )
    telemetry: TelemetryRef = Field(default_factory=TelemetryRef, description="Spans and per-request facts.")

    @model_validator(mode="after")
    def _coherent(self) -> DeploymentSpec:
        if self.model.kind == "embed":
            if self.mode != "aggregated" or self.kv.connector != "none" or self.kv.lmcache is not None:
                raise ValueError("an embedding model is served aggregated, without KV transport or LMCache "
                                 "(there is no decode)")
            if self.model.tool_call_parser or self.model.reasoning_parser:
                raise ValueError("an embedding model has no tool-call or reasoning parser")
        if self.mode == "pd" and self.kv.connector == "none":
            raise ValueError("mode 'pd' needs a KV connector (kv.connector: nixl) to hand KV from prefill to decode")
        if self.device == "cpu":
            if self.accelerator_type is not None:
                raise ValueError("accelerator_type is for the gpu device profile only")
            if self.engine.gpu_memory_utilization is not None:
                raise ValueError("engine.gpu_memory_utilization is for the gpu device profile only")
        if self.device == "gpu" and self.engine.kv_cache_space_gib is not None:
            raise ValueError("engine.kv_cache_space_gib is for the cpu device profile only")
        if self.kv.lmcache and self.engine.max_model_len < self.kv.lmcache.chunk_size:
            raise ValueError("engine.max_model_len is shorter than one LMCache chunk")
        return self
