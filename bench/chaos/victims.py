"""Choosing a replica fault's victim from the engines' own metrics: a replica serving a request now.

Killing a replica that merely exists proves nothing: an idle one dies without touching a request, and
the drill passes by luck. So the injector hits a replica whose engine reports work at that moment.

- Source: vLLM's ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` gauges, which Ray's
  metrics agent exports as ``ray_vllm_num_requests_running`` / ``ray_vllm_num_requests_waiting`` with a
  ``ReplicaId`` label (Serve's replica id, :attr:`~.faults.Replica.replica_id`). An
  :class:`EngineLoadSource` reads them; :class:`RayMetricsAgent` is the real one (the agent's URL given,
  or found from the dashboard's node table), tests pass a fake.
- Busy: a decode replica with a request running; a prefill replica with one running or waiting (a
  prefill in progress or queued).
- :func:`wait_for_busy_victim` polls (bounded) until a replica of the pool with an engine process is
  busy and picks among those; when none is busy in time it picks as before and says ``busy=False``; when
  the metrics cannot be read at all, ``busy="unknown"``. The drill's invariant ``victims_were_busy``
  holds only for ``True``.

What the gauges can see: vLLM sets them after each engine step and Ray exports them every
``metrics_report_interval_ms`` (the chaos head sets 1 s; Ray's default is 10 s). A prefill that fits in
one step is finished by the time it could be seen; a prompt longer than the step's token budget
(chunked prefill) or a queue of prompts is seen (the drill's ``long_prompt_words``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from baton.bench.chaos.faults import Pool, Replica

RUNNING = "ray_vllm_num_requests_running"
WAITING = "ray_vllm_num_requests_waiting"


@dataclass(frozen=True)
class EngineLoad:
    running: float = 0.0
    waiting: float = 0.0

    def busy(self, pool: Pool) -> bool:
        return self.running > 0 or (pool == "prefill" and self.waiting > 0)


class EngineLoadSource(Protocol):
    def loads(self) -> dict[str, EngineLoad] | None:
        """Each engine's requests now, by Serve replica id; None when the metrics cannot be read."""


