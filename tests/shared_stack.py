"""The test session's Baton stack, started once and shared (a pytest plugin of the root conftest).

One ``baton up``, as the README runs it, with a state folder, a database and free ports of its own: a
Ray head (every port free, so other heads of the session can run beside it), the tiny model in P/D mode
(one prefill and one decode replica, NIXL, LMCache with a ``redis-server`` of its own as the remote
tier), the tiny embedding model, the gateway, the console and a worker, with tracing to the session's
OTLP receiver. It starts in the background as soon as the session is collected, so it comes up while the
quick tests run; the first test that needs it waits for ``baton up`` to finish.

Who uses it:

- tests that only send traffic use its apps as they are (:func:`baton_stack`);
- tests that need an app of their own deploy it beside the stack's apps on the same Ray head
  (:func:`serve_cluster`, ``serve.run`` from this process: the stack's reconciler leaves such apps alone);
- tests that kill replicas work on an app of their own (:func:`fault_stack`), shared by the recovery and
  chaos modules, whose replacements Ray starts again;
- the last test of the session (marker ``last``) stops the stack with ``baton down``, checks that nothing
  is left, starts it again and stops it again. Without it, the session's end runs ``baton down``.

The tiny models are built once per session (:func:`shared_models`) and the stack's ``baton up`` finds
them in its state folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from baton.dataplane.spec import DeploymentSpec

ROOT = Path(__file__).resolve().parents[1]
UP_TIMEOUT_S = 1500
DEPLOY_TIMEOUT_S = 600
STACK_FIXTURE = "baton_stack"
STACK_REDIS_URL = "redis://127.0.0.1:6379/9"


def free_port() -> int:
    from baton.bench.procs import free_port as _free

    return _free()


def stack_pids(prefix: str) -> list[int]:
    """Processes whose environment has ``BATON_STACK=<prefix>...``: read from /proc here, not with the
    product's own lookup, so a check of "nothing left" cannot share a bug with what it checks."""
    needle = f"BATON_STACK={prefix}".encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if any(v.startswith(needle) for v in f.read().split(b"\0")):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _baton() -> str:
    return str(Path(sys.executable).with_name("baton"))


@dataclass
class BatonStack:
    """A ``baton up`` of the session's: where to reach each part, and how to stop and start it."""

    state: Path
    env: dict[str, str]
    db_name: str
    gateway_url: str
    dashboard_url: str
    ray_address: str
    serve_url: str
    metrics_url: str
    otlp_endpoint: str
    receiver: Any
    lmcache_tier: Any
    up_stdout: str = ""
    model: str = "tiny-llama"
    deployment: str = "tiny-llama-pd"
    embed_model: str = "tiny-embed"
    embed_deployment: str = "tiny-embed"
    stopped: bool = False  #: ``down`` ran once: the head and every app on it were stopped
    _proc: subprocess.Popen[str] | None = field(default=None, repr=False)
    _log: Path | None = None

    # -- what a client needs --------------------------------------------------------------------

    @property
    def api_key(self) -> str:
        """The demo tenant's key, as ``baton up`` wrote it."""
        return (self.state / "demo.key").read_text().strip()

    @property
    def admin_token(self) -> str:
        for line in (self.state / "baton.env").read_text().splitlines():
            if line.startswith("BATON_SECURITY__ADMIN_TOKEN="):
                return line.split("=", 1)[1].strip()
        raise AssertionError("baton.env holds no admin token")

    @property
    def model_dir(self) -> Path:
        return self.state / "models" / "tiny-llama"

    @property
    def prefill_app(self) -> str:
        from baton.dataplane.render import PREFILL_APP_SUFFIX

        return self.deployment + PREFILL_APP_SUFFIX

    def app_url(self, app: str) -> str:
        """The OpenAI base URL of one of the stack's Serve apps, past the gateway (Serve's HAProxy)."""
        return f"{self.serve_url}/{app}/v1"

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=f"{self.gateway_url}/admin/v1", timeout=60,
                            headers={"authorization": f"Bearer {self.admin_token}"})

    def marked(self) -> list[int]:
        """Processes of the stack's Ray head (their environment carries its mark)."""
        return stack_pids(str((self.state / "run").resolve()))

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, **env: str) -> None:
        """``baton up`` in the background (the same environment, with ``env`` over it)."""
        self._log = self.state.parent / f"up-{int(time.time())}.log"
        self._proc = subprocess.Popen([_baton(), "up", "--timeout", "900"], env={**self.env, **env},
                                      stdout=self._log.open("w"), stderr=subprocess.STDOUT, text=True,
                                      cwd=ROOT)

    def wait_up(self) -> str:
        """Waits for ``baton up``; its output. Fails the test with its output's end when it failed."""
        assert self._proc is not None and self._log is not None, "baton up was never started"
        try:
            rc = self._proc.wait(timeout=UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            rc = self._proc.wait()
        out = self._log.read_text()
        if rc != 0:
            pytest.fail(f"`baton up` of the shared stack failed ({rc}):\n{out[-4000:]}")
        self.up_stdout = out
        return out

    def down(self) -> subprocess.CompletedProcess[str]:
        """``baton down``. This process leaves the head first when it is its driver: a driver whose head
        went away ends its own process once Ray gives up reconnecting (and pytest with it). The apps of
        the session's own (:func:`fault_stack`) go with the head."""
        self.stopped = True
        hook = sys.modules.get("ray._private.auto_init_hook")
        if hook is not None:
            # no Ray call after this connects again: a background thread (Serve's client, most likely) did, 8 s
            # after the shutdown below, and Ray aborted pytest when that head went away
            hook.enable_auto_connect = False
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        if self._proc is not None and self._proc.poll() is None:  # still coming up: stop it first
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGTERM)
            self._proc.wait(timeout=60)
        return subprocess.run([_baton(), "down"], env=self.env, capture_output=True, text=True, timeout=300,
                              cwd=ROOT)


