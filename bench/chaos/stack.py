"""The system under test: a P/D deployment of the tiny model on its own Ray head, a Baton gateway in
front of it (a ``baton gateway run`` subprocess on Postgres and Redis), a tenant with a key.

Everything the harness starts runs in its own process group on its own free ports and is stopped
afterwards: the Ray head (``ray start --head --block``; never ``ray stop``), the gateway, and a
dedicated ``redis-server`` serving as LMCache's remote tier, so that taking that tier down never
touches the main Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from baton.bench.chaos.faults import RedisTier
from baton.bench.procs import STACK_MARK, Proc, free_port, isolated_ray_env, kill_marked

DEPLOY_TIMEOUT_S = 900.0


@dataclass
class StackConfig:
    state_dir: Path = Path("var/chaos")
    model_dir: Path | None = None
    """The tiny model (built under ``state_dir`` when unset)."""
    model_name: str = "tiny-chaos"
    app: str = ""
    """Serve application name (default ``chaos-<random>``, unique so its process titles are too)."""
    prefill: int = 2
    decode: int = 2
    kv_cache_gib: float = 0.25
    max_num_seqs: int = 8
    max_model_len: int = 2048
    max_num_batched_tokens: int | None = None
    """Tokens per engine step (vLLM's default if unset). Below the prompt length a prefill spans several
    steps, so its engine's gauges show it running (what the injector's victim choice reads)."""
    lmcache_chunk: int = 256
    lmcache_cpu_gib: float = 0.25
    redis_tier: bool = True
    fallback: bool = True
    """The gateway may serve from the prefill pool when the decode pool has no live replica (as deployed
    routes do); off, it waits for the decode pool as before (a benchmark's control arm)."""
    num_cpus: int = 8


@dataclass
class Endpoint:
    """What the load driver and the fault injector need to know about a running stack."""

    gateway_url: str
    api_key: str
    model: str
    app: str
    dashboard_url: str | None = None
    tenant_id: uuid.UUID | None = None
    redis_tier: RedisTier | None = None
    db: Any = None
    """A ``baton.core.db.Database`` for the Postgres checks (None: skipped)."""
    pools: dict[str, int] = field(default_factory=dict)
    model_dir: Path | None = None
    """The deployed model's folder (its tokenizer makes text prompts of an exact length)."""
    metrics_url: str | None = None
    """Ray's metrics agent (``http://host:port/metrics``): the engines' gauges that show which replica is
    serving a request (None: found from the dashboard's node table)."""


def _ray_bin() -> str:
    path = Path(sys.executable).with_name("ray")
    return str(path) if path.exists() else "ray"


def _wait(what: str, check: Any, timeout_s: float, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: {proc.name} exited; log {proc.log_path}:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(1)


@dataclass
class RayHead:
    """A Ray head of a benchmark's own (``ray start --head --block`` in its own process group)."""

    proc: Proc
    dashboard_url: str
    serve_port: int
    temp_dir: Path
    metrics_url: str | None = None
    """The head's metrics agent (``--metrics-export-port``)."""

    def stop(self) -> None:
        """The whole head's process group: raylet, GCS, dashboard, every worker and engine."""
        if self.proc.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.popen.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.popen.wait(10)
        # workers run in process groups of their own; one whose raylet died first (an engine, HAProxy)
        # still carries the head's mark
        kill_marked(str(self.temp_dir))


def start_head(logs: Path, *, num_cpus: int = 8, env: dict[str, str] | None = None) -> RayHead:
    """A loopback-only Ray head on free ports, with Baton's cluster environment (HAProxy ingress, direct
    streaming, process groups: :func:`baton.bench.procs.isolated_ray_env`)."""
    gcs, dash, serve, metrics = free_port(), free_port(), free_port(), free_port()
    temp = Path(f"/tmp/baton-head-{gcs}")  # noqa: S108 - short: Ray puts sockets here
    head_env = {"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                "UCX_NET_DEVICES": "lo", "RAY_USAGE_STATS_ENABLED": "0", **isolated_ray_env(), **(env or {}),
                STACK_MARK: str(temp)}
    cmd = [_ray_bin(), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
           "--dashboard-host", "127.0.0.1", f"--dashboard-port={dash}", "--num-cpus", str(num_cpus),
           f"--temp-dir={temp}", "--disable-usage-stats",
           f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
           f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={free_port()}",
           f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"]
    proc = Proc("ray-head", cmd, env=head_env, log_path=logs / "ray-head.log").start()
    url = f"http://127.0.0.1:{dash}"
    try:
        _wait("Ray head", lambda: httpx.get(f"{url}/api/version", timeout=2).status_code < 500, 180, proc)
    except BaseException:
        RayHead(proc, url, serve, temp).stop()
        raise
    return RayHead(proc, url, serve, temp, metrics_url=f"http://127.0.0.1:{metrics}/metrics")


def deploy(head: RayHead, specs: list[Any], *, timeout_s: float = DEPLOY_TIMEOUT_S) -> dict[str, str]:
    """Applies the specs' Serve config on the head and waits until every app runs; their OpenAI base URLs."""
    from baton.control.ray_client import RayServeClient, read_token
    from baton.dataplane.render import render_serve_config

    config = render_serve_config(specs, http_host="127.0.0.1", http_port=head.serve_port)
    client = RayServeClient(head.dashboard_url, token=read_token(Path.home() / ".ray" / "auth_token"),
                            timeout_s=60)
    names = [a["name"] for a in config["applications"]]  # a P/D deployment's prefill pool included
    try:
        client.apply(config)
        deadline = time.monotonic() + timeout_s
        while True:
            apps = client.status().apps
            for name in names:
                app = apps.get(name)
                if app is not None and app.status == "DEPLOY_FAILED":
                    raise RuntimeError(f"deploying {name} failed: {app.message[:2000]}")
            if all(apps.get(n) is not None and apps[n].status == "RUNNING" for n in names):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{names} not running after {timeout_s:.0f} s: {apps}")
            time.sleep(3)
    finally:
        client.close()
    return {s.name: f"http://127.0.0.1:{head.serve_port}{s.route_prefix.rstrip('/')}/v1" for s in specs}


def fallback_urls(head: RayHead, specs: list[Any]) -> dict[str, str]:
    """The OpenAI base URL of each P/D spec's prefill pool (the gateway's fallback for its decode pool)."""
    from baton.dataplane.render import prefill_route

    return {s.name: f"http://127.0.0.1:{head.serve_port}{prefill_route(s)}/v1" for s in specs if s.mode == "pd"}


def add_tenant(db: Any, settings: Any, models: dict[str, Path], *, max_model_len: int, prefix: str) -> tuple[
        uuid.UUID, str]:
    """Catalogue models (name -> tiny model folder) and a new tenant granted all of them; its key."""
    from baton.control.keys import KeyService
    from baton.core import models as m

    with db.system() as uow:
        for model_name, model_dir in models.items():
            if uow.models.by_name(model_name) is None:
                uow.models.add(m.Model(name=model_name, source=str(Path(model_dir).resolve()),
                                       context_length=max_model_len, num_layers=2, num_kv_heads=2, head_dim=32,
                                       dtype="float32"))
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        t = uow.tenants.add(m.Tenant(name=name, display_name=name))
        for model_name in models:
            model = uow.models.by_name(model_name)
            assert model is not None
            uow.tenant_models.grant(t.id, model.id)
        uow.commit()
        tenant_id = t.id
    issued = KeyService(db, settings).issue(tenant_id=tenant_id, name=prefix, created_by=f"baton-{prefix}")
    return tenant_id, issued.secret


def start_gateway(settings: Any, upstreams: dict[str, str], logs: Path, *, env: dict[str, str] | None = None,
                  fallbacks: dict[str, str] | None = None) -> tuple[Proc, str]:
    """A ``baton gateway run`` subprocess serving ``upstreams`` (model -> OpenAI base URL), with the
    ``fallbacks`` pools (model -> OpenAI base URL) for when an upstream has no live replica."""
    s = settings
    port = free_port()
    gw_env = {
        "BATON_ENV": s.env,
        "BATON_DB__URL": s.db.url,
        "BATON_DB__APP_ROLE": s.db.app_role,
        "BATON_DB__APP_URL": s.db.service_url(),
        "BATON_REDIS__URL": s.redis.url,
        "BATON_SECURITY__KEY_SECRET": s.security.key_secret.get_secret_value(),
        "BATON_GATEWAY__UPSTREAMS": json.dumps(upstreams),
        "BATON_GATEWAY__FALLBACK_UPSTREAMS": json.dumps(fallbacks or {}),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    proc = Proc("gateway", [sys.executable, "-m", "baton.cli.main", "gateway", "run", "--port", str(port)],
                env=gw_env, log_path=logs / "gateway.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("gateway", lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, 300, proc)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def deployment_spec(cfg: StackConfig, model_dir: Path, redis_url: str | None, nixl_port_base: int,
                    facts_redis_url: str) -> Any:
    from baton.dataplane.spec import DeploymentSpec

    lmcache: dict[str, Any] = {"chunk_size": cfg.lmcache_chunk, "local_cpu_gib": cfg.lmcache_cpu_gib}
    if redis_url:
        lmcache["redis_url"] = redis_url
    return DeploymentSpec(
        name=cfg.app,
        model={"path": str(model_dir.resolve()), "served_name": cfg.model_name},
        mode="pd",
        prefill={"min": cfg.prefill, "max": cfg.prefill},
        decode={"min": cfg.decode, "max": cfg.decode},
        engine={"kv_cache_space_gib": cfg.kv_cache_gib, "max_num_seqs": cfg.max_num_seqs,
                "max_model_len": cfg.max_model_len, "max_num_batched_tokens": cfg.max_num_batched_tokens},
        kv={"connector": "nixl", "nixl_port_base": nixl_port_base, "lmcache": lmcache},
        route_prefix=f"/{cfg.app}",
        telemetry={"facts_redis_url": facts_redis_url},
    )


class ChaosStack:
    """Context manager: brings the stack up, yields an :class:`Endpoint`, stops what it started."""

    def __init__(self, cfg: StackConfig, settings: Any, db: Any, *, log: Any = print) -> None:
        self.cfg = cfg
        if not cfg.app:
            cfg.app = f"chaos-{uuid.uuid4().hex[:6]}"
        self.settings = settings
        self.db = db
        self.log = log
        self.logs = Path(cfg.state_dir) / "logs"
        self.head: RayHead | None = None
        self.gateway: Proc | None = None
        self.tier: RedisTier | None = None

    # -- pieces ---------------------------------------------------------------------------------

    def _model_dir(self) -> Path:
        if self.cfg.model_dir is not None:
            return Path(self.cfg.model_dir)
        from baton.dataplane.tinymodel import build_tiny_model

        folder = Path(self.cfg.state_dir) / "models" / "tiny-seed0"
        if not (folder / "config.json").exists():
            self.log(f"building the tiny model in {folder}")
            build_tiny_model(folder, seed=0)
        return folder

    def _deploy(self, head: RayHead, model_dir: Path) -> tuple[str, str | None]:
        """The deployment's OpenAI base URL and its fallback pool's (the prefill pool)."""
        nixl = 24000 + (head.serve_port % 40) * 100
        spec = deployment_spec(self.cfg, model_dir, self.tier.url if self.tier else None, nixl,
                               self.settings.redis.url)
        return deploy(head, [spec])[self.cfg.app], fallback_urls(head, [spec]).get(self.cfg.app)

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Endpoint:
        try:
            model_dir = self._model_dir()
            if self.cfg.redis_tier:
                self.tier = RedisTier(free_port(), self.logs / "redis-tier.log")
                self.tier.start()
                self.log(f"LMCache Redis tier: {self.tier.url}")
            # engine gauges exported every second (Ray's default is 10 s): the injector picks a victim serving
            # a request from them (baton.bench.chaos.victims)
            self.head = head = start_head(self.logs, num_cpus=self.cfg.num_cpus,
                                          env={"RAY_metrics_report_interval_ms": "1000"})
            dashboard = head.dashboard_url
            self.log(f"Ray head: dashboard {dashboard}; deploying {self.cfg.app} "
                     f"({self.cfg.prefill} prefill + {self.cfg.decode} decode)")
            upstream, fallback = self._deploy(head, model_dir)
            tenant_id, secret = add_tenant(self.db, self.settings, {self.cfg.model_name: model_dir},
                                           max_model_len=self.cfg.max_model_len, prefix="chaos")
            extra = {"BATON_REDIS__LMCACHE_URL": self.tier.url} if self.tier is not None else None
            self.gateway, gateway = start_gateway(
                self.settings, {self.cfg.model_name: upstream}, self.logs, env=extra,
                fallbacks={self.cfg.model_name: fallback} if fallback and self.cfg.fallback else None)
            self.log(f"gateway {gateway} -> {upstream}")
        except BaseException:
            self.close()
            raise
        return Endpoint(gateway_url=gateway, api_key=secret, model=self.cfg.model_name, app=self.cfg.app,
                        dashboard_url=dashboard, tenant_id=tenant_id, redis_tier=self.tier, db=self.db,
                        pools={"prefill": self.cfg.prefill, "decode": self.cfg.decode},
                        metrics_url=self.head.metrics_url, model_dir=model_dir)

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.head is not None:
            self.head.stop()
            _kill_leftovers(self.cfg.app)
        if self.tier is not None:
            self.tier.stop()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_leftovers(app: str) -> None:
    """Replica and engine processes of this app that outlived the head (they run in other sessions)."""
    import psutil

    from baton.bench.chaos.faults import replicas_from_titles

    for rep in replicas_from_titles(app):
        for pid in rep.tree:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@contextlib.contextmanager
def fresh_database(settings: Any, *, keep: bool = False, log: Any = print) -> Any:
    """A new Postgres database on the configured server, migrated to head; yields settings pointing at it
    and drops it afterwards (unless ``keep``)."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    root = Path(__file__).resolve().parents[2]
    owner = make_url(settings.db.url)
    name = f"baton_chaos_{uuid.uuid4().hex[:8]}"
    admin = create_engine(owner.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = owner.set(database=name).render_as_string(hide_password=False)
    app_url = make_url(settings.db.service_url()).set(database=name).render_as_string(hide_password=False)
    try:
        cfg = Config(str(root / "alembic.ini"))
        cfg.set_main_option("script_location", str(root / "migrations"))
        cfg.attributes["url"] = url
        cfg.attributes["app_role"] = settings.db.app_role
        command.upgrade(cfg, "head")
        log(f"database {name} (migrated)")
        yield settings.model_copy(update={"db": settings.db.model_copy(update={"url": url, "app_url": app_url})})
    finally:
        if not keep:
            with admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": name})
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
