"""Pure renderers: DeploymentSpec -> Ray Serve LLM configs and Serve application entries.

Nothing here imports ray or vllm, so the control plane, the k8s manifests and the tests share one
renderer. `baton.dataplane.app` turns the rendered dicts into Ray objects.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from baton.core.contracts import PrefillPolicy, ReplicaEnv, ReplicaTelemetry
from baton.dataplane.nixl_progress import EXTRA_CONFIG_KEY as NIXL_PROGRESS_KEY
from baton.dataplane.nixl_progress import IDLE_PAUSE_KEY as NIXL_IDLE_PAUSE_KEY
from baton.dataplane.spec import DeploymentSpec, LMCacheTiers, ReplicaRange

Role = Literal["aggregated", "prefill", "decode"]

NIXL_DECODE_PORT_OFFSET = 2000
APP_IMPORT_PATH = "baton.dataplane.app:build_app"
LMCACHE_CONNECTOR_MODULE = "baton.dataplane.kv_connector"
# vLLM's NixlConnector, subclassed to time each transfer inside the engine (same name, Baton's module).
NIXL_CONNECTOR_MODULE = "baton.dataplane.kv_trace"
LMCACHE_CONNECTOR_CLASS = "BatonLMCacheConnectorV1"

# The NIXL progress thread's wake-up period on CPU hosts (`baton.dataplane.nixl_progress`; NIXL's
# Python API otherwise busy-polls: a core per engine).
CPU_NIXL_PROGRESS_WAKEUP_MS = 10.0
# ... and the pause before an engine step with nothing to compute while KV is held or awaited.
CPU_NIXL_IDLE_STEP_PAUSE_MS = 1.0

#: Every engine replica runs Ray Serve's throughput-optimized preset: its request handling and Baton's code on
#: the replica's own event loop instead of a thread of their own, the handle's router on the caller's loop,
#: gRPC between replicas (the decode server's call to the prefill pool), buffered access logs. Measured
#: against Serve's defaults in one run by ``baton bench path`` (its ``*-pd-ray`` arms; docs/benchmarks.md).
#: A spec's ``env`` can turn it off (``RAY_SERVE_THROUGHPUT_OPTIMIZED: "0"``).
SERVE_PRESET_ENV: dict[str, str] = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}

# Ray Serve LLM's variable naming the vLLM engine class of a replica, and Baton's engine class.
RAY_ENGINE_CLS_ENV = "RAYLLM_VLLM_ENGINE_CLS"
ENGINE_CLS_PATH = "baton.dataplane.engine:BatonVLLMEngine"

# Environment every CPU engine replica gets: keep every listener on loopback, never reach the hub.
CPU_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    "UCX_NET_DEVICES": "lo",
    "UCX_TLS": "tcp,self,sm",
    # Several engines share the cores: let the OS schedule their threads instead of pinning them
    # all to the same core list.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    # OpenMP threads sleep when a parallel region ends instead of spinning for the next one.
    "OMP_WAIT_POLICY": "PASSIVE",
}
# A single-rank CPU engine runs its model inside the engine-core process (`baton.dataplane.engine`): no
# worker process, and no shared-memory queue between the two whose readers spin on sched_yield() for a
# second after every message.
CPU_ENGINE_EXECUTOR = "uni"
# KV that fails to load (missing or partial blocks) is recomputed, never decoded on (vLLM's default: fail).
KV_LOAD_FAILURE_POLICY = "recompute"
GPU_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # RDMA first, then CUDA IPC/copies; UCX picks the best transport among these per peer.
    "UCX_TLS": "rc,ud,cuda_copy,cuda_ipc,tcp",
}


# Ray Serve LLM's flag: the LLM server replica is its app's HTTP ingress (no separate OpenAI ingress
# deployment); `baton.dataplane.app` builds Baton's apps that way when it is set.
DIRECT_STREAMING_ENV = "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"


#: Serve controller's control-loop period on a CPU host (Ray's default 0.1 s: ~5% of a core while idle).
CPU_HOST_CONTROL_LOOP_S = 0.5


def ray_cluster_env(*, haproxy_stats_port: int | None = None, haproxy_metrics_port: int | None = None,
                    direct_ingress_ports: tuple[int, int] | None = None,
                    control_loop_s: float | None = None) -> dict[str, str]:
    """Environment of every Ray node (the head's ``ray start``, KubeRay's containers) that serves Baton's apps.

    - Serve's HTTP ingress is HAProxy, forwarding each request straight to the HTTP port of an ingress
      replica (direct ingress) instead of through Serve's Python proxy actor, and the ingress replica
      is the LLM server itself (direct streaming): gateway -> HAProxy -> engine replica, no Python hop
      between them. Ports: HAProxy's stats and metrics listeners (defaults 8404, 9101) and the
      replicas' range (default 30000-31000) can be moved apart for several heads on one host.
    - Every Ray worker runs in a process group of its own that the raylet kills when the worker ends
      (``process_group_cleanup_enabled``), so a replica's engine processes end with it, also when the
      replica is SIGKILLed.
    - ``control_loop_s``: the Serve controller's loop period (Ray's default 0.1 s unless given; a CPU
      host runs it every :data:`CPU_HOST_CONTROL_LOOP_S`: health checks and scaling react that much
      later, and the idle controller costs a fifth).
    """
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        DIRECT_STREAMING_ENV: "1",
        "RAY_process_group_cleanup_enabled": "1",
    }
    if control_loop_s is not None:
        env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] = repr(control_loop_s)
    if haproxy_stats_port is not None:
        env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(haproxy_stats_port)
    if haproxy_metrics_port is not None:
        env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(haproxy_metrics_port)
    if direct_ingress_ports is not None:
        lo, hi = direct_ingress_ports
        env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(lo)
        env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(hi)
    return env


#: The prefill pool of a P/D deployment is a Serve application of its own (see `prefill_app_name`).
PREFILL_APP_IMPORT_PATH = "baton.dataplane.app:build_prefill_app"
#: Suffix of a P/D deployment's prefill application name and route: a deployment name is a DNS label
#: (no dots), so ``<name>.prefill`` never collides with another deployment.
PREFILL_APP_SUFFIX = ".prefill"


def prefill_app_name(spec: DeploymentSpec) -> str:
    """The Serve application of a P/D deployment's prefill pool.

    The decode server reaches the pool through a handle to it (the prefill step); Serve's HTTP ingress
    reaches it at :func:`prefill_route`, so that when the decode pool has no live replica the gateway
    can send the request, or the rest of a broken stream, to the prefill engine, which decodes as well
    (the aggregated fallback of the recovery ladder)."""
    return spec.name + PREFILL_APP_SUFFIX


def prefill_route(spec: DeploymentSpec) -> str:
    """HTTP route of the prefill application: the deployment's route with the suffix."""
    base = spec.route_prefix.rstrip("/") or f"/{spec.name}"
    return base + PREFILL_APP_SUFFIX


