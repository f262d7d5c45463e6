"""The decode server's measured phases reach the request record: the data plane posts its ``phases`` fact
to Redis (as `baton.dataplane.recovery` does, in the background), the usage meter's fact merger reads it
before the batch is written, and Postgres keeps the phases on the request's time axis, where the
console's waterfall draws them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from baton.api.console.queries import waterfall
from baton.api.gateway.fact_reader import FactMerger
from baton.api.gateway.metering import Outcome, UsageMeter
from baton.core import contracts as c
from baton.core import models as m
from baton.core.db import Database
from baton.core.settings import Settings


@contextlib.asynccontextmanager
async def _data_plane_facts(url: str) -> AsyncIterator[None]:
    """This process as a decode replica whose facts go to ``url`` (its writer's client closed after)."""
    from baton.dataplane import facts

    os.environ[c.ENV_FACTS_REDIS_URL] = url
    facts._client = None
    try:
        yield
    finally:
        del os.environ[c.ENV_FACTS_REDIS_URL]
        if facts._client is not None:
            await facts._client.aclose()
        facts._client = None


def _tenant(db: Database) -> uuid.UUID:
    with db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=f"ph-{uuid.uuid4().hex[:10]}", display_name="phases"))
        uow.commit()
        return t.id


def _outcome(tid: uuid.UUID) -> Outcome:
    now = time.perf_counter()
    return Outcome(request_id=uuid.uuid4(), tenant_id=tid, api_key_id=None, model="m", endpoint="chat/completions",
                   stream=True, started=time.time(), deployment=None, prompt_tokens=40, completion_tokens=4,
                   metered=True, start_pc=now, first_token=now + 0.060, end_pc=now + 0.100, gaps=[0.01] * 3)


async def _until_written(red: aioredis.Redis, key: str, field: str) -> None:
    for _ in range(200):  # spawned in the background on purpose: nothing on the token path waits for it
        if await red.hexists(key, field):
            return
        await asyncio.sleep(0.01)


def test_a_posted_phases_fact_is_merged_into_the_request_record(settings: Settings, db: Database) -> None:
    from baton.dataplane import facts

    tid = _tenant(db)
    measured, plain, garbled = _outcome(tid), _outcome(tid), _outcome(tid)
    fact = c.PhasesFact(measured.started + 0.004, (  # the decode server took the request up 4 ms in
        c.Phase(c.PHASE_REMOTE_PREFILL, 0.5, 40.0, attempt=1),
        c.Phase(c.PHASE_KV_HANDOFF, 41.0, 12.5),
    ))

    async def go() -> UsageMeter:
        red = aioredis.Redis.from_url(settings.redis.url)
        try:
            async with _data_plane_facts(settings.redis.url):
                # the decode server's request id is the upstream header's: req-<hex>
                facts.spawn_fact(f"req-{measured.request_id.hex}", fact)
                await facts.record_fact(f"req-{measured.request_id.hex}", c.HandoffFact(kv_bytes=4096, transfer_ms=9.0))
                await red.hset(c.fact_key(garbled.request_id.hex), c.FactField.PHASES.value, '{"phases": "x"')
                await _until_written(red, c.fact_key(measured.request_id.hex), c.FactField.PHASES.value)
            meter = UsageMeter(db, enrich=FactMerger(red))
            for o in (measured, plain, garbled):
                meter.record(o)
            assert await meter.flush()
            return meter
        finally:
            await red.aclose()

    meter = asyncio.run(go())
    assert meter.written == 3
    with db.system() as uow:
        rec = uow.requests.get(measured.request_id)
        assert rec is not None
        assert rec.phases == [
            {"phase": "remote_prefill", "start_ms": 4.5, "duration_ms": 40.0, "outcome": "ok", "attempt": 1},
            {"phase": "kv_handoff", "start_ms": 45.0, "duration_ms": 12.5, "outcome": "ok"},
        ]
        assert (rec.kv_bytes, rec.handoff_ms) == (4096, 9.0)  # the other facts of the hash still merged
        spans = waterfall(rec)
        assert [s["kind"] for s in spans] == ["dispatch", "prefill", "kv_handoff", "decode"]
        assert {s["source"] for s in spans} == {"spans"} and spans[1]["duration_ms"] == 40.0
        for other in (plain, garbled):  # no phases posted, or none readable: NULL, and the derived waterfall
            row = uow.requests.get(other.request_id)
            assert row is not None and row.phases is None
            assert {s["source"] for s in waterfall(row)} == {"record"}
        null = uow.session.execute(
            m.RequestRecord.__table__.select().where(m.RequestRecord.id == plain.request_id,
                                                     m.RequestRecord.phases.is_(None))).all()
        assert len(null) == 1  # SQL NULL, not a JSON null
