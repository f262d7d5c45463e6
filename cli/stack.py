"""``baton up`` / ``baton down`` / ``baton status``: the whole platform on this machine.

``up`` is idempotent: every step checks what is already there. It brings up, in order: local secrets
(``var/baton.env``), the Postgres schema, the tiny models (a causal LM and an embedding model), a loopback-only
Ray head, the catalogue (the LM with tools enabled and its P/D deployment, the embedding model and its aggregated
deployment, a demo tenant with a key), the reconciler's first apply (the Serve
app comes up), the gateway + console, and a Celery worker. ``down`` stops what ``up`` started.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from baton.core.settings import Settings

from baton.bench.procs import STACK_MARK, kill_marked
from baton.dataplane.render import CPU_HOST_CONTROL_LOOP_S, ray_cluster_env

DEMO_TENANT = "demo"
DEMO_MODEL = "tiny-llama"
DEMO_DEPLOYMENT = "tiny-llama-pd"
#: The demo model's tool-call parser (its chat template, ``TOOLS_CHAT_TEMPLATE``, writes Hermes's format).
DEMO_TOOL_PARSER = "hermes"
EMBED_MODEL = "tiny-embed"
EMBED_DEPLOYMENT = "tiny-embed"

# Ray's own processes and every engine they spawn stay on loopback.
LOOPBACK_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    "UCX_NET_DEVICES": "lo",
}


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


# --- local secrets --------------------------------------------------------------------------------------

def ensure_env_file(state_dir: Path) -> tuple[Path, str | None]:
    """Creates ``var/baton.env`` with fresh secrets once. Returns its path and a new admin token, if made."""
    path = state_dir / "baton.env"
    if path.exists():
        return path, None
    state_dir.mkdir(parents=True, exist_ok=True)
    from baton.core.secrets import ADMIN_PREFIX, new_secret

    admin = new_secret(ADMIN_PREFIX)
    path.write_text(
        "# Made by `baton up` for this machine. Keep it private.\n"
        f"BATON_SECURITY__KEY_SECRET={secrets.token_urlsafe(48)}\n"
        f"BATON_SECURITY__SESSION_SECRET={secrets.token_urlsafe(48)}\n"
        f"BATON_SECURITY__ADMIN_TOKEN={admin}\n"
    )
    path.chmod(0o600)
    return path, admin


def load_env_file(path: Path) -> None:
    """Puts the file's settings into this process's environment (what is already set wins), so every
    process ``up`` starts shares the same secrets."""
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.lstrip().startswith("#"):
            os.environ.setdefault(name.strip(), value.strip())


# --- background processes -------------------------------------------------------------------------------

class Processes:
    """Background processes that ``up`` starts, tracked by pid files under ``var/run``."""

    def __init__(self, state_dir: Path) -> None:
        self.run_dir = state_dir / "run"
        self.log_dir = state_dir / "log"

    def pid(self, name: str) -> int | None:
        path = self.run_dir / f"{name}.pid"
        try:
            pid = int(path.read_text().strip())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            return None
        return pid

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, *,
              secrets: bool = True) -> int:
        """Starts ``argv`` in its own session; ``secrets=False`` leaves Baton's secrets
        (``BATON_SECURITY__*``) out of its environment."""
        running = self.pid(name)
        if running:
            return running
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        base = {k: v for k, v in os.environ.items() if secrets or not k.startswith("BATON_SECURITY__")}
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**base, **(env or {})}, start_new_session=True,
        )
        (self.run_dir / f"{name}.pid").write_text(str(proc.pid))
        return proc.pid

    def exited(self, name: str) -> bool:
        """Whether the process ``start`` started under ``name`` has ended (reaped here when it is a child)."""
        pid = self.pid(name)
        if pid is None:
            return True
        try:
            return os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:  # started by an earlier ``up``: alive, as pid() found
            return False

    def log_tail(self, name: str, lines: int = 5) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, name: str, timeout_s: float = 20.0) -> bool:
        pid = self.pid(name)
        (self.run_dir / f"{name}.pid").unlink(missing_ok=True)
        if pid is None:
            return False
        group = True
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:  # alive (pid() found it) but not a group leader: restarted by hand
            group = False
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):  # a child of this process: reaped, not a zombie
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return True
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)
        return True


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, interval_s: float = 1.0, *,
             process: tuple[Processes, str] | None = None) -> None:
    """Polls ``check`` until it holds; fails after ``timeout_s``, or at once when ``process`` (the one that
    should come up) has exited, with the end of its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if process is not None and process[0].exited(process[1]):
            procs, name = process
            raise typer.Exit(_fail(f"{what} exited before it came up; the end of {procs.log_dir / name}.log:\n"
                                   f"{procs.log_tail(name)}"))
        time.sleep(interval_s)
    raise typer.Exit(_fail(f"{what} did not come up within {timeout_s:.0f} s (logs: var/log/)"))