def render_serve_applications(spec: DeploymentSpec) -> list[dict[str, Any]]:
    """The spec's entries in a Ray Serve declarative config (`applications[]`): one app, and for P/D
    a second one for the prefill pool (listed first: the decode servers look its deployment up)."""
    main = {
        "name": spec.name,
        "route_prefix": spec.route_prefix,
        "import_path": APP_IMPORT_PATH,
        "args": spec.model_dump(mode="json"),
    }
    if spec.mode != "pd":
        return [main]
    prefill = {
        "name": prefill_app_name(spec),
        "route_prefix": prefill_route(spec),
        "import_path": PREFILL_APP_IMPORT_PATH,
        "args": spec.model_dump(mode="json"),
    }
    return [prefill, main]


def render_serve_application(spec: DeploymentSpec) -> dict[str, Any]:
    """The spec's main entry in a Ray Serve declarative config (the app clients are routed to)."""
    return render_serve_applications(spec)[-1]


def render_serve_config(
    specs: list[DeploymentSpec], *, http_host: str = "127.0.0.1", http_port: int = 8001
) -> dict[str, Any]:
    """A whole Serve config (what `PUT /api/serve/applications/` takes) for the given specs."""
    return {
        "http_options": {"host": http_host, "port": http_port},
        "applications": [entry for s in specs for entry in render_serve_applications(s)],
    }


