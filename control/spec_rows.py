"""Deployment rows -> :class:`baton.dataplane.spec.DeploymentSpec`: the one conversion everyone shares.

The admin API validates a deployment by converting it (so nothing reaches the database that the data
plane would refuse), the reconciler renders Ray Serve's config from it, and the k8s manifests come from
the same renderer.

Conventions: one Serve application per deployment, named after it, at route ``/<deployment name>``;
the served model id is the catalogue model's name and its weights are ``models.source``. The
``engine_settings`` column holds :class:`~baton.dataplane.spec.EngineSettings` fields plus the
placement keys in :data:`PLACEMENT_KEYS` and the KV-transport keys in :data:`KV_KEYS`; in aggregated
mode the decode replica range is the one pool.
"""

from __future__ import annotations

import zlib
from typing import Any

import pydantic

from baton.control.slo import EngineThroughput, SloPolicyLike, compile_targets
from baton.core import errors
from baton.core import models as m
from baton.dataplane.spec import DeploymentSpec

#: Keys of ``deployments.engine_settings`` that are not vLLM engine settings but placement.
PLACEMENT_KEYS = ("cpus_per_replica", "accelerator_type", "env")
#: Keys of ``deployments.engine_settings`` that are KV-transport settings (``DeploymentSpec.kv``).
KV_KEYS = ("nixl_progress_wakeup_ms", "nixl_idle_step_pause_ms")


def route_prefix(name: str) -> str:
    return f"/{name}"


NIXL_PORT_FIRST = 20000
NIXL_PORT_SLOTS = 200
NIXL_PORTS_PER_DEPLOYMENT = 10  # one per prefill replica; the decode pool uses the same range + 2000


def nixl_port_base(name: str) -> int:
    """A NIXL side-channel port range of its own for each deployment sharing a host (stable per name)."""
    return NIXL_PORT_FIRST + (zlib.crc32(name.encode()) % NIXL_PORT_SLOTS) * NIXL_PORTS_PER_DEPLOYMENT


def deployment_spec(
    dep: m.Deployment,
    model: m.Model,
    *,
    policy: SloPolicyLike | None = None,
    throughput: EngineThroughput | None = None,
    telemetry: dict[str, Any] | None = None,
) -> DeploymentSpec:
    """The data plane's spec for one deployment row; raises :class:`errors.ValidationError` if invalid.

    With a policy (and throughput figures) the pools get ``target_ongoing_requests`` from
    :func:`baton.control.slo.compile_targets`.
    """
    engine = dict(dep.engine_settings or {})
    asked = engine.get("max_model_len")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > model.context_length:
        # vLLM refuses it when the engine starts, after Ray has already stopped what served
        raise errors.ValidationError(
            f"engine.max_model_len {asked:,} is longer than the model's context ({model.context_length:,} tokens, "
            "the catalogue's context_length).", param="engine.max_model_len")
    placement = {k: engine.pop(k) for k in PLACEMENT_KEYS if k in engine}
    kv_extra = {k: engine.pop(k) for k in KV_KEYS if k in engine}
    targets = compile_targets(policy, throughput) if policy is not None and throughput is not None else None

    def pool(lo: int, hi: int, target: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"min": lo, "max": hi}
        if target is not None:
            out["target_ongoing_requests"] = target
        return out

    mode = m.DeploymentMode(dep.mode).value
    raw: dict[str, Any] = {
        "name": dep.name,
        "model": {"path": model.source, "served_name": model.name, "kind": model.kind or "generate",
                  "tool_call_parser": model.tool_call_parser, "reasoning_parser": model.reasoning_parser,
                  "chat_template": model.chat_template},
        "mode": mode,
        "device": dep.device_profile or "cpu",
        "engine": engine,
        "kv": {"connector": dep.kv_connector or "none", "lmcache": dep.lmcache,
               "nixl_port_base": nixl_port_base(dep.name), **kv_extra},
        "route_prefix": route_prefix(dep.name),
        **placement,
    }
    if telemetry is not None:
        raw["telemetry"] = telemetry
    if mode == "aggregated":
        raw["replicas"] = pool(dep.decode_min_replicas, dep.decode_max_replicas,
                               targets.aggregated if targets else None)
    else:
        raw["prefill"] = pool(dep.prefill_min_replicas, dep.prefill_max_replicas,
                              targets.prefill if targets else None)
        raw["decode"] = pool(dep.decode_min_replicas, dep.decode_max_replicas,
                             targets.decode if targets else None)
    try:
        return DeploymentSpec.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise errors.ValidationError(_first_error(exc), param=_first_loc(exc)) from None


def _first_loc(exc: pydantic.ValidationError) -> str | None:
    errs = exc.errors()
    if not errs:
        return None
    return ".".join(str(p) for p in errs[0].get("loc", ())) or None


def _first_error(exc: pydantic.ValidationError) -> str:
    errs = exc.errors()
    if not errs:
        return "The deployment is not valid."
    loc = _first_loc(exc)
    msg = str(errs[0].get("msg", "invalid value"))
    return f"Invalid deployment: {loc}: {msg}" if loc else f"Invalid deployment: {msg}"


def throughput_from(settings: Any, engine_settings: dict[str, Any] | None = None) -> EngineThroughput:
    """Throughput figures for SLO compilation from :class:`~baton.core.settings.ControlSettings`."""
    c = settings.control
    max_seqs = int((engine_settings or {}).get("max_num_seqs", 16))
    return EngineThroughput(
        prefill_tokens_per_s=c.prefill_tokens_per_s,
        decode_step_ms=c.decode_step_ms,
        decode_ms_per_seq=c.decode_ms_per_seq,
        mean_prompt_tokens=c.mean_prompt_tokens,
        max_num_seqs=max_seqs,
    )
