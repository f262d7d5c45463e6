"""``baton bench ratelimit``: rate-limit decisions per second on one Redis, from several processes.

Each process is what a gateway worker runs: one :class:`~baton.api.gateway.ratelimit.RateLimiter` (the
same Lua scripts, the same lean connection) deciding for a spread of tenants, each admitted request
released again as the gateway releases it (``finish``, off the request's path). Limits are set high, so
every decision takes the admitting path, the most work per call. The figure is decisions per second
summed over the processes and each decision's latency as its caller waited for it.

Target (docs/architecture.md): >= 20,000 decisions/s on one Redis, several gateway processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from baton.bench import report, stats

TARGET_PER_S = 20_000


@dataclass
class RatelimitConfig:
    processes: int = 2
    """Gateway-like processes deciding at once."""
    concurrency: int = 32
    """Decisions in flight per process."""
    duration_s: float = 10.0
    tenants: int = 200
    """Distinct tenants the decisions are spread over (each with a tenant and a key scope)."""
    redis_url: str = "redis://127.0.0.1:6379/0"


def _scopes(n: int) -> list[tuple[Any, ...]]:
    from baton.api.gateway.ratelimit import Limits, LimitScope

    high = Limits(requests_per_minute=10**9, tokens_per_minute=10**12, max_concurrency=10**6)
    out = []
    for _ in range(n):
        tenant, key = uuid.uuid4(), uuid.uuid4()
        out.append((LimitScope.tenant(tenant, high), LimitScope.key(tenant, key, high)))
    return out


async def _decide(cfg: RatelimitConfig, start_at: float) -> dict[str, Any]:
    import redis.asyncio as aioredis

    from baton.api.gateway.ratelimit import RateLimiter

    client: Any = aioredis.from_url(cfg.redis_url)  # redis-py 5's asyncio client (its stubs lag: aclose)
    limiter = RateLimiter(client, lease_s=30.0, fail_open=False)
    scopes = _scopes(cfg.tenants)
    latencies: list[float] = []
    denied = 0
    await asyncio.sleep(max(start_at - time.time(), 0))
    deadline = time.perf_counter() + cfg.duration_s

    async def loop(worker: int) -> None:
        nonlocal denied
        i = worker
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            decision = await limiter.admit(uuid.uuid4().hex, scopes[i % len(scopes)], 100)
            latencies.append(time.perf_counter() - t0)
            if decision.allowed:
                limiter.finish(decision.lease, 60)
            else:
                denied += 1
            i += cfg.concurrency

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(cfg.concurrency)))
    elapsed = time.perf_counter() - t0
    await limiter.stop()  # waits for the releases still in flight
    await client.aclose()
    return {"decisions": len(latencies), "denied": denied, "elapsed_s": elapsed, "latencies_s": latencies}


def _process(cfg: RatelimitConfig, start_at: float, out: Any) -> None:
    try:
        import uvloop

        result = uvloop.run(_decide(cfg, start_at))
    except ImportError:
        result = asyncio.run(_decide(cfg, start_at))
    out.put(result)


def run_ratelimit(cfg: RatelimitConfig, *, log: Any = print) -> dict[str, Any]:
    started = report.provenance()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 3.0  # every process connected and ready before the first decision
    procs = [ctx.Process(target=_process, args=(cfg, start_at, queue), daemon=True) for _ in range(cfg.processes)]
    log(f"{cfg.processes} processes x {cfg.concurrency} in flight for {cfg.duration_s:g} s on {cfg.redis_url}")
    for p in procs:
        p.start()
    results = [queue.get(timeout=cfg.duration_s + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    decisions = sum(r["decisions"] for r in results)
    wall = max(r["elapsed_s"] for r in results)
    latencies = [x for r in results for x in r["latencies_s"]]
    per_s = decisions / wall if wall > 0 else 0.0
    return {
        "benchmark": "ratelimit",
        "config": asdict(cfg),
        "method": "each process runs RateLimiter.admit (tenant and key scope, limits never reached) and "
                  "finish, as a gateway worker does; decisions/s = all admits / the longest process's time",
        "decisions": decisions,
        "denied": sum(r["denied"] for r in results),
        "decisions_per_s": per_s,
        "per_process_per_s": [r["decisions"] / r["elapsed_s"] for r in results],
        "latency_ms": stats.describe(latencies, (50, 90, 99), scale=1000.0),
        "target": {"decisions_per_s": TARGET_PER_S},
        "met": per_s >= TARGET_PER_S,
        "provenance": report.provenance(started),
    }
