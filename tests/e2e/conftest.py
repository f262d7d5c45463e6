"""Shared e2e fixtures: one tiny model and one loopback Ray cluster per test session.

The cluster runs Ray Serve's HTTP proxy on 127.0.0.1:$BATON_E2E_SERVE_PORT (default 8001; Baton's gateway
owns 8000) and exports Ray's Prometheus metrics (vLLM's engine metrics included) on a free port.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from baton.bench.otlp import Receiver, receiver
from baton.bench.procs import isolated_ray_env
from baton.dataplane.spec import DeploymentSpec
from baton.dataplane.tinymodel import build_tiny_model

REDIS_URL = os.environ.get("BATON_E2E_REDIS_URL", "redis://127.0.0.1:6379")
# Other Ray clusters (a `baton up`, another test session) may run on the same host: by default the
# Serve proxy takes a free port, and P/D deployments take NIXL side-channel ports from NIXL_PORT_BASE.
SERVE_PORT = int(os.environ.get("BATON_E2E_SERVE_PORT", "0"))
# The tests use NIXL_PORT_BASE + 0..510 (prefill) and + 2000..2510 (decode). The range stays clear of Ray's
# worker ports (10002-19999), the control plane's deployments (20000-24010, `control.spec.nixl_port_base`),
# the chaos stacks' (24000-29910) and Linux's ephemeral ports (from 32768): a listener there can find its
# port taken by any process's outgoing connection, and the replica then fails to start.
NIXL_PORT_BASE = int(os.environ.get("BATON_E2E_NIXL_PORT_BASE", str(30000 + os.getpid() % 3 * 100)))
DEPLOY_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


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


@pytest.fixture(scope="session")
def serve_cluster() -> Iterator[ServeCluster]:
    ray = pytest.importorskip("ray")
    from ray import serve

    metrics_port = _free_port()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Serve's HAProxy ingress and direct streaming, as on every Baton cluster (the Serve controller and
    # the replicas inherit the driver's environment).
    os.environ.update(isolated_ray_env())
    ray.init(
        address="local",  # always a cluster of our own, even when another head runs on this host
        num_cpus=8,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
        logging_level="WARNING",
        log_to_driver=False,
    )
    serve_port = SERVE_PORT or _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": serve_port})
    try:
        yield ServeCluster(
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics", serve_url=f"http://127.0.0.1:{serve_port}"
        )
    finally:
        serve.shutdown()
        ray.shutdown()


def completion(base_url: str, prompt: str | list[int], *, max_tokens: int = 16, **extra) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{base_url}/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def chat(base_url: str, content: str, *, max_tokens: int = 16, **extra) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


@pytest.fixture
def redis_client():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    return client


def kv_keys(client) -> set[bytes]:
    return set(client.scan_iter(match="*kv_bytes", count=1000))


def wait_new_keys(client, before: set[bytes], count: int, timeout_s: float = 60) -> set[bytes]:
    deadline = time.monotonic() + timeout_s
    while True:
        new = kv_keys(client) - before
        if len(new) >= count or time.monotonic() > deadline:
            return new
        time.sleep(0.5)


# -- spans from every process of the stack --------------------------------------------------------


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    with receiver() as got:
        yield got
