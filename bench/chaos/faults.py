"""Faults on the real processes, each checked to have really happened.

- Replica processes: a Ray Serve replica of deployment ``Prefill:<model>``/``Decode:<model>`` is one Ray
  actor process (title ``ray::ServeReplica:<app>:<deployment>``); its vLLM engine core (which holds the
  KV cache and runs the model) is a child process of it. A *kill* SIGKILLs the whole tree (engine core
  first, then the replica), a *stall* SIGSTOPs it and SIGCONTs it later. Replicas are found through Ray's
  state API (``list_actors``, ALIVE, by class name) when the dashboard answers, else by process title;
  either gives the replica's Serve id (actor name ``SERVE_REPLICA::<app>#<deployment>#<id>``), which labels
  its engine's metrics (``ReplicaId``): :mod:`.victims` picks the replica to hit from them.
- The LMCache Redis tier: a dedicated ``redis-server`` on its own port that the harness can SIGKILL and
  start again on the same port (the main Redis is never touched).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Pool = Literal["prefill", "decode"]
POOL_PREFIX: dict[Pool, str] = {"prefill": "Prefill:", "decode": "Decode:"}
REPLICA_NAME_PREFIX = "SERVE_REPLICA::"


@dataclass(frozen=True)
class Replica:
    pool: Pool
    deployment: str
    pid: int
    actor_id: str = ""
    children: tuple[int, ...] = ()
    replica_id: str = ""
    """Serve's replica unique id (the ``ReplicaId`` label of its engine's metrics); empty when not found."""

    @property
    def tree(self) -> tuple[int, ...]:
        """Engine processes first, then the replica itself."""
        return (*self.children, self.pid)


def _pool_of(deployment: str) -> Pool | None:
    for pool, prefix in POOL_PREFIX.items():
        if deployment.startswith(prefix):
            return pool
    return None


def replica_id_in(text: str, app: str) -> str:
    """The replica id in an actor name or process title (``SERVE_REPLICA::<app>#<deployment>#<id>``), else ''."""
    import re

    m = re.search(re.escape(f"{REPLICA_NAME_PREFIX}{app}#") + r"[^#\s]+#([A-Za-z0-9_-]+)", text)
    return m.group(1) if m else ""


def _children(pid: int) -> tuple[int, ...]:
    import psutil

    try:
        return tuple(c.pid for c in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return ()


def replicas_from_state_api(app: str, dashboard_url: str) -> list[Replica]:
    """ALIVE Serve replica actors of ``app`` from Ray's state API (class ``ServeReplica:<app>:<deployment>``)."""
    from ray.util.state import list_actors

    actors = list_actors(address=dashboard_url, filters=[("state", "=", "ALIVE")], limit=10_000, timeout=10,
                         raise_on_missing_output=False)
    out = []
    prefix = f"ServeReplica:{app}:"
    for a in actors:
        cls = a.class_name if hasattr(a, "class_name") else a["class_name"]
        pid = a.pid if hasattr(a, "pid") else a["pid"]
        if not cls or not cls.startswith(prefix) or not pid:
            continue
        deployment = cls[len(prefix):]
        pool = _pool_of(deployment)
        if pool is None:
            continue
        actor_id = a.actor_id if hasattr(a, "actor_id") else a["actor_id"]
        name = str(getattr(a, "name", None) or "")  # SERVE_REPLICA::<app>#<deployment>#<replica id>
        out.append(Replica(pool, deployment, int(pid), str(actor_id), _children(int(pid)), replica_id_in(name, app)))
    return out


def replicas_from_titles(app: str) -> list[Replica]:
    """The same, from process titles: Ray names an actor's worker process after the actor, e.g.
    ``ray::SERVE_REPLICA::<app>#<deployment>#<id>:ServeReplica:<app>:<deployment>.<method>``."""
    import re

    import psutil

    out = []
    marker = f"ServeReplica:{app}:"
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = p.info["cmdline"] or []
            title = cmd[0] if cmd else ""
            if not title.startswith("ray::") or marker not in title or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            deployment = title.split(marker, 1)[1].split()[0]
            head, _, tail = deployment.rpartition(".")
            if head and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tail):
                deployment = head  # the method the actor is running
            pool = _pool_of(deployment)
            if pool is not None:
                out.append(Replica(pool, deployment, p.info["pid"], "", _children(p.info["pid"]),
                                   replica_id_in(" ".join(cmd), app)))
        except (psutil.Error, IndexError):
            continue
    return out


def replica_ids_from_serve(dashboard_url: str) -> dict[int, str]:
    """Serve's replica ids by process id, from Serve's REST status (its replicas list pid and replica id);
    empty when the dashboard does not answer. A replica's process title does not carry its id."""
    from pathlib import Path

    import httpx

    from baton.control.ray_client import read_token

    token = read_token(Path.home() / ".ray" / "auth_token")
    try:
        r = httpx.get(dashboard_url.rstrip("/") + "/api/serve/applications/", timeout=10, trust_env=False,
                      headers={"Authorization": f"Bearer {token}"} if token else {})
        r.raise_for_status()
        apps = r.json().get("applications") or {}
    except (httpx.HTTPError, ValueError):
        return {}
    out: dict[int, str] = {}
    for app in apps.values():
        for dep in (app.get("deployments") or {}).values():
            for rep in dep.get("replicas") or ():
                if isinstance(rep.get("pid"), int) and rep.get("replica_id"):
                    out[rep["pid"]] = str(rep["replica_id"])
    return out


class ReplicaFinder:
    """Finds a P/D app's replicas; remembers which method worked."""

    def __init__(self, app: str, dashboard_url: str | None) -> None:
        self.app = app
        self.dashboard_url = dashboard_url
        self.method = "state_api" if dashboard_url else "process_title"

    def find(self) -> list[Replica]:
        """Replicas of the deployment's applications: the app itself and, for P/D, its prefill pool's
        (``<app>.prefill``, see :func:`baton.dataplane.render.prefill_app_name`)."""
        from baton.dataplane.render import PREFILL_APP_SUFFIX

        apps = (self.app, self.app + PREFILL_APP_SUFFIX)
        if self.method == "state_api" and self.dashboard_url:
            try:
                found = [r for app in apps for r in replicas_from_state_api(app, self.dashboard_url)]
                if found:
                    return found
            except Exception:  # the state API is optional: fall back to process titles
                self.method = "process_title"
        found = [r for app in apps for r in replicas_from_titles(app)]
        if self.dashboard_url and any(not r.replica_id for r in found):
            ids = replica_ids_from_serve(self.dashboard_url)
            found = [dataclasses.replace(r, replica_id=ids.get(r.pid, "")) if not r.replica_id else r for r in found]
        return found

    def pool(self, pool: Pool) -> list[Replica]:
        return sorted((r for r in self.find() if r.pool == pool), key=lambda r: r.pid)


# -- process checks --------------------------------------------------------------------------------

def gone(pid: int) -> bool:
    """The process no longer runs (absent or a zombie)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def stopped(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.NoSuchProcess:
        return False


def signal_tree(pids: tuple[int, ...], sig: signal.Signals) -> list[int]:
    """Sends ``sig`` to each pid; returns those it reached."""
    reached = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            reached.append(pid)
    return reached


@dataclass
class FaultRecord:
    """One injected fault and the evidence that it happened."""

    kind: str
    at_s: float
    """Seconds since the start of the load."""
    t_mono: float = 0.0
    target: str = ""
    pids: list[int] = field(default_factory=list)
    fired: bool = False
    evidence: str = ""
    recovered: bool | None = None
    """Kills and stalls: the pool is back at full strength with live processes; tier: Redis answers again."""
    recovery_s: float | None = None
    """Kill: seconds until Ray had a replacement replica running (new pid); tier: seconds down."""
    streams_in_flight: int = 0
    """Streams that had a token when the fault fired (the injector's own count)."""
    victim_busy: bool | Literal["unknown"] | None = None
    """Replica faults: whether the victim's engine reported a request running (prefill: or waiting) when it
    was hit; ``"unknown"`` when its metrics could not be read; None for other faults."""
    victim_load: dict[str, float] | None = None
    """The victim's ``running``/``waiting`` requests from its engine's metrics."""
    requests_in_flight: list[str] = field(default_factory=list)
    """Requests open at the fault (sent before it, ended after it): their request ids."""
    matched_steps: list[dict[str, Any]] = field(default_factory=list)
    """Recovery steps in those requests' records attributed to this fault (:mod:`.attribution`)."""
    needs_step: bool = False
    """A fault that must be answered by a recovery step (kills and stalls of replicas)."""
    missed: bool = False
    """A replica fault that hit nothing: once the requests open at it had ended, none of their records showed
    a recovery step it calls for (on a loaded machine the engines' gauges and the client's view both lag, so
    a victim can be idle by the time it dies). The drill then fires the same kind again (``miss_retries``)."""
    in_flight_steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Every recovery step in the records of the requests open at the fault, with its time from the fault
    on the client's clock (``after_fault_s``): what an unmatched fault is judged against."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "t_mono"}


def kill_replica(rep: Replica, *, wait_s: float = 10.0) -> tuple[bool, str]:
    """SIGKILL the replica's engine processes and the replica; True once every pid is gone."""
    tree = (*_children(rep.pid), rep.pid)
    existed = [p for p in tree if not gone(p)]
    if rep.pid not in existed:
        return False, f"replica pid {rep.pid} was not running"
    signal_tree(tuple(existed), signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all(gone(p) for p in existed):
            return True, f"SIGKILL {existed}: all gone"
        time.sleep(0.05)
    alive = [p for p in existed if not gone(p)]
    return False, f"SIGKILL {existed}: still running {alive}"


def stop_replica(rep: Replica) -> tuple[bool, tuple[int, ...], str]:
    """SIGSTOP the replica's tree; True once the replica process reads as stopped."""
    tree = (*_children(rep.pid), rep.pid)
    reached = tuple(signal_tree(tree, signal.SIGSTOP))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if rep.pid in reached and stopped(rep.pid):
            return True, reached, f"SIGSTOP {list(reached)}: stopped"
        time.sleep(0.05)
    return False, reached, f"SIGSTOP {list(reached)}: not seen stopped"


def continue_replica(pids: tuple[int, ...]) -> str:
    reached = signal_tree(pids, signal.SIGCONT)
    return f"SIGCONT {reached}"


# -- the LMCache Redis tier ---------------------------------------------------------------------------

class RedisTier:
    """A dedicated redis-server for LMCache's remote tier, which the harness may take down and up."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: the LMCache Redis tier needs it")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--protected-mode", "no", "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self.up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start (see {self.log_path})")
            time.sleep(0.1)

    def up(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).ping())
        except (redis.RedisError, OSError):
            return False

    def down(self) -> tuple[bool, str]:
        """SIGKILL the server; True once it no longer answers."""
        if self.proc is None or self.proc.poll() is not None:
            return False, "the tier was not running"
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait(10)
        ok = not self.up()
        return ok, f"SIGKILL redis-server pid {pid}; " + ("refuses connections" if ok else "still answers")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
