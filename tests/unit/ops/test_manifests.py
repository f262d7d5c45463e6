"""The Kustomize overlays render, every object validates offline, and the pieces fit together."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.ops import _k8s as k8s

pytestmark = pytest.mark.skipif(k8s.kubectl() is None, reason="kubectl (with built-in kustomize) is not installed")

#: Objects the gpu overlay refers to but never renders: created outside Git (docs/production.md).
EXTERNAL = {
    "gpu": {("Secret", "baton-secrets"), ("Secret", "baton-db-owner"), ("Secret", "baton-ray-auth"),
            ("Secret", "baton-metrics-token"), ("PersistentVolumeClaim", "baton-models")},
    "cpu-demo": set(),
}


def test_there_are_two_overlays() -> None:
    assert k8s.OVERLAYS == ["cpu-demo", "gpu"]


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
@pytest.mark.parametrize("version", k8s.K8S_VERSIONS)
def test_core_objects_validate_against_the_kubernetes_schemas(overlay: str, version: str) -> None:
    pytest.importorskip("kubernetes_validate")
    errors = {
        f"{d['kind']}/{d['metadata']['name']}": k8s.validate_core(d, version)
        for d in k8s.render(overlay)
        if not d["apiVersion"].startswith("ray.io/")
    }
    assert {name: errs for name, errs in errors.items() if errs} == {}


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_kuberay_objects_validate_against_the_crd_schemas(overlay: str) -> None:
    if not k8s.KUBERAY_SCHEMAS.is_dir():
        pytest.skip(f"KubeRay CRD schemas not found at {k8s.KUBERAY_SCHEMAS}")
    ray = [d for d in k8s.render(overlay) if d["apiVersion"].startswith("ray.io/")]
    assert [d["kind"] for d in ray] == ["RayService"]
    assert {d["metadata"]["name"]: k8s.validate_custom(d) for d in ray} == {"baton-ray": []}


def test_the_crd_check_catches_typos_and_bad_values() -> None:
    if not k8s.KUBERAY_SCHEMAS.is_dir():
        pytest.skip(f"KubeRay CRD schemas not found at {k8s.KUBERAY_SCHEMAS}")
    import copy

    doc = copy.deepcopy(k8s.by_kind(k8s.render("gpu"), "RayService")["baton-ray"])
    group = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["minReplica"] = 1
    doc["spec"]["rayClusterConfig"]["authOptions"]["mode"] = "tokens"
    errors = k8s.validate_custom(doc)
    assert any("minReplica: unknown field" in e for e in errors)
    assert any("authOptions.mode" in e for e in errors)


def test_the_core_check_catches_typos() -> None:
    pytest.importorskip("kubernetes_validate")
    import copy

    doc = copy.deepcopy(k8s.by_kind(k8s.render("gpu"), "Deployment")["baton-gateway"])
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert k8s.validate_core(doc, k8s.K8S_VERSIONS[0])


def _pod_specs(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    pods = {}
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            pods[f"{d['kind']}/{d['metadata']['name']}"] = d["spec"]["template"]["spec"]
        elif d["kind"] == "RayService":
            rc = d["spec"]["rayClusterConfig"]
            pods["RayService/head"] = rc["headGroupSpec"]["template"]["spec"]
            for g in rc["workerGroupSpecs"]:
                pods[f"RayService/{g['groupName']}"] = g["template"]["spec"]
    return pods


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_every_referenced_config_secret_and_account_exists_or_is_documented_external(overlay: str) -> None:
    docs = k8s.render(overlay)
    have = {(d["kind"], d["metadata"]["name"]) for d in docs} | EXTERNAL[overlay]
    refs: set[tuple[str, str]] = set()
    for pod in _pod_specs(docs).values():
        refs.add(("ServiceAccount", pod.get("serviceAccountName", "default")))
        for c in pod.get("initContainers", []) + pod["containers"]:
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    refs.add(("ConfigMap", src["configMapRef"]["name"]))
                if "secretRef" in src:
                    refs.add(("Secret", src["secretRef"]["name"]))
        for v in pod.get("volumes", []):
            if "secret" in v:
                refs.add(("Secret", v["secret"]["secretName"]))
            if "configMap" in v:
                refs.add(("ConfigMap", v["configMap"]["name"]))
            if "persistentVolumeClaim" in v:
                refs.add(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]))
    rs = k8s.by_kind(docs, "RayService")["baton-ray"]
    refs.add(("Secret", rs["spec"]["rayClusterConfig"]["authOptions"]["secretName"]))
    assert refs - have == set()


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_services_wait_for_migrations_and_only_the_migration_holds_the_owner_secret(overlay: str) -> None:
    docs = k8s.render(overlay)
    job = k8s.by_kind(docs, "Job")["baton-migrate"]["spec"]["template"]["spec"]
    assert job["containers"][0]["command"][:3] == ["baton", "db", "upgrade"]
    assert job["restartPolicy"] == "Never"
    for name in ("baton-gateway", "baton-worker", "baton-beat"):
        pod = k8s.by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]
        init = {c["name"]: c for c in pod.get("initContainers", [])}
        assert "baton db current" in " ".join(init["schema"]["command"]), name
        secrets = {s["secretRef"]["name"] for c in pod["containers"] + list(init.values())
                   for s in c.get("envFrom", []) if "secretRef" in s}
        assert "baton-db-owner" not in secrets, name


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_gateway_rolls_without_dropping_requests(overlay: str) -> None:
    docs = k8s.render(overlay)
    dep = k8s.by_kind(docs, "Deployment")["baton-gateway"]
    pod = dep["spec"]["template"]["spec"]
    (gw,) = pod["containers"]
    assert "replicas" not in dep["spec"], "the HPA owns the replica count"
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert gw["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert gw["command"][:3] == ["baton", "gateway", "run"]
    assert gw["lifecycle"]["preStop"]
    assert pod["terminationGracePeriodSeconds"] >= 310  # preStop + the longest stream
    hpa = k8s.by_kind(docs, "HorizontalPodAutoscaler")["baton-gateway"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "baton-gateway"}
    assert hpa["spec"]["minReplicas"] >= 2
    pdb = k8s.by_kind(docs, "PodDisruptionBudget")["baton-gateway"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(dep).items()


def pod_labels(dep: dict[str, Any]) -> dict[str, str]:
    return dep["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_beat_is_a_singleton(overlay: str) -> None:
    beat = k8s.by_kind(k8s.render(overlay), "Deployment")["baton-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_only_the_cpu_demo_commits_secrets_and_those_are_placeholders(overlay: str) -> None:
    import base64

    secrets = k8s.by_kind(k8s.render(overlay), "Secret")
    if overlay != "cpu-demo":
        assert secrets == {}
        return
    assert set(secrets) == {"baton-secrets", "baton-db-owner", "baton-ray-auth", "baton-metrics-token"}
    for s in secrets.values():
        for key, value in s["data"].items():
            text = base64.b64decode(value).decode()
            assert "REPLACE_ME" in text or key == "BATON_REDIS__LMCACHE_URL", f"{s['metadata']['name']}.{key}"


def test_gpu_pools_run_on_separate_gpu_node_groups_with_rdma() -> None:
    rs = k8s.by_kind(k8s.render("gpu"), "RayService")["baton-ray"]
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert set(groups) == {"prefill", "decode"}
    selectors = set()
    for name, g in groups.items():
        pod = g["template"]["spec"]
        (c,) = pod["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert any(r.startswith("rdma/") for r in c["resources"]["limits"])
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
        assert {"UCX_NET_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_HOST_IP"} <= set(env)
        assert pod["nodeSelector"]["baton.dev/pool"] == name
        assert g["resources"] == {f"baton_{name}": "8"}
        assert g["labels"] == {"baton.dev/pool": name}
        assert "k8s.v1.cni.cncf.io/networks" in g["template"]["metadata"]["annotations"]
        selectors.add(tuple(sorted(pod["nodeSelector"].items())))
    assert len(selectors) == 2


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_ray_pods_mount_what_the_serve_config_points_at(overlay: str) -> None:
    """Model folders and the LMCache disk tier named in the Serve config exist in every engine pod."""
    import yaml

    rs = k8s.by_kind(k8s.render(overlay), "RayService")["baton-ray"]
    config = yaml.safe_load(rs["spec"]["serveConfigV2"])
    paths = set()
    for app in config["applications"]:
        paths.add(app["args"]["model"]["path"])
        lmcache = app["args"]["kv"].get("lmcache") or {}
        if lmcache.get("local_disk_path"):
            paths.add(lmcache["local_disk_path"])
    for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (c,) = g["template"]["spec"]["containers"]
        mounts = [m["mountPath"] for m in c["volumeMounts"]]
        for p in paths:
            assert any(p == m or p.startswith(m.rstrip("/") + "/") for m in mounts), (g["groupName"], p)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["serve"] == config["http_options"]["port"]


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_config_map_settings_are_baton_settings_and_reach_the_ray_services(overlay: str) -> None:
    """Every BATON_* variable in baton-config is a field of Settings (a typo would be ignored silently),
    and the gateway's Serve URL points at KubeRay's serve Service."""
    from baton.core.settings import Settings

    docs = k8s.render(overlay)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("baton-config")]
    pending = {"BATON_RAY__SERVE_HTTP_HOST"}  # read by the reconciler once it renders the proxy's bind host
    for key in cm["data"]:
        if key in pending:
            continue
        parts = key.removeprefix("BATON_").lower().split("__")
        model: type = Settings
        for part in parts:
            assert part in model.model_fields, f"{key}: no such setting"
            model = model.model_fields[part].annotation  # type: ignore[assignment]
    settings = Settings.model_validate({})
    ray = settings.ray.model_copy(update={"serve_host": cm["data"]["BATON_RAY__SERVE_HOST"],
                                          "serve_http_port": int(cm["data"]["BATON_RAY__SERVE_HTTP_PORT"])})
    rs = k8s.by_kind(docs, "RayService")["baton-ray"]
    assert ray.serve_url == f"http://{rs['metadata']['name']}-serve-svc:8000"
    assert cm["data"]["BATON_RAY__DASHBOARD_URL"] == f"http://{rs['metadata']['name']}-head-svc:8265"


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_worker_groups_can_hold_every_pool_at_its_maximum(overlay: str) -> None:
    """The pools' max replicas fit the Ray worker groups: CPU bundles in the CPU group's logical CPUs,
    GPU replicas in their own pool's node group."""
    import yaml

    rs = k8s.by_kind(k8s.render(overlay), "RayService")["baton-ray"]
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    apps = [a["args"] for a in yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"]]
    for spec in apps:
        pools = ["prefill", "decode"] if spec["mode"] == "pd" else ["replicas"]
        tp = spec["engine"]["tensor_parallel_size"]
        if spec["device"] == "cpu":
            need = sum(spec[p]["max"] for p in pools) * tp * spec["cpus_per_replica"]
            have = sum(float(g["rayStartParams"]["num-cpus"]) * g["maxReplicas"] for g in groups.values())
            assert need <= have, (spec["name"], need, have)
        else:
            for pool in pools:
                g = groups[pool]
                gpus = int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                assert spec[pool]["max"] * tp <= gpus * g["maxReplicas"], (spec["name"], pool)


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_every_ray_container_runs_with_the_cluster_environment(overlay: str) -> None:
    """Head and workers carry :func:`ray_cluster_env` (HAProxy ingress, direct streaming, process groups):
    the apps are built for it, and a node without it would serve them through the slower path."""
    from baton.dataplane.render import ray_cluster_env

    rs = k8s.by_kind(k8s.render(overlay), "RayService")["baton-ray"]
    cluster = rs["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for pod in pods:
        for c in pod["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            for name, value in ray_cluster_env().items():
                assert env.get(name) == value, (overlay, c["name"], name)
