"""One source of truth: the RayService's serveConfigV2 is the reconciler's rendering of the overlay's
desired deployments, and the committed file is current."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from baton.cli import ops
from baton.cli.main import app
from tests.unit.ops import _k8s as k8s


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_committed_serve_config_is_what_the_renderer_produces(overlay: str) -> None:
    path = k8s.OVERLAYS_DIR / overlay
    committed = (path / ops.PATCH_FILE).read_text()
    assert committed == ops.serve_config_patch(path.relative_to(k8s.ROOT)), (
        f"{path / ops.PATCH_FILE} is stale: run `baton ops render-serve-config ops/k8s/overlays/{overlay}`"
    )


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_serve_config_matches_the_reconcilers_entries_for_the_same_rows(overlay: str) -> None:
    """Built here the way Reconciler._desired builds its entries, from the same rows."""
    from baton.control.spec_rows import deployment_spec
    from baton.dataplane.render import PREFILL_APP_IMPORT_PATH, PREFILL_APP_SUFFIX, render_serve_applications
    from baton.dataplane.spec import DeploymentSpec

    path = k8s.OVERLAYS_DIR / overlay
    config = ops.render_overlay_serve_config(path)
    rows = ops.load_desired(path / ops.DESIRED_FILE)
    assert config["applications"] == [e for d, m in rows for e in render_serve_applications(deployment_spec(d, m))]
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8000}
    for entry in config["applications"]:
        spec = DeploymentSpec.model_validate(entry["args"])
        if entry["import_path"] == PREFILL_APP_IMPORT_PATH:  # a P/D deployment's prefill pool
            assert spec.mode == "pd"
            assert entry["name"] == spec.name + PREFILL_APP_SUFFIX
            assert entry["route_prefix"] == f"/{spec.name}{PREFILL_APP_SUFFIX}"
        else:
            assert entry["name"] == spec.name
            assert entry["route_prefix"] == f"/{spec.name}"


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_rendered_rayservice_carries_the_generated_config(overlay: str) -> None:
    if k8s.kubectl() is None:
        pytest.skip("kubectl (with built-in kustomize) is not installed")
    rs = k8s.by_kind(k8s.render(overlay), "RayService")["baton-ray"]
    assert yaml.safe_load(rs["spec"]["serveConfigV2"]) == ops.render_overlay_serve_config(k8s.OVERLAYS_DIR / overlay)


def test_overlays_deploy_the_intended_profiles() -> None:
    from baton.dataplane.render import PREFILL_APP_IMPORT_PATH

    def main_apps(overlay: str) -> list[dict]:  # without the P/D deployments' prefill applications
        apps = ops.render_overlay_serve_config(k8s.OVERLAYS_DIR / overlay)["applications"]
        return [a for a in apps if a["import_path"] != PREFILL_APP_IMPORT_PATH]

    cpu, gpu = main_apps("cpu-demo"), main_apps("gpu")
    assert [(a["args"]["device"], a["args"]["mode"], a["args"]["kv"]["connector"]) for a in cpu] == [
        ("cpu", "pd", "nixl")
    ]
    assert [(a["args"]["device"], a["args"]["mode"], a["args"]["kv"]["connector"]) for a in gpu] == [
        ("gpu", "pd", "nixl")
    ]
    tiers = gpu[0]["args"]["kv"]["lmcache"]
    assert tiers["local_cpu_gib"] > 0 and tiers["local_disk_path"] and tiers["redis_url"]


def _overlay(tmp_path: Path, body: str) -> Path:
    (tmp_path / ops.DESIRED_FILE).write_text(body)
    return tmp_path


DESIRED = """
models:
  - {name: tiny, source: /models/tiny, context_length: 4096, num_layers: 2, num_kv_heads: 2, head_dim: 32,
     dtype: float32}
deployments:
  - {name: tiny-agg, model: tiny, mode: aggregated}
"""


def test_cli_writes_then_checks(tmp_path: Path) -> None:
    overlay = _overlay(tmp_path, DESIRED)
    runner = CliRunner()
    res = runner.invoke(app, ["ops", "render-serve-config", "--check", str(overlay)])
    assert res.exit_code == 1
    assert not (overlay / ops.PATCH_FILE).exists()
    res = runner.invoke(app, ["ops", "render-serve-config", str(overlay)])
    assert res.exit_code == 0, res.output
    patch = yaml.safe_load((overlay / ops.PATCH_FILE).read_text())
    assert patch["kind"] == "RayService" and patch["metadata"]["name"] == "baton-ray"
    config = yaml.safe_load(patch["spec"]["serveConfigV2"])
    assert [a["name"] for a in config["applications"]] == ["tiny-agg"]
    res = runner.invoke(app, ["ops", "render-serve-config", "--check", str(overlay)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (DESIRED.replace("mode: aggregated", "mode: aggregated, replicas: 3"), "unknown fields"),
        (DESIRED.replace("model: tiny,", "model: other,"), "names a model not in"),
        ("tenants: []\n", "expected the keys"),
    ],
)
def test_malformed_desired_state_is_refused(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ops.DesiredStateError, match=message):
        ops.load_desired(_overlay(tmp_path, body) / ops.DESIRED_FILE)


def test_a_deployment_the_data_plane_would_refuse_is_refused(tmp_path: Path) -> None:
    from baton.core import errors

    overlay = _overlay(tmp_path, DESIRED.replace("mode: aggregated", "mode: pd"))  # P/D without a connector
    with pytest.raises(errors.ValidationError):
        ops.render_overlay_serve_config(overlay)
