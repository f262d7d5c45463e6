"""Deployment rows -> the data plane's DeploymentSpec -> Serve application entries."""

from __future__ import annotations

import uuid

import pytest

from baton.control.ray_client import ServeStatus
from baton.control.slo import EngineThroughput
from baton.control.spec_rows import deployment_spec
from baton.core import errors
from baton.core import models as m
from baton.dataplane.render import render_serve_application

MODEL = m.Model(id=uuid.uuid4(), name="tiny-llama", source="/var/models/tiny", context_length=2048, num_layers=2,
                num_kv_heads=2, head_dim=32, dtype="float32")


def _dep(**over: object) -> m.Deployment:
    base: dict[str, object] = dict(
        name="tiny", model_id=MODEL.id, mode=m.DeploymentMode.AGGREGATED, prefill_min_replicas=0,
        prefill_max_replicas=0, decode_min_replicas=1, decode_max_replicas=2, engine_settings={"max_model_len": 512},
        kv_connector=None, lmcache=None, device_profile="cpu",
    )
    base.update(over)
    return m.Deployment(**base)


def test_aggregated_row_renders_one_app_named_after_the_deployment() -> None:
    entry = render_serve_application(deployment_spec(_dep(), MODEL))
    assert entry["name"] == "tiny" and entry["route_prefix"] == "/tiny"
    assert entry["import_path"] == "baton.dataplane.app:build_app"
    args = entry["args"]
    assert args["model"] == {"path": "/var/models/tiny", "served_name": "tiny-llama", "kind": "generate",
                             "tool_call_parser": None, "reasoning_parser": None, "chat_template": None}
    assert args["replicas"]["min"] == 1 and args["replicas"]["max"] == 2
    assert args["engine"]["max_model_len"] == 512


def test_pd_row_uses_both_pools_and_the_connector() -> None:
    d = _dep(mode=m.DeploymentMode.PD, kv_connector="nixl", prefill_min_replicas=1, prefill_max_replicas=1,
             lmcache={"local_cpu_gib": 0.5}, engine_settings={"cpus_per_replica": 0.25})
    spec = deployment_spec(d, MODEL)
    assert spec.mode == "pd" and spec.kv.connector == "nixl"
    assert spec.prefill.max == 1 and spec.decode.max == 2
    assert spec.kv.lmcache is not None and spec.kv.lmcache.local_cpu_gib == 0.5
    assert spec.cpus_per_replica == 0.25


def test_slo_policy_sets_per_pool_targets() -> None:
    class P:
        name, ttft_ms, tpot_ms, priority, sheddable, weight = "gold", 1000, 20, 50, False, 1.0

    tp = EngineThroughput(prefill_tokens_per_s=10_000, decode_step_ms=5, decode_ms_per_seq=0.5, mean_prompt_tokens=1000)
    d = _dep(mode=m.DeploymentMode.PD, kv_connector="nixl", prefill_min_replicas=1, prefill_max_replicas=1)
    spec = deployment_spec(d, MODEL, policy=P(), throughput=tp)
    assert spec.prefill.target_ongoing_requests == 10 and spec.decode.target_ongoing_requests == 30


@pytest.mark.parametrize("over", [
    {"mode": m.DeploymentMode.PD, "prefill_max_replicas": 1},  # no connector
    {"engine_settings": {"max_model_len": 1, "x": 2}},
    {"device_profile": "cpu", "engine_settings": {"gpu_memory_utilization": 0.5}},
])
def test_invalid_rows_are_client_errors(over: dict[str, object]) -> None:
    with pytest.raises(errors.ValidationError):
        deployment_spec(_dep(**over), MODEL)


def test_a_max_model_len_past_the_models_context_never_reaches_ray() -> None:
    with pytest.raises(errors.ValidationError) as refused:
        deployment_spec(_dep(engine_settings={"max_model_len": 1_000_000}), MODEL)
    assert refused.value.param == "engine.max_model_len" and "2,048" in refused.value.message
    assert deployment_spec(_dep(engine_settings={"max_model_len": 2048}), MODEL).engine.max_model_len == 2048


def test_serve_status_parses_apps_and_compares_entries() -> None:
    entry = render_serve_application(deployment_spec(_dep(), MODEL))
    status = ServeStatus.parse({"applications": {"tiny": {
        "status": "RUNNING", "message": "", "deployed_app_config": dict(entry),
        "deployments": {"LLMServer": {"status": "HEALTHY"}},
    }}})
    app = status.apps["tiny"]
    assert app.status == "RUNNING" and app.matches(entry) and app.deployments == {"LLMServer": "HEALTHY"}
    changed = render_serve_application(deployment_spec(_dep(decode_max_replicas=3), MODEL))
    assert not app.matches(changed)
    assert ServeStatus.parse({}).apps == {}


def test_reconciler_gives_every_app_the_gateways_fact_store_and_tracing() -> None:
    from baton.control.reconciler import Reconciler
    from baton.core.settings import load_settings

    settings = load_settings(redis={"url": "redis://facts.example:6379/3", "lmcache_url": "redis://tier:6379"},
                             telemetry={"otlp_endpoint": "http://collector:4318"})
    rec = Reconciler.from_settings(settings, db=None, client=None)  # type: ignore[arg-type]
    assert rec.telemetry is not None
    assert rec.telemetry["facts_redis_url"] == "redis://facts.example:6379/3"
    assert rec.telemetry["otlp_endpoint"] == "http://collector:4318"
