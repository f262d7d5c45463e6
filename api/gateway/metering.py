"""Usage metering off the hot path.

Each finished request becomes one :class:`Outcome`; :meth:`UsageMeter.record` only appends it to an
in-memory buffer. A background task writes the buffer to Postgres in batches (every
``flush_interval`` seconds, or sooner when ``batch_size`` are waiting): one usage row per request
that reached the engine (``usage_records``, idempotent on ``request_id``) and one request record
(``request_records``, idempotent on ``id``) with TTFT, TPOT, ITL and end-to-end time, the recovery
steps taken (:class:`baton.core.contracts.RecoveryStep`) and the decode server's measured phases
(:class:`baton.core.contracts.Phase`, merged from its facts by ``enrich``), in one system-scope transaction.

A large batch goes in through ``COPY``, a small one with one ``INSERT`` (see the repositories'
``insert_many``), and two batches are written at once (``writers``), so one is formatted while another
commits. If Postgres is unavailable the batch
goes back to the buffer and is retried with backoff; because both inserts are idempotent (``ON CONFLICT
DO NOTHING`` on ``request_id`` and ``id``) a retry after an ambiguous failure writes nothing twice. The
buffer is bounded (``max_buffer``): when it is full the gateway refuses new requests with 503
(:attr:`accepting`) instead of serving requests it could not meter. On shutdown the buffer is flushed (bounded wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from baton.core import errors
from baton.core import models as m
from baton.core.contracts import RecoveryStep, StepName, StepOutcome
from baton.core.db import Database

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What happened to one request, as the gateway saw it."""

    request_id: uuid.UUID
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    model: str
    endpoint: str
    stream: bool
    started: float  # unix seconds
    deployment: str | None = None
    trace_id: str | None = None
    status: m.RequestStatus = m.RequestStatus.COMPLETED
    http_status: int = 200
    error_code: str | None = None
    metered: bool = False  # the engine did work: write a usage row
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token: float | None = None  # perf_counter times
    start_pc: float = 0.0
    end_pc: float = 0.0
    gaps: list[float] = field(default_factory=list)  # seconds between token-bearing chunks
    span: Any = None  # the request's gateway.request span while it runs (None: tracing off)
    span_id: str | None = None  # that span's id (hex): parent of spans added after the request ended
    kv_bytes: int | None = None  # P/D handoff, from the data plane's facts
    handoff_ms: float | None = None
    facts_merged: bool = False  # data-plane facts read (api/gateway/fact_reader.py)
    recovery_steps: list[dict[str, Any]] = field(default_factory=list)  # RecoveryStep JSON, in order taken
    phases: list[dict[str, Any]] | None = None  # Phase JSON from the decode server's facts (its measured phases)
    queue_ms: float | None = None  # the wait in the flow-control queue (None: flow control off)
    flow_class: str | None = None  # the SLO class it was queued as
    flow_band: int | None = None  # and its band
    slo_ttft_ms: int | None = None  # that class's targets (SLO attainment in the metrics)
    slo_tpot_ms: int | None = None
    dispatch_pc: float | None = None  # perf_counter when it left the queue for the upstream
    ticket: Any = None  # its flow-control place while it runs (baton.api.gateway.flow.Ticket)
    batch_id: str | None = None  # the batch it is a line of

    def step(self, name: StepName, started_pc: float, outcome: StepOutcome, detail: str) -> None:
        """Records one recovery step the gateway took (``decode_resume``, ``aggregated_fallback``)."""
        self.recovery_steps.append(RecoveryStep.timed(name, origin_pc=self.start_pc, started_pc=started_pc,
                                                      now_pc=time.perf_counter(), outcome=outcome,
                                                      detail=detail).to_json())

    def client_gap(self, index: int, gap_s: float) -> None:
        """Notes on recovery step ``index`` what the client waited across it (see ``RecoveryStep``)."""
        step = RecoveryStep.from_json(self.recovery_steps[index])
        self.recovery_steps[index] = replace(step, client_gap_ms=round(gap_s * 1000, 3)).to_json()

    def rows(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        e2e_ms = max((self.end_pc - self.start_pc) * 1000, 0.0)
        started = dt.datetime.fromtimestamp(self.started, dt.UTC)
        ttft_ms = (self.first_token - self.start_pc) * 1000 if self.first_token is not None else None
        tpot_ms = None
        if ttft_ms is not None and self.completion_tokens > 1:
            tpot_ms = (e2e_ms - ttft_ms) / (self.completion_tokens - 1)
        p50 = p99 = None
        if self.gaps:
            gaps = sorted(self.gaps)
            p50 = gaps[len(gaps) // 2] * 1000
            p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1000
        record = {
            "id": self.request_id, "tenant_id": self.tenant_id, "api_key_id": self.api_key_id,
            "model": self.model, "deployment": self.deployment, "endpoint": self.endpoint, "stream": self.stream,
            "status": self.status, "http_status": self.http_status, "error_code": self.error_code,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "itl_p50_ms": p50, "itl_p99_ms": p99, "e2e_ms": e2e_ms,
            "trace_id": self.trace_id, "started_at": started, "kv_bytes": self.kv_bytes,
            "handoff_ms": self.handoff_ms, "recovery_steps": list(self.recovery_steps), "phases": self.phases,
            "queue_ms": self.queue_ms, "flow_class": self.flow_class,
            "finished_at": started + dt.timedelta(milliseconds=e2e_ms),
        }
        usage = None
        if self.metered:
            usage = {
                "request_id": self.request_id, "tenant_id": self.tenant_id, "api_key_id": self.api_key_id,
                "model": self.model, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
                "batch_id": self.batch_id,
            }
        return usage, record


def write_outcomes(db: Database, outcomes: list[Outcome]) -> int:
    """Writes a batch in one transaction; returns the usage rows that were new (idempotent).

    A tenant or key deleted while its requests waited in the buffer would fail the whole batch on its
    foreign key, and with it every later batch behind it: such a batch is written again with the rows of a
    deleted tenant left out (the tenant's deletion removes its records anyway) and a deleted key's id
    cleared (as its deletion clears it on rows already written)."""
    usage: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for o in outcomes:
        u, r = o.rows()
        records.append(r)
        if u is not None:
            usage.append(u)
    try:
        return _insert(db, usage, records)
    except errors.NotFoundError:
        usage, records = _without_deleted_references(db, usage, records)
        return _insert(db, usage, records)


def _insert(db: Database, usage: list[dict[str, Any]], records: list[dict[str, Any]]) -> int:
    with db.system() as uow:
        written = uow.usage.insert_many(usage)
        uow.requests.insert_many(records)
        uow.commit()
    return written


def _without_deleted_references(db: Database, usage: list[dict[str, Any]], records: list[dict[str, Any]]
                                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows = usage + records
    with db.system() as uow:
        tenants = uow.tenants.existing(r["tenant_id"] for r in rows)
        keys = uow.api_keys.existing(r["api_key_id"] for r in rows)

    def kept(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "api_key_id": r["api_key_id"] if r["api_key_id"] in keys else None}
                for r in batch if r["tenant_id"] in tenants]

    usage_kept, records_kept = kept(usage), kept(records)
    log.warning("request outcomes of deleted tenants left out: %d of %d; of deleted keys kept without the key",
                len(records) - len(records_kept), len(records))
    return usage_kept, records_kept


class UsageMeter:
    def __init__(
        self,
        db: Database,
        *,
        batch_size: int = 1000,
        flush_interval: float = 0.2,
        max_buffer: int = 100_000,
        max_backoff: float = 5.0,
        writers: int = 2,
        enrich: Any = None,
        observe: Any = None,
    ) -> None:
        """``enrich``: ``async (outcomes) -> None`` run on each batch before it is written (data-plane
        facts); its failures only cost what it would have added."""
        self._db = db
        self._enrich = enrich
        self._observe = observe  # ``(outcome) -> None``, once per written outcome (metrics)
        self._batch = batch_size
        self._interval = flush_interval
        self._max = max_buffer
        self._max_backoff = max_backoff
        self._writers = max(writers, 1)
        self._writing = 0  # outcomes taken from the buffer by a write in progress
        self._buffer: deque[Outcome] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.written = 0  # usage rows written by this process
        self.failures = 0

    @property
    def accepting(self) -> bool:
        return len(self._buffer) + self._writing < self._max

    @property
    def pending(self) -> int:
        """Outcomes not written yet (queued or being written)."""
        return len(self._buffer) + self._writing

    def record(self, outcome: Outcome) -> None:
        """Queues one outcome. Never blocks and never raises: safe in ``finally`` of a cancelled task."""
        self._buffer.append(outcome)
        if len(self._buffer) >= self._batch:
            self._wake.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-meter")

    async def stop(self, drain_s: float = 10.0) -> None:
        """Stops the loop, then tries to write what is left for up to ``drain_s`` seconds."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        deadline = time.monotonic() + drain_s
        while self._buffer and time.monotonic() < deadline:
            if not await self.flush():
                await asyncio.sleep(0.2)
        if self._buffer:
            log.error("%d request outcomes could not be written before shutdown", len(self._buffer))

    async def flush(self) -> bool:
        """Writes one batch; False if the database refused (the batch goes back to the queue's head)."""
        if not self._buffer:
            return True
        batch = [self._buffer.popleft() for _ in range(min(self._batch, len(self._buffer)))]
        self._writing += len(batch)
        try:
            written = await self._write(batch)
        finally:
            self._writing -= len(batch)
        if written is None:
            self._buffer.extendleft(reversed(batch))
            return False
        self.written += written
        if self._observe is not None:
            for outcome in batch:
                try:
                    self._observe(outcome)
                except Exception as exc:  # metrics never cost a record
                    log.debug("metrics not observed (%s)", type(exc).__name__)
        return True

    async def _write(self, batch: list[Outcome]) -> int | None:
        """Usage rows written, or None when the batch must be tried again."""
        if self._enrich is not None:
            try:
                await self._enrich(batch)
            except Exception as exc:
                log.debug("request facts not merged (%s)", type(exc).__name__)
        try:
            return await asyncio.to_thread(write_outcomes, self._db, batch)
        except asyncio.CancelledError:
            self._buffer.extendleft(reversed(batch))  # stop() drains it
            raise
        except errors.BatonError as exc:
            self.failures += 1
            log.warning("usage batch of %d not written yet (%s); will retry", len(batch), exc.code)
        except Exception as exc:  # unexpected: keep the data, retry later
            self.failures += 1
            log.error("usage batch of %d not written yet (%s); will retry", len(batch), type(exc).__name__)
        return None

    async def _run(self) -> None:
        backoff = self._interval
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that arrives just
            # as the event is set, and stop() then waits for this loop forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._wake.wait()
            self._wake.clear()
            ok = True
            while ok and self._buffer:
                # Up to ``writers`` batches at once: one is built and sent while another commits.
                n = min(self._writers, -(-len(self._buffer) // self._batch))
                ok = all(await asyncio.gather(*(self.flush() for _ in range(n))))
                if ok and len(self._buffer) < self._batch:
                    break
            backoff = self._interval if ok else min(max(backoff * 2, 0.2), self._max_backoff)