def engine_env(spec: DeploymentSpec, role: Role | None = None) -> dict[str, str]:
    """Environment variables of an engine replica under the spec's device profile (``role``: its pool, which
    its engine-load reports name); a spec's ``env`` overrides them."""
    env = dict(CPU_ENV if spec.device == "cpu" else GPU_ENV)
    env.update(SERVE_PRESET_ENV)
    env[RAY_ENGINE_CLS_ENV] = ENGINE_CLS_PATH
    if spec.device == "cpu":
        gib = kv_cache_space_gib(spec)
        if float(gib).is_integer():
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(gib))
    env.update(replica_env(spec, role).to_environ())
    if spec.telemetry.otlp_endpoint:
        # vLLM itself also exports its request spans (`otlp_traces_endpoint`) over OTLP/HTTP, as children
        # of the `traceparent` the decode server passes on.
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        env["OTEL_SERVICE_NAME"] = f"baton-engine-{spec.name}"
    env.update(spec.env)
    return env


def replica_env(spec: DeploymentSpec, role: Role | None = None) -> ReplicaEnv:
    """What Baton's code in the replicas reads (tracing, facts and engine loads, the prefill ladder, the
    engine executor, the pool)."""
    tel = spec.telemetry
    return ReplicaEnv(
        facts_redis_url=tel.facts_redis_url or (spec.kv.lmcache.redis_url if spec.kv.lmcache else None),
        prefill=PrefillPolicy(),
        engine_executor=CPU_ENGINE_EXECUTOR if spec.device == "cpu" else None,
        engine_role=None if role is None else "both" if role == "aggregated" else role,
        telemetry=ReplicaTelemetry(enabled=tel.enabled, otlp_endpoint=tel.otlp_endpoint,
                                   service_name=f"baton-dataplane-{spec.name}",
                                   link_bandwidth_gbps=tel.link_bandwidth_gbps),
    )


def nixl_progress_wakeup_ms(spec: DeploymentSpec) -> float:
    """The NIXL progress thread's wake-up period under the spec's device profile (0: busy-poll)."""
    if spec.kv.nixl_progress_wakeup_ms is not None:
        return spec.kv.nixl_progress_wakeup_ms
    return CPU_NIXL_PROGRESS_WAKEUP_MS if spec.device == "cpu" else 0.0


def nixl_idle_step_pause_ms(spec: DeploymentSpec) -> float:
    """The pause before an empty engine step of a NIXL engine under the device profile (0: vLLM's loop)."""
    if spec.kv.nixl_idle_step_pause_ms is not None:
        return spec.kv.nixl_idle_step_pause_ms
    return CPU_NIXL_IDLE_STEP_PAUSE_MS if spec.device == "cpu" else 0.0


def kv_cache_space_gib(spec: DeploymentSpec) -> float:
    return spec.engine.kv_cache_space_gib if spec.engine.kv_cache_space_gib is not None else 1.0


