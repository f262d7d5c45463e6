"""Offline validation of rendered manifests: Kubernetes' own JSON schemas for core kinds
(`kubernetes-validate`), KubeRay's CRD schemas for RayCluster/RayService.

CRD schemas are OpenAPI v3 "structural" schemas: the API server silently prunes fields it does not
know, so a typo never fails an apply, it just disappears. :func:`unknown_fields` reports such fields,
the way `kubectl apply --validate=strict` does on a live cluster.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
OVERLAYS_DIR = ROOT / "ops" / "k8s" / "overlays"
OVERLAYS = sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").exists())
#: CI gets a read-only copy of the shared folder next to the repository.
KUBERAY_SCHEMAS = ROOT.parent / "shared" / "schemas" / "kuberay"
#: Oldest and newest Kubernetes versions the manifests must be valid for.
K8S_VERSIONS = ("1.29", "1.33")
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayService": "ray.io_rayservices.yaml"}


def kubectl() -> str | None:
    return shutil.which("kubectl")


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """Objects of `kubectl kustomize ops/k8s/overlays/<overlay>`."""
    exe = kubectl()
    assert exe is not None
    out = subprocess.run(
        [exe, "kustomize", str(OVERLAYS_DIR / overlay)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


@functools.cache
def crd_schema(kind: str, version: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are ~1 MB of YAML each
    crd = yaml.load((KUBERAY_SCHEMAS / CRD_FILES[kind]).read_text(), Loader=loader)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{kind} has no version {version} in {CRD_FILES[kind]}")


def validate_custom(doc: dict[str, Any]) -> list[str]:
    """Errors of a KubeRay object against its CRD schema (empty: valid)."""
    import jsonschema

    group, version = doc["apiVersion"].split("/")
    assert group == "ray.io", doc["apiVersion"]
    schema = crd_schema(doc["kind"], version)
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    errors += [f"{path}: unknown field (the API server would drop it)" for path in unknown_fields(doc, schema)]
    return errors


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths in ``value`` that a structural schema does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += unknown_fields(item, props[key], sub)
            elif isinstance(extra, dict):
                found += unknown_fields(item, extra, sub)
            elif props is not None and path not in ("metadata",) and not path.endswith(".metadata"):
                found.append(sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def validate_core(doc: dict[str, Any], version: str) -> list[str]:
    """Errors of a core Kubernetes object against the strict JSON schema of ``version``."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
