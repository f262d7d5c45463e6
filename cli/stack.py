"""``baton up`` / ``baton down`` / ``baton status``: the whole platform on this machine.

``up`` is idempotent: every step checks what is already there. It brings up, in order: local secrets
(``var/baton.env``), the Postgres schema, the tiny default model, a loopback-only Ray head, the
catalogue (model, P/D deployment, a demo tenant with a key), the reconciler's first apply (the Serve
app comes up), the gateway + console, and a Celery worker. ``down`` stops what ``up`` started.
"""

from __future__ import annotations

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

DEMO_TENANT = "demo"
DEMO_MODEL = "tiny-llama"
DEMO_DEPLOYMENT = "tiny-llama-pd"

# Ray's own processes and every engine they spawn stay on loopback.
LOOPBACK_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    "UCX_NET_DEVICES": "lo",
}


def _console() -> object:
    from rich.console import Console

    return Console(stderr=True)


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

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        running = self.pid(name)
        if running:
            return running
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        (self.run_dir / f"{name}.pid").write_text(str(proc.pid))
        return proc.pid

    def stop(self, name: str, timeout_s: float = 20.0) -> bool:
        pid = self.pid(name)
        (self.run_dir / f"{name}.pid").unlink(missing_ok=True)
        if pid is None:
            return False
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, interval_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
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


def start_ray_head(settings: Settings) -> None:
    if ray_head_running(settings):
        return
    port = settings.ray.address.rsplit(":", 1)[-1]
    dash_port = settings.ray.dashboard_url.rsplit(":", 1)[-1]
    subprocess.run(
        [
            _bin("ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", port,
            "--dashboard-host", "127.0.0.1", "--dashboard-port", dash_port,
            "--num-cpus", str(settings.ray.num_cpus), "--disable-usage-stats",
        ],
        check=True, env={**os.environ, **LOOPBACK_ENV}, stdout=subprocess.DEVNULL,
    )
    wait_for("Ray dashboard", lambda: ray_head_running(settings), 120)


def stop_ray_head() -> None:
    subprocess.run([_bin("ray"), "stop", "--force"], check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


# --- commands -------------------------------------------------------------------------------------------

def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)


def up(
    with_model: bool = typer.Option(True, "--model/--no-model", help="Deploy the tiny model in P/D mode."),
) -> None:
    """Bring Baton up on this machine: schema, Ray head, tiny model in P/D mode, gateway and console."""
    from baton.cli.db import ensure_database
    from baton.core.settings import load_settings

    state = Path(os.environ.get("BATON_STATE_DIR", "var"))
    _env_path, admin_token = ensure_env_file(state)
    settings = load_settings()
    ensure_database(settings.db.url)
    raise typer.Exit(_fail("deployment step not wired yet"))


def down() -> None:
    """Stop what `baton up` started (gateway, worker, the Ray head and its Serve apps)."""
    state = Path(os.environ.get("BATON_STATE_DIR", "var"))
    procs = Processes(state)
    for name in ("gateway", "worker"):
        if procs.stop(name):
            typer.echo(f"stopped {name}")
    stop_ray_head()
    typer.echo("stopped the Ray head")
