import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from baton.dataplane.render import (
    APP_IMPORT_PATH,
    engine_env,
    engine_kwargs,
    render_llm_config,
    render_serve_application,
)
from baton.dataplane.spec import DeploymentSpec

MODEL = {"path": "/models/tiny", "served_name": "tiny"}


def pd_spec(**kw) -> DeploymentSpec:
    kw.setdefault("kv", {"connector": "nixl"})
    return DeploymentSpec(name="tiny", model=MODEL, mode="pd", **kw)


def test_every_field_is_described():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann)

    walk(DeploymentSpec)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"name": "x", "model": MODEL, "replica": 2}, "Extra inputs are not permitted"),
        ({"name": "x", "model": {**MODEL, "revision": "main"}}, "Extra inputs are not permitted"),
        ({"name": "x", "model": MODEL, "mode": "pd"}, "needs a KV connector"),
        ({"name": "x", "model": MODEL, "replicas": {"min": 3, "max": 1}}, "replica range inverted"),
        (
            {"name": "x", "model": MODEL, "mode": "pd", "kv": {"connector": "nixl"}, "decode": {"min": 2, "max": 1}},
            "replica range inverted",
        ),
        ({"name": "X_bad", "model": MODEL}, "string_pattern_mismatch"),
        ({"name": "x", "model": MODEL, "kv": {"lmcache": {"chunk_size": 200}}}, "multiple of 128"),
        ({"name": "x", "model": MODEL, "kv": {"lmcache": {"redis_url": "http://x"}}}, "rediss?"),
        ({"name": "x", "model": MODEL, "accelerator_type": "H100"}, "gpu device profile only"),
    ],
)
def test_bad_specs_are_rejected_with_a_clear_error(bad, message):
    with pytest.raises(ValidationError) as err:
        DeploymentSpec.model_validate(bad)
    assert message in str(err.value) or message in json.dumps(err.value.errors(), default=str)