class _Session:
    """What the plugin started for the session (closed at its end)."""

    def __init__(self) -> None:
        self.stack: BatonStack | None = None
        self.exits = contextlib.ExitStack()
        self.models: Path | None = None


_session = _Session()


def _build_models(root: Path) -> Path:
    """The tiny causal LM and embedding model, built once per session (seed 0, as ``baton up`` builds)."""
    from baton.dataplane.tinymodel import build_tiny_model

    build_tiny_model(root / "tiny-llama", seed=0)
    build_tiny_model(root / "tiny-embed", seed=0, kind="embed")
    return root


def shared_models() -> Path:
    if _session.models is None:
        root = Path(tempfile.mkdtemp(prefix="baton-test-models-"))
        _session.exits.callback(lambda: subprocess.run(["rm", "-rf", str(root)], check=False))
        _session.models = _build_models(root)
    return _session.models


def _start_stack() -> BatonStack:
    from sqlalchemy.engine import make_url

    from baton.bench.chaos.faults import RedisTier
    from baton.bench.otlp_receiver import receiver
    from baton.bench.procs import isolated_ray_env
    from tests.conftest import PG_SERVER

    base = Path(tempfile.mkdtemp(prefix="baton-test-stack-"))
    state = base / "state"
    (state / "models").mkdir(parents=True)
    models = shared_models()
    for name in ("tiny-llama", "tiny-embed"):
        (state / "models" / name).symlink_to(models / name)
    endpoint, rec = _session.exits.enter_context(receiver())
    tier = RedisTier(free_port(), base / "lmcache-redis.log")
    tier.start()
    _session.exits.callback(tier.stop)
    db_name = f"baton_test_stack_{os.getpid()}"
    gateway, dashboard, gcs, serve, metrics = (free_port() for _ in range(5))
    env = {
        # not the Ray settings of another head of this session: the stack's head gets its own below
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_SERVE_", "RAY_process_group", "BATON_"))},
        **isolated_ray_env(),
        "RAY_metrics_report_interval_ms": "1000",  # the engines' metrics within a second (Ray's default: 10 s)
        "BATON_STATE_DIR": str(state),
        "BATON_DB__URL": make_url(f"{PG_SERVER}/{db_name}").render_as_string(hide_password=False),
        "BATON_GATEWAY__PORT": str(gateway),
        "BATON_RAY__ADDRESS": f"127.0.0.1:{gcs}",
        "BATON_RAY__DASHBOARD_URL": f"http://127.0.0.1:{dashboard}",
        "BATON_RAY__SERVE_HTTP_PORT": str(serve),
        "BATON_RAY__METRICS_EXPORT_PORT": str(metrics),
        "BATON_REDIS__LMCACHE_URL": tier.url,
        # Celery's broker and the gateway's counters in a Redis database of the stack's own: its worker
        # must never take the reconcile tasks of the quick and browser tests (their queue is on db 0)
        "BATON_REDIS__URL": STACK_REDIS_URL,
        "BATON_TELEMETRY__ENABLED": "true",
        "BATON_TELEMETRY__OTLP_ENDPOINT": endpoint,
    }
    stack = BatonStack(state=state, env=env, db_name=db_name, gateway_url=f"http://127.0.0.1:{gateway}",
                       dashboard_url=f"http://127.0.0.1:{dashboard}", ray_address=f"127.0.0.1:{gcs}",
                       serve_url=f"http://127.0.0.1:{serve}", metrics_url=f"http://127.0.0.1:{metrics}/metrics",
                       otlp_endpoint=endpoint, receiver=rec, lmcache_tier=tier)
    stack.start()

    def close() -> None:
        from tests.conftest import drop_database

        stack.down()
        drop_database(db_name)
        subprocess.run(["rm", "-rf", str(base)], check=False)

    _session.exits.callback(close)
    return stack


