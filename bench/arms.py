"""The arms of the gateway comparison, each started in front of the same upstream:

- Baton's gateway as `baton gateway run` starts it, with a real Postgres database (``baton db upgrade``), a tenant,
  a model grant, rate limits and a key made through the control plane's :class:`KeyService`, and a
  static upstream route (``BATON_GATEWAY__UPSTREAMS``).
- LiteLLM's proxy from PyPI in its own virtual environment (``var/bench/litellm-venv``, created on
  first use, never Baton's ``.venv``) with a master key; its Postgres virtual-key mode downloads Prisma
  engines at start-up, which fails offline, so the master key is the key.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from baton.bench.procs import Proc, StartError, free_port, log_dir, python

DEFAULT_DB_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/baton_bench"


@dataclass
class BatonTenant:
    tenant_id: uuid.UUID
    api_key: str
    key_secret: str
    db_url: str


def migrate(db_url: str) -> None:
    """``baton db upgrade --url DB_URL`` (creates the database when missing)."""
    out = subprocess.run([python(), "-m", "baton.cli.main", "db", "upgrade", "--url", db_url],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise StartError(f"baton db upgrade failed:\n{(out.stdout + out.stderr)[-3000:]}")


def provision_tenant(db_url: str, *, model: str, model_source: str, context_length: int = 4096,
                     shape: tuple[int, int, int] = (2, 2, 32), dtype: str = "float32") -> BatonTenant:
    """A fresh tenant with ``model`` granted, generous rate limits (checked on every request, never
    hit) and one API key issued by :class:`~baton.control.keys.KeyService`."""
    from baton.control.keys import KeyService
    from baton.core import models as m
    from baton.core.db import Database
    from baton.core.settings import load_settings

    # the key secret the database's other keys were made with (the stack's settings, var/baton.env): a
    # bench key made with another would be refused by Baton beside live keys (key_secret_mismatch)
    settings = load_settings(db={"url": db_url})
    key_secret = settings.security.key_secret.get_secret_value()
    db = Database.for_owner(settings)
    try:
        with db.system() as uow:
            tenant = uow.tenants.add(m.Tenant(name=f"bench-{secrets.token_hex(4)}", display_name="baton bench"))
            row = uow.models.by_name(model)
            if row is None:
                layers, kv_heads, head_dim = shape
                row = uow.models.add(m.Model(name=model, source=model_source, context_length=context_length,
                                             num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                                             dtype=dtype))
            uow.tenant_models.grant(tenant.id, row.id)
            uow.rate_limits.upsert(tenant.id, None, requests_per_minute=100_000_000,
                                   tokens_per_minute=2_000_000_000, max_concurrency=100_000)
            tenant_id = tenant.id
            uow.commit()
        issued = KeyService(db, settings).issue(tenant_id=tenant_id, name="bench", created_by="baton-bench",
                                                model_scope=[model])
    finally:
        db.dispose()
    return BatonTenant(tenant_id=tenant_id, api_key=issued.secret, key_secret=key_secret, db_url=db_url)


def gateway_env(tenant: BatonTenant, *, upstreams: dict[str, str], tracing: bool,
                otlp_endpoint: str | None) -> dict[str, str]:
    from sqlalchemy.engine import make_url

    app_url = make_url(tenant.db_url).set(username="baton_app", password=None).render_as_string(hide_password=False)
    env = {
        "BATON_ENV": "dev",
        "BATON_DB__URL": tenant.db_url,
        "BATON_DB__APP_URL": app_url,
        "BATON_SECURITY__KEY_SECRET": tenant.key_secret,
        "BATON_GATEWAY__UPSTREAMS": json.dumps(upstreams),
        "BATON_TELEMETRY__ENABLED": "true" if tracing else "false",
        "BATON_TELEMETRY__SERVICE_NAME": "baton-bench",
    }
    if tracing and otlp_endpoint:
        env["BATON_TELEMETRY__OTLP_ENDPOINT"] = otlp_endpoint
    return env


def start_gateway(name: str, env: dict[str, str], *, cpus: list[int] | None = None, workers: int = 1,
                  timeout_s: float = 180.0) -> tuple[Proc, str]:
    """Baton's gateway as ``baton gateway run`` starts it (``workers`` processes); returns the process (and
    its children) and its ``/v1`` base URL. ``timeout_s``: how long it may take to answer ``/healthz`` (a few
    seconds on a quiet machine; several worker processes importing at once on a loaded one take longer)."""
    port = free_port()
    # as it ships (`baton gateway run`: uvloop, httptools, the gateway's keep-alive and shutdown settings)
    cmd = [python(), "-m", "baton.cli.main", "gateway", "run", "--host", "127.0.0.1", "--port", str(port),
           "--workers", str(workers)]
    proc = Proc(name, cmd, env=env, cpus=cpus).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc, f"http://127.0.0.1:{port}/v1"


# --- LiteLLM -------------------------------------------------------------------------------------------

def litellm_venv(state_dir: Path | str = "var") -> Path:
    return Path(state_dir) / "bench" / "litellm-venv"


def ensure_litellm(state_dir: Path | str = "var", *, spec: str = "litellm[proxy]") -> Path:
    """LiteLLM's ``litellm`` executable in its own venv, installing it on first use (``python -m venv``
    + ``pip install 'litellm[proxy]'``)."""
    venv = litellm_venv(state_dir)
    exe = venv / "bin" / "litellm"
    if exe.exists():
        return exe
    import shutil

    base = shutil.which("python3.11") or shutil.which("python3") or python()
    log = log_dir(state_dir) / "litellm-install.log"
    with log.open("wb") as fh:
        for cmd in ([base, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", spec]):
            if subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=1800).returncode != 0:
                raise StartError(f"could not install {spec} into {venv}; see {log}")
    return exe


def litellm_version(exe: Path) -> str | None:
    out = subprocess.run([str(exe.parent / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('litellm'))"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None


def start_litellm(exe: Path, *, model: str, upstream_v1: str, cpus: list[int] | None = None,
                  timeout_s: float = 120.0) -> tuple[Proc, str, str]:
    """LiteLLM's proxy routing ``model`` to the OpenAI-compatible ``upstream_v1``, master key only;
    returns the process, its ``/v1`` base URL and the key."""
    port = free_port()
    master = "sk-bench-" + secrets.token_hex(12)
    cfg = log_dir() / f"litellm-{port}.yaml"
    cfg.write_text(json.dumps({
        "model_list": [{"model_name": model, "litellm_params": {
            "model": f"hosted_vllm/{model}", "api_base": upstream_v1, "api_key": "none"}}],
        "general_settings": {"master_key": master},
        "litellm_settings": {"drop_params": False, "telemetry": False},
    }))  # JSON is YAML
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False",
           "DISABLE_ADMIN_UI": "True", "NO_DOCS": "True"}
    proc = Proc("litellm", [str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                            "--num_workers", "1"], env=env, cpus=cpus).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc, f"http://127.0.0.1:{port}/v1", master