def test_bad_spec_is_rejected_before_ray_is_imported():
    code = (
        "import sys\n"
        "from pydantic import ValidationError\n"
        "from baton.dataplane.app import build_app\n"
        "try:\n"
        "    build_app({'name': 'x', 'model': {'path': '/m', 'served_name': 'm'}, 'mode': 'pd'})\n"
        "except ValidationError as e:\n"
        "    assert 'ray' not in sys.modules, 'ray was imported'\n"
        "    print('rejected:', e.errors()[0]['msg'])\n"
        "else:\n"
        "    raise SystemExit('accepted')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "needs a KV connector" in out.stdout


def test_spec_round_trips_through_the_serve_application_entry():
    spec = pd_spec(kv={"connector": "nixl", "lmcache": {"redis_url": "redis://127.0.0.1:6379"}})
    entry = render_serve_application(spec)
    assert entry["import_path"] == APP_IMPORT_PATH == "baton.dataplane.app:build_app"
    assert entry["name"] == "tiny"
    json.dumps(entry)  # what goes to Ray's REST API is plain JSON
    assert DeploymentSpec.model_validate(entry["args"]) == spec


def test_a_pd_spec_is_a_prefill_application_and_the_decode_application():
    from baton.dataplane.render import PREFILL_APP_IMPORT_PATH, render_serve_applications, render_serve_config

    spec = pd_spec(kv={"connector": "nixl"}, route_prefix="/tiny")
    prefill, main = render_serve_applications(spec)
    assert main == render_serve_application(spec) and main["route_prefix"] == "/tiny"
    assert prefill["name"] == "tiny.prefill" and prefill["route_prefix"] == "/tiny.prefill"
    assert prefill["import_path"] == PREFILL_APP_IMPORT_PATH == "baton.dataplane.app:build_prefill_app"
    assert DeploymentSpec.model_validate(prefill["args"]) == spec
    # HAProxy routes by path prefix + "/": the decode app's "/tiny/" never catches "/tiny.prefill/..."
    assert not ("/tiny.prefill/v1/completions").startswith(main["route_prefix"] + "/")
    aggregated = DeploymentSpec(name="agg", model=MODEL, mode="aggregated")
    assert [a["name"] for a in render_serve_config([aggregated, spec])["applications"]] == [
        "agg", "tiny.prefill", "tiny"]


def test_cpu_profile_renders_cpu_engine_settings():
    spec = pd_spec(engine={"kv_cache_space_gib": 0.5}, prefill={"min": 1, "max": 2})
    prefill = render_llm_config(spec, "prefill")
    kwargs = prefill["engine_kwargs"]
    assert kwargs["dtype"] == "float32"
    assert kwargs["enforce_eager"] is True
    assert kwargs["kv_cache_memory_bytes"] == 2**29
    assert kwargs["kv_transfer_config"]["kv_connector"] == "NixlConnector"
    assert kwargs["kv_transfer_config"]["kv_buffer_device"] == "cpu"
    assert "accelerator_type" not in prefill
    assert prefill["placement_group_config"]["bundles"] == [{"CPU": 0.5}]
    assert prefill["deployment_config"]["ray_actor_options"] == {"num_cpus": 0}
    assert prefill["deployment_config"]["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 2,
        "initial_replicas": 1,
    }
    env = prefill["runtime_env"]["env_vars"]
    for key, value in {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "UCX_NET_DEVICES": "lo",
        "HF_HUB_OFFLINE": "1",
    }.items():
        assert env[key] == value
    # Ray assigns each replica its own NIXL side-channel port; a fixed one would collide.
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env
    assert (
        engine_env(DeploymentSpec(name="x", model=MODEL, engine={"kv_cache_space_gib": 1}))["VLLM_CPU_KVCACHE_SPACE"]
        == "1"
    )


def test_gpu_profile_renders_gpu_engine_settings():
    spec = DeploymentSpec(
        name="big", model=MODEL, mode="pd", device="gpu", accelerator_type="H100", kv={"connector": "nixl"}
    )
    cfg = render_llm_config(spec, "decode")
    kwargs = cfg["engine_kwargs"]
    assert kwargs["dtype"] == "bfloat16"
    assert kwargs["enforce_eager"] is False
    assert kwargs["gpu_memory_utilization"] == 0.9
    assert "kv_cache_memory_bytes" not in kwargs
    assert kwargs["kv_transfer_config"]["kv_buffer_device"] == "cuda"
    assert cfg["accelerator_type"] == "H100"
    assert cfg["placement_group_config"]["bundles"] == [{"GPU": 1, "CPU": 1}]
    env = cfg["runtime_env"]["env_vars"]
    assert "rc" in env["UCX_TLS"]
    assert "UCX_NET_DEVICES" not in env


def test_pd_with_lmcache_uses_the_same_multiconnector_on_both_sides():
    spec = pd_spec(
        kv={"connector": "nixl", "lmcache": {"local_disk_path": "/var/kv", "redis_url": "redis://127.0.0.1:6379"}}
    )
    prefill = render_llm_config(spec, "prefill")["engine_kwargs"]["kv_transfer_config"]
    decode = render_llm_config(spec, "decode")["engine_kwargs"]["kv_transfer_config"]
    assert prefill == decode
    assert prefill["kv_connector"] == "MultiConnector"
    nixl, lmc = prefill["kv_connector_extra_config"]["connectors"]
    assert nixl["kv_connector"] == "NixlConnector"
    assert nixl["kv_connector_module_path"] == "baton.dataplane.kv_trace"  # timed in the engine
    assert lmc["kv_connector"] == "BatonLMCacheConnectorV1"
    assert lmc["kv_connector_module_path"] == "baton.dataplane.kv_connector"
    extra = lmc["kv_connector_extra_config"]
    assert extra["lmcache.pre_caching_hash_algorithm"] == "sha256_cbor"
    assert extra["lmcache.chunk_size"] == 256
    assert extra["lmcache.remote_url"] == "redis://127.0.0.1:6379"
    assert extra["lmcache.remote_serde"] == "naive"
    assert extra["lmcache.remote_storage_plugins"] == ["fs"]
    assert extra["lmcache.extra_config"]["remote_storage_plugin.fs.base_path"] == "/var/kv"


def test_aggregated_without_tiers_has_no_connector():
    cfg = render_llm_config(DeploymentSpec(name="x", model=MODEL), "aggregated")
    assert "kv_transfer_config" not in cfg["engine_kwargs"]


def test_nixl_side_channel_ports_come_from_the_spec():
    spec = pd_spec(kv={"connector": "nixl", "nixl_port_base": 31000})
    assert render_llm_config(spec, "prefill")["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"] == 31000
    assert render_llm_config(spec, "decode")["experimental_configs"]["NIXL_SIDE_CHANNEL_PORT_BASE"] == 33000


def test_every_pool_streams_each_token_as_the_engine_yields_it():
    """Ray Serve LLM batches a stream's outputs every 50 ms unless told otherwise."""
    for spec, roles in ((pd_spec(), ("prefill", "decode")), (DeploymentSpec(name="a", model=MODEL), ("aggregated",))):
        for role in roles:
            assert render_llm_config(spec, role)["experimental_configs"]["stream_batching_interval_ms"] == 0


def test_lmcache_settings_are_all_known_to_lmcache():
    pytest.importorskip("lmcache")
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.config_base import validate_and_set_config_value

    from baton.dataplane.render import lmcache_extra_config
    from baton.dataplane.spec import LMCacheTiers

    tiers = LMCacheTiers(local_disk_path="/var/kv", redis_url="redis://127.0.0.1:6379")
    config = LMCacheEngineConfig.from_defaults()
    for key, value in lmcache_extra_config(tiers, device="cpu").items():
        assert key.startswith("lmcache.")
        assert validate_and_set_config_value(config, key.removeprefix("lmcache."), value), key
    assert config.chunk_size == 256
    assert config.remote_url == "redis://127.0.0.1:6379"
    assert config.pre_caching_hash_algorithm == "sha256_cbor"
    assert config.extra_config["remote_storage_plugin.fs.base_path"] == "/var/kv"


def test_local_disk_tier_is_size_limited():
    from baton.dataplane.render import lmcache_extra_config
    from baton.dataplane.spec import LMCacheTiers

    extra = lmcache_extra_config(
        LMCacheTiers(local_disk_path="/var/kv", disk_kind="local_disk", local_disk_gib=2), device="cpu"
    )
    assert extra["lmcache.local_disk"] == "file:///var/kv"
    assert extra["lmcache.max_local_disk_size"] == 2
    assert "lmcache.remote_storage_plugins" not in extra


def test_nixl_progress_thread_sleeps_on_cpu_and_busy_polls_on_gpu_unless_the_spec_says():
    def wakeup(spec: DeploymentSpec) -> float:
        kv = render_llm_config(spec, "decode")["engine_kwargs"]["kv_transfer_config"]
        return float(kv["kv_connector_extra_config"]["baton_progress_wakeup_ms"])

    def pause(spec: DeploymentSpec) -> float:
        kv = render_llm_config(spec, "prefill")["engine_kwargs"]["kv_transfer_config"]
        return float(kv["kv_connector_extra_config"]["baton_idle_step_pause_ms"])

    assert wakeup(pd_spec()) == 10.0
    assert pause(pd_spec()) == 1.0
    gpu = DeploymentSpec(name="g", model=MODEL, mode="pd", device="gpu", kv={"connector": "nixl"})
    assert wakeup(gpu) == 0.0
    assert pause(gpu) == 0.0
    assert wakeup(pd_spec(kv={"connector": "nixl", "nixl_progress_wakeup_ms": 50})) == 50.0
    with pytest.raises(ValidationError):
        pd_spec(kv={"connector": "nixl", "nixl_progress_wakeup_ms": -1})


def test_an_embedding_model_renders_the_pooling_runner_and_is_aggregated_only():
    spec = DeploymentSpec(name="emb", model={**MODEL, "kind": "embed"})
    kwargs = render_llm_config(spec, "aggregated")["engine_kwargs"]
    assert (kwargs["runner"], kwargs["convert"], kwargs["enable_prefix_caching"]) == ("pooling", "embed", False)
    assert "enable_auto_tool_choice" not in kwargs and "tool_call_parser" not in kwargs
    with pytest.raises(ValidationError, match="embedding model is served aggregated"):
        DeploymentSpec(name="emb", model={**MODEL, "kind": "embed"}, mode="pd", kv={"connector": "nixl"})
    with pytest.raises(ValidationError, match="no tool-call or reasoning parser"):
        DeploymentSpec(name="emb", model={**MODEL, "kind": "embed", "tool_call_parser": "hermes"})


def test_the_catalogues_parsers_and_chat_template_reach_every_pool():
    model = {**MODEL, "tool_call_parser": "hermes", "reasoning_parser": "deepseek_r1", "chat_template": "{{ x }}"}
    spec = DeploymentSpec(name="tiny", model=model, mode="pd", kv={"connector": "nixl"})
    for role in ("prefill", "decode"):
        kwargs = render_llm_config(spec, role)["engine_kwargs"]
        assert kwargs["enable_auto_tool_choice"] is True and kwargs["tool_call_parser"] == "hermes"
        assert kwargs["reasoning_parser"] == "deepseek_r1" and kwargs["chat_template"] == "{{ x }}"
        assert "runner" not in kwargs
    plain = render_llm_config(pd_spec(), "decode")["engine_kwargs"]
    assert not {"enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "chat_template"} & set(plain)
    with pytest.raises(ValidationError):
        DeploymentSpec(name="tiny", model={**MODEL, "tool_call_parser": "hermes; rm -rf /"})


def test_every_pool_answers_with_batons_fingerprint_which_follows_the_model_and_engine_not_the_replicas():
    spec = pd_spec()
    fps = {engine_kwargs(spec, role)["fingerprint_value"] for role in ("prefill", "decode")}
    [fp] = fps
    assert fp.startswith("fp_") and len(fp) == 13 and "vllm" not in fp
    assert all(engine_kwargs(spec, role)["fingerprint_mode"] == "custom" for role in ("prefill", "decode"))
    scaled = pd_spec(decode={"min": 2, "max": 4})
    assert engine_kwargs(scaled, "decode")["fingerprint_value"] == fp
    other = pd_spec(engine={"max_model_len": 1024})
    assert engine_kwargs(other, "decode")["fingerprint_value"] != fp
