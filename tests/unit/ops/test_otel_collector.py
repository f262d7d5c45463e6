"""ops/otel/collector.yaml: OTLP in (gRPC + HTTP); traces out over OTLP (Tempo/Jaeger), metrics out on a
Prometheus endpoint; the Ray scrape gives vLLM's metrics back their own names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.ops import _dashboard as dash
from tests.unit.ops import _k8s as k8s

COLLECTOR = Path(__file__).resolve().parents[3] / "ops" / "otel" / "collector.yaml"


def _config() -> dict[str, Any]:
    return yaml.safe_load(COLLECTOR.read_text())


def test_pipelines() -> None:
    cfg = _config()
    pipes = cfg["service"]["pipelines"]
    assert set(pipes) == {"traces", "metrics"}
    assert pipes["traces"]["receivers"] == ["otlp"]
    assert pipes["traces"]["exporters"] == ["otlp/traces"]
    assert set(pipes["metrics"]["receivers"]) == {"otlp", "prometheus"}
    assert pipes["metrics"]["exporters"] == ["prometheus"]
    protocols = cfg["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert cfg["exporters"]["otlp/traces"]["endpoint"] == "${env:TRACES_OTLP_ENDPOINT}"
    assert cfg["exporters"]["prometheus"]["endpoint"].endswith(":8889")


def test_every_component_is_defined_and_used() -> None:
    cfg = _config()
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for pipe in cfg["service"]["pipelines"].values():
        for kind in used:
            used[kind] |= set(pipe.get(kind, []))
    for kind, names in used.items():
        assert names == set(cfg[kind]), kind
    assert cfg["service"]["extensions"] == list(cfg["extensions"])
    # memory_limiter must come first in each pipeline
    for pipe in cfg["service"]["pipelines"].values():
        assert pipe["processors"][0] == "memory_limiter"


def _scrape(job: str) -> dict[str, Any]:
    jobs = {j["job_name"]: j for j in _config()["receivers"]["prometheus"]["config"]["scrape_configs"]}
    return jobs[job]


def _relabel(rule: dict[str, Any], name: str) -> str:
    # The collector unescapes `$$` to `$`; Prometheus anchors the regex and substitutes $1.
    m = re.fullmatch(rule["regex"], name)
    if m is None:
        return name
    return re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))), rule["replacement"].replace("$$", "$"))


def test_ray_scrape_renames_vllm_metrics_back_to_vllms_names() -> None:
    (rule,) = _scrape("baton-ray")["metric_relabel_configs"]
    assert rule["source_labels"] == ["__name__"] and rule["target_label"] == "__name__"
    for m in dash.load_contract().metrics:
        if m.source != "vllm":
            continue
        for series in m.series():
            # What Ray's metrics agent exports for a vLLM metric inside Ray Serve LLM: vLLM sanitises
            # the name for OpenTelemetry (':' -> '_') and Ray's Prometheus exporter prefixes `ray_`.
            in_ray = "ray_" + re.sub(r"[^a-zA-Z0-9_]", "_", series)
            assert _relabel(rule, in_ray) == series
    assert _relabel(rule, "ray_serve_num_http_requests_total") == "ray_serve_num_http_requests_total"


def test_scrape_jobs_select_the_pods_the_manifests_annotate() -> None:
    if k8s.kubectl() is None:
        pytest.skip("kubectl (with built-in kustomize) is not installed")
    keep = {
        job: next(r["regex"] for r in _scrape(job)["relabel_configs"]
                  if r.get("action") == "keep" and "app_kubernetes_io_name" in r["source_labels"][0])
        for job in ("baton-gateway", "baton-ray")
    }
    for overlay in k8s.OVERLAYS:
        docs = k8s.render(overlay)
        gw = k8s.by_kind(docs, "Deployment")["baton-gateway"]["spec"]["template"]["metadata"]
        assert gw["labels"]["app.kubernetes.io/name"] == keep["baton-gateway"]
        assert gw["annotations"]["prometheus.io/scrape"] == "true"
        rc = k8s.by_kind(docs, "RayService")["baton-ray"]["spec"]["rayClusterConfig"]
        templates = [rc["headGroupSpec"]["template"]] + [g["template"] for g in rc["workerGroupSpecs"]]
        for t in templates:
            assert t["metadata"]["labels"]["app.kubernetes.io/name"] == keep["baton-ray"]
            ports = {p["name"] for p in t["spec"]["containers"][0]["ports"]}
            assert "metrics" in ports


def test_the_deployed_collector_runs_this_file() -> None:
    if k8s.kubectl() is None:
        pytest.skip("kubectl (with built-in kustomize) is not installed")
    for overlay in k8s.OVERLAYS:
        docs = k8s.render(overlay)
        cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("baton-otel-collector")]
        assert [cm["data"]["collector.yaml"] for cm in cms] == [COLLECTOR.read_text()]
        dep = k8s.by_kind(docs, "Deployment")["baton-otel-collector"]["spec"]["template"]["spec"]
        env = {e["name"] for e in dep["containers"][0]["env"]}
        assert "TRACES_OTLP_ENDPOINT" in env
        assert dep["volumes"][0]["configMap"]["name"] == cms[0]["metadata"]["name"]
        # the gateway's /metrics wants a token: the collector sends the one the gateway reads
        gw = k8s.by_kind(docs, "Deployment")["baton-gateway"]["spec"]["template"]["spec"]["containers"][0]
        [want] = [e["valueFrom"]["secretKeyRef"] for e in gw["env"] if e["name"] == "BATON_TELEMETRY__METRICS_TOKEN"]
        [job] = [j for j in _config()["receivers"]["prometheus"]["config"]["scrape_configs"]
                 if j["job_name"] == "baton-gateway"]
        mount = next(m for m in dep["containers"][0]["volumeMounts"]
                     if job["authorization"]["credentials_file"].startswith(m["mountPath"] + "/"))
        volume = next(v for v in dep["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == want["name"]
        assert job["authorization"]["credentials_file"] == f"{mount['mountPath']}/{want['key']}"