def engine_kwargs(spec: DeploymentSpec, role: Role) -> dict[str, Any]:
    """vLLM engine arguments for one pool of the deployment."""
    e = spec.engine
    cpu = spec.device == "cpu"
    kwargs: dict[str, Any] = {
        "dtype": e.dtype or ("float32" if cpu else "bfloat16"),
        "max_model_len": e.max_model_len,
        "max_num_seqs": e.max_num_seqs,
        "enforce_eager": e.enforce_eager if e.enforce_eager is not None else cpu,
        "enable_prefix_caching": e.enable_prefix_caching,
        "tensor_parallel_size": e.tensor_parallel_size,
        "seed": e.seed,
        "trust_remote_code": False,
        # usage.prompt_tokens_details.cached_tokens, the figure usage records bill on; under P/D vLLM's
        # decode engine reports the prefill engine's reuse (kv_transfer_params.remote_prefill_cached_tokens),
        # not the prompt it received over NIXL
        "enable_prompt_tokens_details": True,
        # the gateway sends each request's flow-control band as vLLM's `priority` (lower goes first), so the
        # engine's waiting queue orders as the gateway's does (baton.api.gateway.service.engine_priority)
        "scheduling_policy": "priority",
    }
    if e.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = e.max_num_batched_tokens
    kwargs.update(serving_kwargs(spec))
    if cpu:
        # Fractional sizes go through kv_cache_memory_bytes (VLLM_CPU_KVCACHE_SPACE takes whole GiB).
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_space_gib(spec) * 2**30)
    else:
        kwargs["gpu_memory_utilization"] = e.gpu_memory_utilization or 0.9
    kv = kv_transfer_config(spec, role)
    if kv is not None:
        kwargs["kv_transfer_config"] = kv
    if spec.telemetry.enabled and spec.telemetry.otlp_endpoint:
        kwargs["otlp_traces_endpoint"] = spec.telemetry.otlp_endpoint.rstrip("/") + "/v1/traces"
    # responses carry Baton's system_fingerprint, not vLLM's (`vllm-<version>-<hash>` names the engine)
    kwargs["fingerprint_mode"] = "custom"
    kwargs["fingerprint_value"] = system_fingerprint(spec)
    return kwargs


def system_fingerprint(spec: DeploymentSpec) -> str:
    """The ``system_fingerprint`` a deployment's engines answer with, in OpenAI's form (``fp_`` and hex): it
    changes when the model or its engine settings do (the same in every pool, whatever the replica counts)
    and names no engine or version."""
    what = {"model": spec.model.model_dump(mode="json"), "engine": spec.engine.model_dump(mode="json"),
            "device": spec.device}
    return "fp_" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:10]


def serving_kwargs(spec: DeploymentSpec) -> dict[str, Any]:
    """What the catalogue says about serving the model: the pooling runner for an embedding model; tool-call
    and reasoning parsers and a chat template (Ray Serve LLM hands vLLM's frontend arguments among these to
    the OpenAI layer of the replica)."""
    model = spec.model
    out: dict[str, Any] = {}
    if model.kind == "embed":
        out["runner"] = "pooling"
        out["convert"] = "embed"
        out["enable_prefix_caching"] = False  # a pooled embedding reads every token of its input
    if model.tool_call_parser:
        out["enable_auto_tool_choice"] = True
        out["tool_call_parser"] = model.tool_call_parser
    if model.reasoning_parser:
        out["reasoning_parser"] = model.reasoning_parser
    if model.chat_template:
        out["chat_template"] = model.chat_template
    return out


def kv_transfer_config(spec: DeploymentSpec, role: Role) -> dict[str, Any] | None:
    """vLLM `kv_transfer_config`: NIXL for the P->D handoff, LMCache for the tiers, or both."""
    connectors: list[dict[str, Any]] = []
    if spec.kv.connector == "nixl" and role != "aggregated":
        connectors.append(
            {
                "kv_connector": "NixlConnector",
                "kv_connector_module_path": NIXL_CONNECTOR_MODULE,
                "kv_role": "kv_both",
                "kv_buffer_device": "cpu" if spec.device == "cpu" else "cuda",
                "kv_connector_extra_config": {
                    "backends": list(spec.kv.nixl_backends),
                    NIXL_PROGRESS_KEY: nixl_progress_wakeup_ms(spec),
                    NIXL_IDLE_PAUSE_KEY: nixl_idle_step_pause_ms(spec),
                },
            }
        )
    if spec.kv.lmcache is not None:
        connectors.append(
            {
                "kv_connector": LMCACHE_CONNECTOR_CLASS,
                "kv_connector_module_path": LMCACHE_CONNECTOR_MODULE,
                "kv_role": "kv_both",
                "kv_connector_extra_config": lmcache_extra_config(spec.kv.lmcache, device=spec.device),
            }
        )
    if not connectors:
        return None
    for c in connectors:
        c["kv_load_failure_policy"] = KV_LOAD_FAILURE_POLICY
    if len(connectors) == 1:
        return connectors[0]
    # Prefill and decode must list the same connectors in the same order (NIXL compatibility hash).
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": connectors[0].get("kv_buffer_device", "cpu"),
        "kv_load_failure_policy": KV_LOAD_FAILURE_POLICY,
        "kv_connector_extra_config": {"connectors": connectors},
    }