def parse_engine_loads(text: str) -> dict[str, EngineLoad]:
    """The running/waiting gauges of a Prometheus text page, summed per ``ReplicaId``."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = [ln for ln in text.splitlines() if ln.startswith((RUNNING + "{", WAITING + "{"))]
    running: dict[str, float] = {}
    waiting: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            rid = sample.labels.get("ReplicaId")
            if not rid:
                continue
            into = running if sample.name == RUNNING else waiting if sample.name == WAITING else None
            if into is not None:
                into[rid] = into.get(rid, 0.0) + float(sample.value)
    return {rid: EngineLoad(running.get(rid, 0.0), waiting.get(rid, 0.0)) for rid in {*running, *waiting}}


def metrics_urls_from_nodes(payload: Any) -> list[str]:
    """Ray metrics agents' URLs from the dashboard's ``/nodes?view=summary`` answer (each live node's
    ``raylet`` has ``nodeManagerAddress`` and ``metricsExportPort``)."""
    urls = []
    nodes = ((payload or {}).get("data") or {}).get("summary") or []
    for node in nodes:
        raylet = node.get("raylet") if isinstance(node, dict) else None
        if not isinstance(raylet, dict) or raylet.get("state", "ALIVE") != "ALIVE":
            continue
        host, port = raylet.get("nodeManagerAddress"), raylet.get("metricsExportPort")
        if host and isinstance(port, int) and port > 0:
            urls.append(f"http://{host}:{port}/metrics")
    return urls


class RayMetricsAgent:
    """Reads the engines' gauges from Ray's metrics agents: the URLs given, else those the dashboard lists."""

    def __init__(self, metrics_urls: Sequence[str] = (), dashboard_url: str | None = None, *,
                 token: str | None = None, timeout_s: float = 5.0) -> None:
        self._urls = list(metrics_urls)
        self.dashboard_url = dashboard_url
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s

    def urls(self) -> list[str]:
        if not self._urls and self.dashboard_url:
            import httpx

            r = httpx.get(self.dashboard_url.rstrip("/") + "/nodes", params={"view": "summary"},
                          headers=self._headers, timeout=self.timeout_s, trust_env=False)
            r.raise_for_status()
            self._urls = metrics_urls_from_nodes(r.json())
        return self._urls

    def loads(self) -> dict[str, EngineLoad] | None:
        import httpx

        try:
            urls = self.urls()
            if not urls:
                return None
            out: dict[str, EngineLoad] = {}
            for url in urls:
                page = httpx.get(url, timeout=self.timeout_s, trust_env=False)
                page.raise_for_status()
                out.update(parse_engine_loads(page.text))
            return out
        except (httpx.HTTPError, OSError, ValueError):
            return None


@dataclass
class VictimChoice:
    replica: Replica
    busy: bool | Literal["unknown"]
    load: EngineLoad | None
    evidence: str


def choose_victim(pool: Pool, reps: Sequence[Replica], loads: dict[str, EngineLoad] | None,
                  rng: random.Random) -> VictimChoice | None:
    """A busy replica with an engine process, at random; None when the metrics show none busy (or no replica).
    With no readable metrics, or no replica whose id is known, any serving replica with ``busy="unknown"``."""
    serving = [r for r in reps if r.children] or list(reps)  # an engine runs under it: not a replacement starting
    if not serving:
        return None
    known = [r for r in serving if r.replica_id]
    if loads is None or not known:
        why = "engine metrics unreachable" if loads is None else "replica ids unknown"
        return VictimChoice(rng.choice(serving), "unknown", None, f"victim_busy: unknown ({why})")
    busy = [r for r in known if r.replica_id in loads and loads[r.replica_id].busy(pool)]
    if not busy:
        return None
    rep = rng.choice(busy)
    load = loads[rep.replica_id]
    return VictimChoice(rep, True, load, f"running requests on victim: {load.running:g} from metrics "
                                         f"(waiting {load.waiting:g}; replica {rep.replica_id})")


async def wait_for_busy_victim(pool: Pool, list_replicas: Callable[[], Awaitable[list[Replica]]],
                               source: EngineLoadSource, rng: random.Random, *, timeout_s: float = 30.0,
                               poll_s: float = 0.25, unreadable_grace_s: float = 5.0,
                               accept: Callable[[], bool] | None = None) -> VictimChoice | None:
    """Polls until :func:`choose_victim` finds a busy replica (while ``accept()`` holds, when given). After
    ``timeout_s`` without one: a serving replica as before with ``busy=False``. Metrics never readable (for
    ``unreadable_grace_s``) or replica ids unknown: a serving replica with ``busy="unknown"``. None: no
    replica at all."""
    start = time.monotonic()
    ever_read = False
    reps: list[Replica] = []
    while True:
        reps = await list_replicas()
        loads = await asyncio.to_thread(source.loads)
        ever_read = ever_read or loads is not None
        choice = choose_victim(pool, reps, loads, rng)
        elapsed = time.monotonic() - start
        if choice is not None and choice.busy is True and (accept is None or accept()):
            return choice
        if choice is not None and choice.busy == "unknown" and (
                loads is not None or (not ever_read and elapsed >= min(unreadable_grace_s, timeout_s))):
            return choice  # the ids cannot be matched, or the metrics never answered
        if elapsed >= timeout_s:
            break
        await asyncio.sleep(poll_s)
    serving = [r for r in reps if r.children] or reps
    if not serving:
        return None
    if not ever_read:
        return VictimChoice(rng.choice(serving), "unknown", None, "victim_busy: unknown (engine metrics unreachable)")
    what = "running" if pool == "decode" else "running or waiting"
    cond = " when wanted" if accept is not None else ""
    return VictimChoice(rng.choice(serving), False, None,
                        f"no {pool} replica reported a request {what}{cond} within {timeout_s:g} s (engine metrics)")
