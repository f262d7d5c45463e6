"""``baton bench revoke``: how long until every gateway process refuses a revoked key.

Several real gateway processes (``create_app_from_env`` under uvicorn, as in ``baton bench gateway``) share
one Postgres database and one Redis. For each revocation a fresh key is issued by the control plane's
:class:`~baton.control.keys.KeyService`, used once on every process (so each holds it in its key cache,
which would keep it for ``gateway.key_cache_ttl_s``), then revoked through the same service; every process
is polled until it answers 401. The figure per revocation is from the start of ``revoke`` (the database
write included) until the last process refused the key.

Target (docs/architecture.md): < 1 s at p99 over 100 revocations, seen by every gateway process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any

from baton.bench import report, stats
from baton.bench.arms import DEFAULT_DB_URL, gateway_env, migrate, provision_tenant, start_gateway

TARGET_P99_MS = 1000.0
MODEL = "bench-revoke"


@dataclass
class RevokeConfig:
    gateways: int = 2
    revocations: int = 100
    db_url: str = DEFAULT_DB_URL
    poll_ms: float = 2.0
    """How often each process is asked while the key still works."""
    give_up_s: float = 30.0
    """A process still accepting the key after this long is a failed revocation (the key cache's lifetime)."""


async def _until_refused(urls: list[str], key: str, poll_s: float, give_up_s: float) -> list[float | None]:
    """Seconds from now until each URL answers 401 for ``key`` (None: not within ``give_up_s``)."""
    import httpx

    t0 = time.perf_counter()
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=5) as http:

        async def one(url: str) -> float | None:
            while time.perf_counter() - t0 < give_up_s:
                if (await http.get(f"{url}/models", headers=headers)).status_code == 401:
                    return time.perf_counter() - t0
                await asyncio.sleep(poll_s)
            return None

        return list(await asyncio.gather(*(one(u) for u in urls)))


def run_revoke(cfg: RevokeConfig, *, log: Any = print, progress: Any = None) -> dict[str, Any]:
    import httpx

    from baton.control.keys import KeyService, RedisKeyEvents
    from baton.core.db import Database
    from baton.core.settings import load_settings

    started = report.provenance()
    migrate(cfg.db_url)
    tenant = provision_tenant(cfg.db_url, model=MODEL, model_source="/nonexistent/model")
    env = gateway_env(tenant, upstreams={MODEL: "http://127.0.0.1:9/v1"}, tracing=False, otlp_endpoint=None)
    settings = load_settings(db={"url": cfg.db_url}, security={"key_secret": tenant.key_secret})
    db = Database.for_owner(settings)
    samples: list[float] = []
    per_gateway: list[list[float]] = [[] for _ in range(cfg.gateways)]
    missed = 0
    with contextlib.ExitStack() as stack:
        stack.callback(db.dispose)
        urls = []
        for i in range(cfg.gateways):
            proc, url = start_gateway(f"gateway-{i}", env)
            stack.callback(proc.stop)
            urls.append(url)
        log(f"{cfg.gateways} gateway processes up; {cfg.revocations} revocations")
        keys = KeyService(db, settings, events=RedisKeyEvents.from_settings(settings))
        advance = progress("revocations", cfg.revocations) if progress else None
        with httpx.Client(timeout=10) as http:
            for i in range(cfg.revocations):
                issued = keys.issue(tenant_id=tenant.tenant_id, name=f"revoke-{i}", created_by="baton-bench")
                for url in urls:  # every process caches the key
                    r = http.get(f"{url}/models", headers={"authorization": f"Bearer {issued.secret}"})
                    if r.status_code != 200:
                        raise RuntimeError(f"{url} refused a fresh key: {r.status_code} {r.text[:200]}")
                t0 = time.perf_counter()
                keys.revoke(tenant_id=tenant.tenant_id, key_id=issued.key.id, actor="baton-bench")
                revoke_s = time.perf_counter() - t0
                seen = asyncio.run(_until_refused(urls, issued.secret, cfg.poll_ms / 1000, cfg.give_up_s))
                if any(s is None for s in seen):
                    missed += 1
                else:
                    samples.append(revoke_s + max(s for s in seen if s is not None))
                    for g, s in enumerate(seen):
                        per_gateway[g].append(revoke_s + (s or 0.0))
                if advance:
                    advance(None)
    p99 = stats.percentile([s * 1000 for s in samples], 99) if samples else float("nan")
    return {
        "benchmark": "revoke",
        "config": asdict(cfg),
        "method": "KeyService.revoke (database write and Redis event) on a key every gateway process has "
                  "cached; each process polled every poll_ms until 401; the figure is until the last one",
        "seen_by_all_ms": stats.describe([s * 1000 for s in samples], (50, 99)),
        "per_gateway_ms": [stats.describe([s * 1000 for s in g], (50, 99)) for g in per_gateway],
        "missed": missed,
        "target": {"p99_ms": TARGET_P99_MS},
        "met": missed == 0 and p99 < TARGET_P99_MS,
        "provenance": report.provenance(started),
    }