def lmcache_extra_config(tiers: LMCacheTiers, *, device: str) -> dict[str, Any]:
    """LMCache settings, passed as `lmcache.*` keys of the connector's extra config."""
    cfg: dict[str, Any] = {
        "lmcache.chunk_size": tiers.chunk_size,
        "lmcache.local_cpu": tiers.local_cpu_gib > 0,
        # LMCache's CPU backend is also its staging allocator: it needs some memory even when the
        # CPU tier itself is off.
        "lmcache.max_local_cpu_size": tiers.local_cpu_gib if tiers.local_cpu_gib > 0 else 0.25,
        # Python's hash() differs between processes: another engine would never hit.
        "lmcache.pre_caching_hash_algorithm": "sha256_cbor",
        # Only whole chunks are stored, so a chunk is always whole KV blocks.
        "lmcache.save_unfull_chunk": False,
        "lmcache.use_layerwise": False,
        "lmcache.enable_async_loading": False,
    }
    if tiers.local_disk_path and tiers.disk_kind == "fs":
        cfg["lmcache.remote_storage_plugins"] = ["fs"]
        cfg["lmcache.extra_config"] = {"remote_storage_plugin.fs.base_path": tiers.local_disk_path}
    elif tiers.local_disk_path:
        cfg["lmcache.local_disk"] = f"file://{tiers.local_disk_path}"
        cfg["lmcache.max_local_disk_size"] = tiers.local_disk_gib
    if tiers.redis_url:
        cfg["lmcache.remote_url"] = tiers.redis_url
        cfg["lmcache.remote_serde"] = "naive"
    return cfg


def _deployment_config(rng: ReplicaRange) -> dict[str, Any]:
    autoscaling: dict[str, Any] = {
        "min_replicas": rng.min,
        "max_replicas": rng.max,
        "initial_replicas": rng.initial,
    }
    if rng.target_ongoing_requests is not None:
        autoscaling["target_ongoing_requests"] = rng.target_ongoing_requests
    return {"autoscaling_config": autoscaling}


def render_llm_config(spec: DeploymentSpec, role: Role) -> dict[str, Any]:
    """A Ray Serve `LLMConfig` (as a dict) for one pool: aggregated, prefill or decode."""
    rng = {"aggregated": spec.replicas, "prefill": spec.prefill, "decode": spec.decode}[role]
    deployment = _deployment_config(rng)
    cfg: dict[str, Any] = {
        "model_loading_config": {"model_id": spec.model.served_name, "model_source": spec.model.path},
        "engine_kwargs": engine_kwargs(spec, role),
        "runtime_env": {"env_vars": engine_env(spec, role)},
        "deployment_config": deployment,
        "log_engine_metrics": True,
    }
    # Each token leaves the server as soon as the engine yields it (Ray batches a stream's outputs every
    # 50 ms by default: the first token and every gap would wait for the batch).
    cfg["experimental_configs"] = {"stream_batching_interval_ms": 0}
    if spec.kv.connector == "nixl" and role != "aggregated":
        offset = 0 if role == "prefill" else NIXL_DECODE_PORT_OFFSET
        cfg["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"] = spec.kv.nixl_port_base + offset
    if spec.device == "cpu":
        # The replica actor and its engine share one fractional bundle, so a 2-core machine can hold
        # several replicas; vLLM's own processes are not Ray-scheduled.
        deployment["ray_actor_options"] = {"num_cpus": 0}
        cfg["placement_group_config"] = {
            "bundles": [{"CPU": spec.cpus_per_replica}] * spec.engine.tensor_parallel_size,
            "strategy": "PACK",
        }
    else:
        cfg["accelerator_type"] = spec.accelerator_type
        cfg["placement_group_config"] = {
            "bundles": [{"GPU": 1, "CPU": 1}] * spec.engine.tensor_parallel_size,
            "strategy": "STRICT_PACK",
        }
    return cfg
