"""The renderer gives data-plane replicas their tracing and facts settings."""

from __future__ import annotations

from baton.dataplane.render import engine_env, engine_kwargs, render_llm_config
from baton.dataplane.spec import DeploymentSpec
from baton.dataplane.tracing import _usage, model_shape


def _spec(**kw: object) -> DeploymentSpec:
    args: dict[str, object] = {"kv": {"connector": "nixl"}, **kw}
    return DeploymentSpec(name="d", model={"path": "/m", "served_name": "tiny"}, mode="pd", **args)


def test_an_otlp_endpoint_reaches_baton_and_vllm() -> None:
    spec = _spec(telemetry={"otlp_endpoint": "http://collector:4318/", "link_bandwidth_gbps": 25.0,
                            "facts_redis_url": "redis://r:6379"})
    env = engine_env(spec)
    assert env["BATON_TELEMETRY__OTLP_ENDPOINT"] == "http://collector:4318/"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "baton-engine-d"  # vLLM's own spans are named
    assert env["BATON_TELEMETRY__LINK_BANDWIDTH_GBPS"] == "25.0"
    assert env["BATON_DATAPLANE_REDIS_URL"] == "redis://r:6379"
    for role in ("prefill", "decode"):
        assert engine_kwargs(spec, role)["otlp_traces_endpoint"] == "http://collector:4318/v1/traces"
        assert render_llm_config(spec, role)["runtime_env"]["env_vars"]["BATON_TELEMETRY__ENABLED"] == "true"


def test_without_an_endpoint_nothing_is_exported_and_facts_default_to_the_lmcache_redis() -> None:
    spec = _spec(kv={"connector": "nixl", "lmcache": {"redis_url": "redis://tier:6379"}})
    env = engine_env(spec)
    assert "BATON_TELEMETRY__OTLP_ENDPOINT" not in env and "otlp_traces_endpoint" not in engine_kwargs(spec, "decode")
    assert env["BATON_DATAPLANE_REDIS_URL"] == "redis://tier:6379"


def test_model_shape_and_usage_parsing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text('{"num_attention_heads": 4, "hidden_size": 128, "num_hidden_layers": 2,'
                                          ' "num_key_value_heads": 2, "torch_dtype": "float32"}')
    shape = model_shape(str(tmp_path), dtype="float32", block_size=128)
    assert shape is not None and shape.bytes_per_token == 2 * 2 * 2 * 32 * 4
    assert model_shape(str(tmp_path / "nope"), dtype=None, block_size=128) is None
    sse = 'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}\n\n'
    assert _usage([sse]) == 7 and _usage("data: {}\n\n") is None
