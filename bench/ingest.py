"""``baton bench ingest``: usage and request records per second into Postgres, with an outage in the middle.

The gateway's own :class:`~baton.api.gateway.metering.UsageMeter` (batched writes off the request path,
retried with backoff, connected as the gateway is: the service role, under row-level security) is fed
completed-request outcomes as fast as it accepts them. Halfway through, the database goes away for
``outage_s`` (a TCP relay between the meter and Postgres, in a process of its own so that relaying costs
the meter no CPU, drops every connection and refuses new ones, :class:`~baton.bench.tcprelay.TcpRelay`);
the meter keeps what it is given while its buffer has room. At the end every outcome must be in Postgres
exactly once: one request record each, one usage record for each metered one. A full buffer is
back-pressure (the gateway answers 503 to new requests then), counted here as time waited, never as a
record dropped.

Targets (docs/architecture.md): >= 20,000 records/s, batched; 0 lost across a Postgres outage.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from baton.bench import report
from baton.bench.arms import DEFAULT_DB_URL, migrate

TARGET_PER_S = 20_000


@dataclass
class IngestConfig:
    records: int = 100_000
    """Outcomes fed to the meter (each is a request record and a usage record)."""
    outage_s: float = 5.0
    """How long Postgres is away, starting when half the outcomes have been fed (0: no outage)."""
    batch_size: int = 1000
    flush_interval_s: float = 0.2
    max_buffer: int = 100_000
    db_url: str = DEFAULT_DB_URL


def _outcome(tenant_id: uuid.UUID) -> Any:
    from baton.api.gateway.metering import Outcome

    now = time.perf_counter()
    return Outcome(request_id=uuid.uuid4(), tenant_id=tenant_id, api_key_id=None, model="bench-ingest",
                   endpoint="chat/completions", stream=True, started=time.time(), prompt_tokens=128,
                   completion_tokens=32, metered=True, start_pc=now, end_pc=now + 0.2, first_token=now + 0.02,
                   gaps=[0.005] * 31)


async def _feed(cfg: IngestConfig, db: Any, *, relay: Any, tenant_id: uuid.UUID, log: Any,
                advance: Any) -> dict[str, Any]:
    from baton.api.gateway.metering import UsageMeter

    meter = UsageMeter(db, batch_size=cfg.batch_size, flush_interval=cfg.flush_interval_s, max_buffer=cfg.max_buffer,
                       max_backoff=1.0)
    await meter.start()
    waited_s = 0.0
    outage: dict[str, float] = {}
    t0 = time.perf_counter()
    for i in range(cfg.records):
        if i == cfg.records // 2 and cfg.outage_s > 0:
            log(f"Postgres away for {cfg.outage_s:g} s (after {i} outcomes)")
            relay.cut()
            outage["start_s"] = time.perf_counter() - t0
            asyncio.get_running_loop().call_later(cfg.outage_s, relay.restore)
        while not meter.accepting:  # back-pressure: the gateway would answer 503 meanwhile
            w = time.perf_counter()
            await asyncio.sleep(0.005)
            waited_s += time.perf_counter() - w
        meter.record(_outcome(tenant_id))
        if i % 1000 == 999:
            await asyncio.sleep(0)  # let the meter's loop run, as a serving event loop would
            if advance:
                advance(1000)
    fed_s = time.perf_counter() - t0
    while meter.pending:  # noqa: ASYNC110 - the meter has no "drained" event; polling adds <= 10 ms to the figure
        await asyncio.sleep(0.01)
    done_s = time.perf_counter() - t0
    failures = meter.failures
    await meter.stop(drain_s=30)
    return {"fed_s": fed_s, "done_s": done_s, "waited_s": waited_s, "failed_flushes": failures,
            "written": meter.written, "outage": outage}


def run_ingest(cfg: IngestConfig, *, log: Any = print, progress: Any = None) -> dict[str, Any]:
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from baton.bench.tcprelay import RelayProcess
    from baton.core import models as m
    from baton.core.db import Database, make_engine
    from baton.core.settings import load_settings

    started = report.provenance()
    migrate(cfg.db_url)
    settings = load_settings(db={"url": cfg.db_url})
    owner = Database.for_owner(settings)
    url = make_url(settings.db.service_url())  # the gateway's role: row-level security applies
    relay = RelayProcess((url.host or "127.0.0.1", url.port or 5432))
    relayed = Database(make_engine(url.set(port=relay.port).render_as_string(hide_password=False),
                                   pool_size=settings.db.pool_size, statement_timeout_ms=5000))
    try:
        with owner.system() as uow:
            tenant = uow.tenants.add(m.Tenant(name=f"ingest-{uuid.uuid4().hex[:8]}", display_name="baton bench"))
            uow.commit()
            tenant_id = tenant.id
        log(f"feeding {cfg.records} outcomes to the usage meter (batches of {cfg.batch_size})")
        advance = progress("outcomes", cfg.records) if progress else None
        fed = asyncio.run(_feed(cfg, relayed, relay=relay, tenant_id=tenant_id, log=log, advance=advance))
        with owner.engine.connect() as conn:
            usage = conn.execute(text("SELECT count(*) FROM usage_records WHERE tenant_id = :t"),
                                 {"t": tenant_id}).scalar_one()
            records = conn.execute(text("SELECT count(*) FROM request_records WHERE tenant_id = :t"),
                                   {"t": tenant_id}).scalar_one()
            conn.execute(text("DELETE FROM usage_records WHERE tenant_id = :t"), {"t": tenant_id})
            conn.execute(text("DELETE FROM request_records WHERE tenant_id = :t"), {"t": tenant_id})
            conn.commit()
    finally:
        relayed.dispose()
        owner.dispose()
        relay.close()
    outage_s = cfg.outage_s if cfg.outage_s > 0 else 0.0
    busy_s = max(fed["done_s"] - outage_s, 1e-9)
    per_s = cfg.records / busy_s
    lost = (cfg.records - usage) + (cfg.records - records)
    return {
        "benchmark": "ingest",
        "config": asdict(cfg),
        "method": "UsageMeter fed Outcome objects in one event loop, writing as the service role through a TCP "
                  "relay (its own process) to Postgres; "
                  "records/s = outcomes / (time until all were written - the outage); each outcome is one "
                  "request record and one usage record",
        "records_per_s": per_s,
        "overall_per_s": cfg.records / max(fed["done_s"], 1e-9),
        "usage_rows": usage,
        "request_rows": records,
        "lost": lost,
        "duplicated": max(usage - cfg.records, 0) + max(records - cfg.records, 0),
        **fed,
        "outage_seen": cfg.outage_s <= 0 or fed["failed_flushes"] > 0,
        "target": {"records_per_s": TARGET_PER_S, "lost": 0},
        "met": per_s >= TARGET_PER_S and lost == 0 and (cfg.outage_s <= 0 or fed["failed_flushes"] > 0),
        "provenance": report.provenance(started),
    }