def _fail(message: str) -> int:
    typer.secho(f"baton up: {message}", fg="red", err=True)
    return 1


def _http_ok(url: str, headers: dict[str, str] | None = None) -> bool:
    import httpx

    try:
        return httpx.get(url, headers=headers, timeout=2.0).status_code < 500
    except httpx.HTTPError:
        return False


# --- Ray head -------------------------------------------------------------------------------------------

def ray_head_running(settings: Settings) -> bool:
    return _http_ok(f"{settings.ray.dashboard_url}/api/version")


def start_ray_head(settings: Settings, procs: Processes) -> None:
    """A loopback-only Ray head in its own process group (``ray start --block``), so ``down`` stops exactly
    this head and never another Ray on the same machine. Its environment sets Serve's HAProxy ingress,
    direct streaming and per-worker process groups for the whole cluster
    (:func:`baton.dataplane.render.ray_cluster_env`)."""
    if ray_head_running(settings):
        return
    port = settings.ray.address.rsplit(":", 1)[-1]
    dash_port = settings.ray.dashboard_url.rsplit(":", 1)[-1]
    procs.start("ray", [
        _bin("ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", port,
        "--dashboard-host", "127.0.0.1", "--dashboard-port", dash_port,
        "--num-cpus", str(settings.ray.num_cpus), "--disable-usage-stats",
        f"--metrics-export-port={settings.ray.metrics_export_port}",
        # Nothing reads Ray's log monitor here (no driver attaches): Ray's logs stay in its session folder.
        "--include-log-monitor=false",
    ], env={**LOOPBACK_ENV, **ray_cluster_env(control_loop_s=CPU_HOST_CONTROL_LOOP_S), STACK_MARK: stack_mark(procs)},
        secrets=False)
    wait_for("Ray dashboard", lambda: ray_head_running(settings), 180, process=(procs, "ray"))


def stack_mark(procs: Processes) -> str:
    """The ``BATON_STACK`` mark of ``up``'s Ray head: how ``down`` finds a process that outlived it."""
    return str(procs.run_dir.resolve())


# --- catalogue through the admin API ---------------------------------------------------------------------

class Admin:
    """A small client of Baton's own /admin/v1, so ``up`` goes through validation, audit and reconcile."""

    def __init__(self, base_url: str, token: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=f"{base_url}/admin/v1", headers={"authorization": f"Bearer {token}"},
                                 timeout=30.0)

    def find(self, path: str, **match: str) -> dict[str, object] | None:
        r = self.http.get(path, params={"limit": 200})
        r.raise_for_status()
        body = r.json()
        items = body["data"]
        return next((i for i in items if all(i.get(k) == v for k, v in match.items())), None)

    def ensure(self, path: str, body: dict[str, object], *, keep: tuple[str, ...] = (),
               **match: str) -> dict[str, object]:
        """The item matching ``match``, created from ``body`` if missing; the fields named in ``keep`` are
        brought to ``body``'s values on an item that exists (an install from before they were set)."""
        found = self.find(path, **match)
        if found is None:
            r = self.http.post(path, json=body)
        else:
            changed = {k: body[k] for k in keep if found.get(k) != body[k]}
            if not changed:
                return found
            r = self.http.patch(f"{path}/{found['id']}", json=changed)
        if r.status_code >= 400:
            raise typer.Exit(_fail(f"{r.request.method} /admin/v1{path}: {r.status_code} {r.text[:300]}"))
        return dict(r.json())


def _model_body(name: str, model_dir: Path, **serving: object) -> dict[str, object]:
    import json

    config = json.loads((model_dir / "config.json").read_text())
    return {"name": name, "source": str(model_dir.resolve()),
            "context_length": int(config["max_position_embeddings"]), "num_layers": int(config["num_hidden_layers"]),
            "num_kv_heads": int(config["num_key_value_heads"]), "head_dim": int(config["head_dim"]),
            "dtype": "float32", **serving}


def ensure_catalogue(admin: Admin, model_dir: Path, embed_dir: Path,
                     redis_url: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The tiny model (tools enabled) and its P/D deployment, the tiny embedding model and its aggregated
    deployment, and the demo tenant with access to both."""
    from baton.dataplane.tinymodel import TOOLS_CHAT_TEMPLATE

    model = admin.ensure("/models", _model_body(DEMO_MODEL, model_dir, tool_call_parser=DEMO_TOOL_PARSER,
                                                chat_template=TOOLS_CHAT_TEMPLATE),
                         keep=("tool_call_parser", "chat_template"), name=DEMO_MODEL)
    embed = admin.ensure("/models", _model_body(EMBED_MODEL, embed_dir, kind="embed"), name=EMBED_MODEL)
    deployment = admin.ensure("/deployments", {
        "name": DEMO_DEPLOYMENT, "model_id": model["id"], "mode": "pd",
        "prefill": {"min": 1, "max": 1}, "decode": {"min": 1, "max": 1},
        "engine": {"kv_cache_space_gib": 0.5, "max_num_seqs": 16, "max_model_len": 4096},
        "kv_connector": "nixl", "lmcache": {"redis_url": redis_url, "local_cpu_gib": 0.25},
    }, name=DEMO_DEPLOYMENT)
    embed_deployment = admin.ensure("/deployments", {
        "name": EMBED_DEPLOYMENT, "model_id": embed["id"], "mode": "aggregated", "decode": {"min": 1, "max": 1},
        "engine": {"kv_cache_space_gib": 0.25, "max_num_seqs": 16, "max_model_len": 4096},
    }, name=EMBED_DEPLOYMENT)
    tenant = admin.ensure("/tenants", {"name": DEMO_TENANT, "display_name": "Demo tenant"}, name=DEMO_TENANT)
    for granted in (model, embed):
        r = admin.http.put(f"/tenants/{tenant['id']}/models/{granted['id']}")
        if r.status_code >= 400:
            raise typer.Exit(_fail(f"could not grant {granted['name']} to {DEMO_TENANT}: {r.status_code} "
                                   f"{r.text[:300]}"))
    return tenant, [deployment, embed_deployment]


def demo_key(admin: Admin, tenant: dict[str, object], state: Path, base_url: str | None = None) -> str:
    """The demo tenant's key: issued on the first ``up`` (its secret is kept in var/demo.key, mode 0600),
    and again when the kept one no longer opens the gateway (revoked, expired, its tenant removed)."""
    path = state / "demo.key"
    if path.exists():
        kept = path.read_text().strip()
        if base_url is None or _key_accepted(base_url, kept):
            return kept
        typer.secho(f"note: {path} holds a key the gateway refuses (revoked, expired or its tenant removed): "
                    "issuing a new demo key", fg="yellow")
    r = admin.http.post(f"/tenants/{tenant['id']}/keys", json={"name": f"demo-{secrets.token_hex(3)}"})
    if r.status_code >= 400:
        raise typer.Exit(_fail(f"could not issue the demo key: {r.status_code} {r.text[:300]}"))
    key = str(r.json()["secret"])
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


def _key_accepted(base_url: str, key: str) -> bool:
    """Whether the gateway takes this key (anything but 401 counts: a limit or a 5xx says nothing of it)."""
    import httpx

    try:
        r = httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    except httpx.HTTPError:
        return True  # the smoke check that follows says what is wrong
    return r.status_code != 401


def wait_running(admin: Admin, deployment: dict[str, object], settings: Settings, timeout_s: float) -> None:
    """Until Ray Serve itself runs the deployment's app and the control plane has seen it: the row's
    ``observed_state`` alone may still be the previous run's, before the reconciler's first pass."""
    import datetime as dt

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from baton.control.ray_client import RayServeClient

    ray = RayServeClient.from_settings(settings)
    deadline = time.monotonic() + timeout_s
    started = dt.datetime.now(dt.UTC)
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      transient=True) as bar:
            label = f"{deployment['name']} ({'P/D' if deployment.get('mode') == 'pd' else 'aggregated'})"
            task = bar.add_task(f"{label}: waiting for Ray Serve", total=None)
            while time.monotonic() < deadline:
                try:
                    app = ray.status().apps.get(str(deployment["name"]))
                except Exception:
                    app = None
                r = admin.http.get(f"/deployments/{deployment['id']}/status")
                state = r.json().get("observed_state") if r.status_code == 200 else None
                reason = r.json().get("observed_reason") if r.status_code == 200 else None
                seen = r.json().get("observed_at") if r.status_code == 200 else None
                # a failure observed in this run, not the previous run's
                fresh = isinstance(seen, str) and dt.datetime.fromisoformat(seen) >= started
                serving = app.status if app is not None else "not deployed yet"
                bar.update(task, description=f"{label}: Ray Serve {serving.lower()}, control plane {state}")
                if app is not None and app.status == "RUNNING" and state == "running":
                    return
                if (state == "failed" and fresh) or (app is not None and app.status == "DEPLOY_FAILED"):
                    raise typer.Exit(_fail(f"the deployment failed: {reason or app.message if app else reason}"))
                time.sleep(2)
    finally:
        ray.close()
    raise typer.Exit(_fail(f"the deployment was not running after {timeout_s:.0f} s (logs: var/log/ and Ray's "
                           "session logs, logs/serve/)"))


def smoke_embeddings(base_url: str, key: str, timeout_s: float = 120.0) -> int:
    """One embedding through the gateway; returns its dimensions (a 503 is retried until the timeout)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.post(f"{base_url}/v1/embeddings", headers={"authorization": f"Bearer {key}"}, timeout=120,
                       json={"model": EMBED_MODEL, "input": "Hello, Baton!"})
        if r.status_code == 200:
            return len(r.json()["data"][0]["embedding"])
        if r.status_code != 503 or time.monotonic() > deadline:
            raise typer.Exit(_fail(f"an embedding through the gateway failed: {r.status_code} {r.text[:300]}"))
        time.sleep(2)


def smoke(base_url: str, key: str, timeout_s: float = 120.0) -> str:
    """One chat completion through the gateway; a 503 (the app still starting) is retried until the timeout."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.post(f"{base_url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=120,
                       json={"model": DEMO_MODEL, "max_tokens": 12, "temperature": 0,
                             "messages": [{"role": "user", "content": "Hello, Baton!"}]})
        if r.status_code == 200:
            return str(r.json()["choices"][0]["message"]["content"])
        if r.status_code != 503 or time.monotonic() > deadline:
            raise typer.Exit(_fail(f"chat completion through the gateway failed: {r.status_code} {r.text[:300]}"))
        time.sleep(2)


# --- commands -------------------------------------------------------------------------------------------

def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)


def _state_dir() -> Path:
    return Path(os.environ.get("BATON_STATE_DIR", "var"))


def up(
    with_model: bool = typer.Option(True, "--model/--no-model", help="Deploy the tiny model in P/D mode."),
    timeout_s: float = typer.Option(900, "--timeout", help="Seconds to wait for the P/D deployment."),
) -> None:
    """Bring Baton up on this machine: schema, Ray head, tiny model in P/D mode, gateway and console."""
    from rich.console import Console

    from baton.cli.db import ensure_database
    from baton.core.settings import load_settings

    out = Console()
    state = _state_dir()
    env_path, _ = ensure_env_file(state)
    load_env_file(env_path)
    settings = load_settings()
    procs = Processes(state)
    baton = _bin("baton")

    with out.status("Postgres schema"):
        ensure_database(settings.db.url)
        subprocess.run([baton, "db", "upgrade"], check=True, stdout=subprocess.DEVNULL)
    out.print("[green]ok[/] Postgres schema at head")

    model_dir = state / "models" / "tiny-llama"
    embed_dir = state / "models" / EMBED_MODEL
    for folder, kind in ((model_dir, "generate"), (embed_dir, "embed")):
        if with_model and not (folder / "config.json").exists():
            with out.status(f"building the tiny {kind} model"):
                subprocess.run([baton, "model", "make-tiny", "--kind", kind, "--out", str(folder)], check=True,
                               stdout=subprocess.DEVNULL)
    if with_model:
        out.print(f"[green]ok[/] tiny models in {model_dir} and {embed_dir}")
        with out.status("Ray head (loopback only)"):
            start_ray_head(settings, procs)
        out.print(f"[green]ok[/] Ray head, dashboard {settings.ray.dashboard_url}")

    base_url = f"http://{settings.gateway.host}:{settings.gateway.port}"
    procs.start("worker", [baton, "worker"])
    # a new organisation may call the demo model from its sign-up (no operator grant needed on this machine)
    grants = os.environ.get("BATON_TENANCY__DEFAULT_MODELS", f'["{DEMO_MODEL}", "{EMBED_MODEL}"]')
    procs.start("gateway", [baton, "gateway", "run"], env={"BATON_TENANCY__DEFAULT_MODELS": grants})
    wait_for("the gateway", lambda: _http_ok(f"{base_url}/healthz"), 60, process=(procs, "gateway"))
    out.print(f"[green]ok[/] gateway and console at {base_url} (worker running)")

    token = settings.security.admin_token
    if token is None:
        raise typer.Exit(_fail("BATON_SECURITY__ADMIN_TOKEN is not set (var/baton.env)"))
    admin = Admin(base_url, token.get_secret_value())
    if with_model:
        tenant, (deployment, embed_deployment) = ensure_catalogue(admin, model_dir, embed_dir,
                                                                  settings.redis.lmcache_url)
        key = demo_key(admin, tenant, state, base_url)
        wait_running(admin, deployment, settings, timeout_s)
        reply = smoke(base_url, key)
        out.print(f"[green]ok[/] {DEMO_DEPLOYMENT}: prefill and decode pools running; a chat completion "
                  f"answered {reply[:40]!r}")
        wait_running(admin, embed_deployment, settings, timeout_s)
        dims = smoke_embeddings(base_url, key)
        out.print(f"[green]ok[/] {EMBED_DEPLOYMENT}: running; an embedding has {dims} dimensions")
        out.print()
        out.print("Point any OpenAI client at Baton:")
        out.print(f"  OPENAI_BASE_URL={base_url}/v1")
        out.print(f"  OPENAI_API_KEY=$(cat {state / 'demo.key'})   # tenant 'demo'")
        out.print(f"  model: {DEMO_MODEL} (chat, completions, responses, tools)   {EMBED_MODEL} (embeddings)")
    out.print(f"Console: {base_url}/console/   Admin API: {base_url}/admin/v1 (token in {state / 'baton.env'})")
    out.print("Stop everything with: scripts/down")


def down() -> None:
    """Stop what `baton up` started (gateway, worker, the Ray head and its Serve apps), then any process
    of this stack's Ray head that outlived it."""
    procs = Processes(_state_dir())
    for name in ("gateway", "worker", "ray"):
        if procs.stop(name, timeout_s=60):
            typer.echo(f"stopped {name}")
    left = kill_marked(stack_mark(procs))
    if left:
        typer.echo(f"stopped {left} leftover process(es) of the Ray head (replicas, engines)")