@dataclass
class Metric:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class ServeCluster:
    metrics_url: str
    serve_url: str

    def deploy(self, spec: DeploymentSpec) -> str:
        """Deploy the spec as its own Serve app; return the app's OpenAI base URL."""
        from ray import serve

        from baton.dataplane.app import serve_run

        route = f"/{spec.name}"
        serve_run(spec, route_prefix=route)
        deadline = time.monotonic() + DEPLOY_TIMEOUT_S
        while True:
            app = serve.status().applications.get(spec.name)
            if app is not None and app.status == "RUNNING":
                return f"{self.serve_url}{route}/v1"
            if app is not None and app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"deploying {spec.name} failed: {app.message}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{spec.name} not running: {app}")
            time.sleep(2)

    def delete(self, name: str) -> None:
        from ray import serve

        from baton.dataplane.render import PREFILL_APP_SUFFIX

        serve.delete(name, _blocking=True)
        if name + PREFILL_APP_SUFFIX in serve.status().applications:  # a P/D deployment's prefill pool
            serve.delete(name + PREFILL_APP_SUFFIX, _blocking=True)

    def replica_ids(self, app: str, deployment: str) -> set[str]:
        """Ray Serve replica ids of a deployment (they label the engine metrics)."""
        import ray

        prefix = f"SERVE_REPLICA::{app}#{deployment}#"
        return {
            a["name"][len(prefix) :]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)
        }

    def metrics(self) -> list[Metric]:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.metrics_url, timeout=30).text
        return [
            Metric(sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def metric_sum(self, name: str, **labels: str | set[str]) -> float:
        total = 0.0
        for m in self.metrics():
            if m.name != name:
                continue
            if all((m.labels.get(k) in v) if isinstance(v, set) else m.labels.get(k) == v for k, v in labels.items()):
                total += m.value
        return total

    def settled(self, name: str, *, quiet_s: float = 4, timeout_s: float = 90, **labels: str | set[str]) -> float:
        """The metric's value once it stopped changing for quiet_s (Ray exports with a lag)."""
        deadline = time.monotonic() + timeout_s
        value = self.metric_sum(name, **labels)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            again = self.metric_sum(name, **labels)
            if again == value:
                break
            value = again
        return value

    def wait_metric(self, name: str, predicate, timeout_s: float = 60, **labels: str | set[str]) -> float:
        """Poll until predicate(value) holds (Ray exports metrics every second)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.metric_sum(name, **labels)
            if predicate(value) or time.monotonic() > deadline:
                return value
            time.sleep(1)


# -- hooks ---------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # Ray's token auth for every head the session starts and for this process as their driver (an
    # explicit address never turns it on by itself). With it set, ``ray start`` wants a token that is
    # already there: on a new machine the session writes one where Ray looks (what ``ray.init`` does).
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"
        _ensure_ray_token()


def _ensure_ray_token() -> None:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.exists() and path.read_text().strip():
        return
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the stack at once when a collected test needs it: it comes up while the quick tests run."""
    if session.config.option.collectonly:
        return
    if any(STACK_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        _session.stack = _start_stack()


def pytest_unconfigure(config: pytest.Config) -> None:
    _session.exits.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test on the shared stack carries what the stack looked like (its Serve apps, the machine's
    memory, the kills Ray's memory monitor made): what CI's output keeps of a run whose logs are gone."""
    report = yield
    stack = _session.stack
    if report.failed and call.when in ("setup", "call") and stack is not None and STACK_FIXTURE in getattr(
            item, "fixturenames", ()):
        try:
            report.sections.append(("shared stack at the failure", stack_state(stack)))
        except Exception as exc:  # a report is never worth a crash
            report.sections.append(("shared stack at the failure", f"unreadable: {exc!r}"))
    return report


def stack_state(stack: BatonStack) -> str:
    """Serve's applications on the stack's head, the memory left, and Ray's out-of-memory kills."""
    from baton.control.ray_client import RayServeClient, read_token

    lines: list[str] = []
    client = RayServeClient(stack.dashboard_url, token=read_token(Path.home() / ".ray" / "auth_token"), timeout_s=10)
    try:
        for name, app in sorted(client.status().apps.items()):
            lines.append(f"app {name}: {app.status} {app.deployments} {app.message[:300]}")
    except Exception as exc:
        lines.append(f"Serve's status unreadable: {exc!r}")
    finally:
        client.close()
    mem = {k: v for k, v in (line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
           if k in ("MemTotal", "MemAvailable")}
    lines.append("memory: " + ", ".join(f"{k} {v.strip()}" for k, v in mem.items()))
    raylet = Path("/tmp/ray/session_latest/logs/raylet.out")
    if raylet.exists():
        kills = [line for line in raylet.read_text(errors="replace").splitlines()
                 if "memory" in line.lower() and ("kill" in line.lower() or "oom" in line.lower())]
        lines += ["Ray's memory kills (raylet.out):", *kills[-10:]] if kills else ["no memory kill in raylet.out"]
    return "\n".join(lines)


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def baton_stack() -> BatonStack:
    """The session's ``baton up`` (see the module doc), once it is up."""
    stack = _session.stack
    if stack is None:  # collected after the session started (a plugin ran the tests itself)
        stack = _session.stack = _start_stack()
    if not stack.up_stdout:
        stack.wait_up()
    return stack


@pytest.fixture(scope="session")
def serve_cluster(baton_stack: BatonStack) -> Iterator[ServeCluster]:
    """The stack's Ray head, with this process as a driver: apps of a test's own go beside the stack's
    (``ServeCluster.deploy``: ``serve.run``, which the stack's reconciler leaves alone)."""
    ray = pytest.importorskip("ray")

    ray.init(address=baton_stack.ray_address, logging_level="WARNING", log_to_driver=False)
    try:
        yield ServeCluster(metrics_url=baton_stack.metrics_url, serve_url=baton_stack.serve_url)
    finally:
        ray.shutdown()


#: NIXL side-channel ports of the fault stack's app: + 0..510 (prefill) and + 2000..2510 (decode), in the
#: chaos stacks' range (24000-29910), clear of the e2e apps' (tests/e2e/conftest.py: NIXL_PORT_BASE).
FAULT_NIXL_PORT_BASE = 26000


@pytest.fixture(scope="session")
def fault_stack(baton_stack: BatonStack, serve_cluster: ServeCluster, tiny_model: Path, settings: Any, db: Any,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A P/D deployment that tests kill replicas of, beside the stack's apps on its Ray head: the chaos
    drills' topology (one prefill and one decode replica, 512-token engine steps so that a long prompt is
    prefilled in several, LMCache with a ``redis-server`` of its own that a test may take down), behind a
    gateway process of its own on the session's database, with the prefill pool as its fallback. Shared by
    ``tests/e2e/test_recovery.py`` and ``tests/chaos/``: a test that kills a replica waits for Ray's
    replacement (or the drill's own checks do) before the next one starts. Yields the drills'
    :class:`baton.bench.chaos.stack.Endpoint`."""
    from baton.bench.chaos.faults import RedisTier
    from baton.bench.chaos.stack import Endpoint, StackConfig, add_tenant, deployment_spec, start_gateway

    logs = tmp_path_factory.mktemp("fault-stack")
    cfg = StackConfig(state_dir=logs, model_dir=tiny_model, model_name="tiny-faults", app="faults", prefill=1,
                      decode=1, max_num_batched_tokens=512)
    tier = RedisTier(free_port(), logs / "redis-tier.log")
    tier.start()
    gateway = None
    try:
        spec = deployment_spec(cfg, tiny_model, tier.url, FAULT_NIXL_PORT_BASE, settings.redis.url)
        url = serve_cluster.deploy(spec)
        fallback = url.removesuffix(f"/{cfg.app}/v1") + f"/{cfg.app}.prefill/v1"
        tenant_id, key = add_tenant(db, settings, {cfg.model_name: tiny_model}, max_model_len=cfg.max_model_len,
                                    prefix="faults")
        gateway, gateway_url = start_gateway(settings, {cfg.model_name: url}, logs,
                                             env={"BATON_REDIS__LMCACHE_URL": tier.url},
                                             fallbacks={cfg.model_name: fallback})
        yield Endpoint(gateway_url=gateway_url, api_key=key, model=cfg.model_name, app=cfg.app,
                       dashboard_url=baton_stack.dashboard_url, tenant_id=tenant_id, redis_tier=tier, db=db,
                       pools={"prefill": cfg.prefill, "decode": cfg.decode}, metrics_url=baton_stack.metrics_url)
    finally:
        if gateway is not None:
            gateway.stop()
        if not baton_stack.stopped:  # else the app went with the head
            with contextlib.suppress(Exception):  # not deployed
                serve_cluster.delete(cfg.app)
        tier.stop()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny causal LM of this session (the one the stack serves)."""
    return shared_models() / "tiny-llama"


@pytest.fixture(scope="session")
def tiny_embed_model() -> Path:
    return shared_models() / "tiny-embed"


@pytest.fixture(scope="session")
def otlp_receiver(baton_stack: BatonStack) -> tuple[str, Any]:
    """The OTLP/HTTP receiver every process of the stack sends its spans to: ``(endpoint, receiver)``."""
    return baton_stack.otlp_endpoint, baton_stack.receiver
