"""UsageMeter against real Postgres: batched, idempotent, and nothing lost while Postgres is away.

The outage is real: the meter talks to Postgres through a TCP relay that the test cuts and restores.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy.engine import make_url

from baton.api.gateway.metering import Outcome, UsageMeter, write_outcomes
from baton.bench.tcprelay import TcpRelay
from baton.core import models as m
from baton.core.db import Database, make_engine
from baton.core.settings import Settings


@pytest.fixture()
def relayed_db(settings: Settings) -> Iterator[tuple[Database, TcpRelay]]:
    url = make_url(settings.db.service_url())
    relay = TcpRelay((url.host or "127.0.0.1", url.port or 5432))
    database = Database(make_engine(url.set(port=relay.port).render_as_string(hide_password=False),
                                    pool_size=2, statement_timeout_ms=2000))
    yield database, relay
    database.dispose()
    relay.close()


def _tenant(db: Database) -> uuid.UUID:
    with db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=f"u-{uuid.uuid4().hex[:10]}", display_name="u"))
        uow.commit()
        return t.id


def _outcome(tid: uuid.UUID, **kw: object) -> Outcome:
    now = time.perf_counter()
    o = Outcome(request_id=uuid.uuid4(), tenant_id=tid, api_key_id=None, model="m", endpoint="chat/completions",
                stream=True, started=time.time(), prompt_tokens=5, completion_tokens=3, metered=True,
                start_pc=now, end_pc=now + 0.05, first_token=now + 0.01, gaps=[0.01, 0.01, 0.02])
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def _count(db: Database, tid: uuid.UUID) -> tuple[int, int]:
    with db.system() as uow:
        usage = len(uow.session.scalars(uow.usage.query(tenant_id=tid)).all())
        records = len(uow.session.scalars(uow.requests.query(tenant_id=tid)).all())
    return usage, records


def test_outcomes_become_one_usage_row_and_one_request_record_each(db: Database, insert_path: str) -> None:
    tid = _tenant(db)
    done = _outcome(tid)
    failed = _outcome(tid, metered=False, status=m.RequestStatus.FAILED, http_status=502, first_token=None, gaps=[])
    assert write_outcomes(db, [done, failed]) == 1
    assert write_outcomes(db, [done, failed]) == 0  # idempotent: a retried batch writes nothing twice
    assert _count(db, tid) == (1, 2)
    with db.system() as uow:
        rec = uow.requests.get(done.request_id)
        assert rec is not None
        assert rec.ttft_ms == pytest.approx(10, abs=0.5) and rec.tpot_ms == pytest.approx(20, abs=0.5)
        assert rec.itl_p50_ms == pytest.approx(10, abs=0.5) and rec.itl_p99_ms == pytest.approx(20, abs=0.5)


def test_a_batch_already_written_in_part_is_written_again_without_duplicates(db: Database, insert_path: str) -> None:
    tid = _tenant(db)
    done, new = _outcome(tid), _outcome(tid)
    assert write_outcomes(db, [done]) == 1
    assert write_outcomes(db, [done, new, new]) == 1  # the batch's own repeat counts once too
    assert _count(db, tid) == (2, 2)
    with db.system() as uow:  # two batches in one transaction: the second does not see the first's rows
        assert uow.usage.insert_many([_outcome(tid).rows()[0]]) == 1  # type: ignore[list-item]
        assert uow.usage.insert_many([_outcome(tid).rows()[0]]) == 1  # type: ignore[list-item]
        uow.commit()
    assert _count(db, tid) == (4, 2)


def test_a_deleted_tenant_or_key_does_not_hold_up_the_batches_behind_it(db: Database, insert_path: str) -> None:
    """A tenant and a key deleted while their requests waited in the buffer: the batch is written without
    the deleted tenant's rows and with the deleted key's id cleared; the live tenant's rows are all there
    (before, the foreign key failed the batch, and every retry failed again)."""
    live, gone = _tenant(db), _tenant(db)
    with db.system() as uow:
        key = uow.api_keys.add(m.ApiKey(tenant_id=live, name="k", prefix="bk_test", key_hash=uuid.uuid4().bytes * 2,
                                           created_by="test"))
        uow.commit()
        key_id = key.id
    batch = [_outcome(live, api_key_id=key_id), _outcome(gone), _outcome(live)]
    with db.system() as uow:
        uow.session.delete(uow.tenants.require(gone))
        uow.session.delete(uow.api_keys.require(key_id))
        uow.commit()
    assert write_outcomes(db, batch) == 2
    assert _count(db, live) == (2, 2)
    assert _count(db, gone) == (0, 0)
    with db.system() as uow:
        rec = uow.requests.get(batch[0].request_id)
        assert rec is not None and rec.api_key_id is None


@pytest.fixture(params=["few", "staged"])
def insert_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a batch goes in: one ``INSERT ... unnest`` (a few rows) and ``COPY`` through a staging table."""
    from baton.core import repositories

    monkeypatch.setattr(repositories, "STAGE_FROM_ROWS", 10**9 if request.param == "few" else 0)
    return str(request.param)


def test_one_connection_inserts_rows_of_two_column_sets(settings: Settings, db: Database, insert_path: str) -> None:
    tid = _tenant(db)
    fresh = Database(make_engine(settings.db.service_url(), pool_size=1))  # a connection with no staging table yet
    try:
        with fresh.system() as uow:  # each column set gets its own staging table on the connection
            fewer = _outcome(tid).rows()[0]
            assert fewer is not None
            del fewer["cached_tokens"]  # the column's default
            assert uow.usage.insert_many([fewer]) == 1
            assert uow.usage.insert_many([_outcome(tid).rows()[0]]) == 1  # type: ignore[list-item]
            uow.commit()
    finally:
        fresh.dispose()
    assert _count(db, tid) == (2, 0)


async def _until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Polls ``check`` (a loaded machine may take its time; only the outcome is asserted)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.05)):
        if check() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.05)


def test_nothing_is_lost_while_postgres_is_away(relayed_db: tuple[Database, TcpRelay], db: Database) -> None:
    database, relay = relayed_db
    tid = _tenant(db)

    async def go() -> int:
        meter = UsageMeter(database, batch_size=50, flush_interval=0.05, max_backoff=0.2)
        await meter.start()
        for _ in range(30):
            meter.record(_outcome(tid))
        await _until(lambda: _count(db, tid) == (30, 30))
        assert _count(db, tid) == (30, 30)
        relay.cut()
        for _ in range(70):
            meter.record(_outcome(tid))
        await _until(lambda: meter.failures > 1)  # a flush failed, and was retried
        assert meter.pending == 70 and meter.failures > 1  # buffered, retried, not dropped
        relay.restore()
        await meter.stop(drain_s=20)  # writes what is left once Postgres answers again
        return meter.written

    assert asyncio.run(go()) == 100
    assert _count(db, tid) == (100, 100)


def test_the_meters_loop_ends_when_cancelled_as_its_wake_up_arrives(db: Database) -> None:
    """stop() cancels the loop; a cancellation landing in the same turn as a wake-up must not be lost (with
    Python 3.11's asyncio.wait_for it was, and stop() waited forever)."""

    async def go() -> bool:
        meter = UsageMeter(db, flush_interval=10)
        await meter.start()
        await asyncio.sleep(0.01)  # the loop waits for a wake-up
        task = meter._task
        assert task is not None
        meter._wake.set()
        await asyncio.sleep(0)  # the wait is over, the loop not yet resumed
        task.cancel()
        await asyncio.wait({task}, timeout=5)  # generous: a loop that ignored the cancel never ends
        ended = task.done()
        meter._task = None if ended else task
        await meter.stop()
        return ended

    assert asyncio.run(go())


def test_a_full_buffer_stops_accepting(db: Database) -> None:
    async def go() -> tuple[bool, bool]:
        meter = UsageMeter(db, max_buffer=2)
        tid = _tenant(db)
        meter.record(_outcome(tid))
        first = meter.accepting
        meter.record(_outcome(tid))
        second = meter.accepting
        await meter.stop()
        return first, second

    assert asyncio.run(go()) == (True, False)
