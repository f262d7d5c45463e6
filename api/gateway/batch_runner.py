"""The batch runner: each gateway process runs batches' lines through its own pipeline (docs/batch.md).

Why in the gateway, not in a Celery task: the room a batch may use is known only where interactive
requests queue, in the gateway's flow control; a line run here waits in its model's queue in the batch
band (below every SLO band, never on the sparse burst, and upstream only while the model runs fewer than
:func:`~baton.api.gateway.flow.batch_limit` requests: all but one place, a quarter beside interactive
traffic) and passes the same checks, rate limits, recovery, metering and tracing as a client's request,
with nothing between.
The worker (Celery) ends batches that no gateway is left to end and deletes expired files.

Per tick: renew the leases of the lines held, end the batches that are done, and claim lines of models
whose queue here has no interactive request waiting, up to ``concurrency`` claimed at once. A line refused for
a passing reason (a rate limit, the queue, a pool not serving) goes back with a wait and is tried again,
``max_attempts`` times in all; any other answer is its result. A gateway that dies leaves its lines'
leases to run out; another claims them (``attempt`` fences the late writer off).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from functools import partial
from typing import Any

import orjson
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from baton.api.errors import client_message, openai_error_body, validation_error
from baton.api.gateway import responses
from baton.api.gateway.flow import BATCH_BAND
from baton.api.gateway.principals import Principal, load_principal_by_id
from baton.api.gateway.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from baton.api.gateway.service import BatchLineRef, Gateway
from baton.control import batches as use
from baton.core import errors
from baton.core.db import Database
from baton.core.settings import BatchSettings

log = logging.getLogger(__name__)

_SCHEMAS: dict[str, type[BaseModel]] = {
    "chat/completions": ChatCompletionRequest, "completions": CompletionRequest, "embeddings": EmbeddingRequest,
}
#: How long a loaded principal is used before it is read again (a revoked key stops its batch within this).
PRINCIPAL_TTL_S = 30.0
#: The shortest time between two ticks of a busy runner.
MIN_TICK_S = 0.05
#: Claims of a line beyond ``max_attempts`` (its runner died, its lease ran out) before it fails unrun.
TAKEOVERS = 3


def _server_error(rid: str) -> dict[str, Any]:
    return {"status_code": 500, "request_id": rid, "body": orjson.Fragment(openai_error_body(
        "The request failed inside Baton.", status=500, code="internal_error"))}


def _retryable(exc: errors.BatonError) -> bool:
    """Refusals that pass: limits and queues (429), a pool not serving now or the gateway busy (503), an
    upstream that failed (502, the line's request id keeps it metered once)."""
    return exc.status in (429, 502, 503)


def _retry_after(exc: errors.BatonError, attempt: int) -> float:
    headers = exc.extra.get("headers") or {}
    try:
        hinted = float(headers.get("retry-after", ""))
    except ValueError:
        hinted = 0.0
    return max(hinted, min(2.0 ** attempt, 60.0))


class BatchRunner:
    def __init__(self, gateway: Gateway, db: Database, settings: BatchSettings, *, salt_secret: str) -> None:
        self.gateway = gateway
        self.db = db
        self.settings = settings
        self._salt = salt_secret
        self._principals: dict[uuid.UUID, tuple[Principal | None, float]] = {}
        self._inflight: dict[tuple[str, int, int], asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._renewed = 0.0
        self._idle = False  # no batch running anywhere: look less often
        # results waiting to be written, a group per transaction (:meth:`_writer`)
        self._results: list[tuple[use.Result, asyncio.Future[bool]]] = []
        self._results_ready = asyncio.Event()
        self._writer_task: asyncio.Task[None] | None = None
        self.lines_run = 0  # results written by this process (tests, metrics)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-runner")
        self._writer_task = asyncio.create_task(self._writer(), name="batch-results")

    async def stop(self) -> None:
        for task in (self._task, self._writer_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        held = list(self._inflight)
        for task in self._inflight.values():
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        if held:  # give the lines back now rather than when their leases run out
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._give_back, held)

    def _give_back(self, held: list[tuple[str, int, int]]) -> None:
        for batch_id, line, attempt in held:
            with self.db.system() as uow:
                uow.batches.put_back(batch_id, line, attempt, not_before=dt.datetime.now(dt.UTC))
                uow.commit()

    def poke(self) -> None:
        """Look for work now (a batch was created here, a line ended)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()  # a poke during the tick brings the next one
            started = time.monotonic()
            busy = False
            try:
                busy = await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Postgres away: the next tick tries again
                log.warning("batch runner: tick failed (%s)", type(exc).__name__)
            wait = self.settings.idle_poll_s if self._idle else self.settings.poll_s / (4 if busy else 1)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            # lines ending many a second make one tick (three queries) every MIN_TICK_S, not one each
            await asyncio.sleep(max(MIN_TICK_S - (time.monotonic() - started), 0.0))

    async def _tick(self) -> bool:
        s = self.settings
        now = time.monotonic()
        if self._inflight and now - self._renewed > s.lease_s / 3:
            await asyncio.to_thread(use.renew, self.db, list(self._inflight), lease_s=s.lease_s)
            self._renewed = now
        await asyncio.to_thread(use.finalize_ready, self.db, part_bytes=s.part_bytes,
                                retention=dt.timedelta(days=s.file_retention_days))
        free = s.concurrency - len(self._inflight)
        if free <= 0:
            return True
        running = await asyncio.to_thread(use.running_models, self.db)
        self._idle = not running and not self._inflight
        models = [name for name in running if self._room(name) and await self.gateway.router.resolve(name) is not None]
        if not models:
            return bool(self._inflight)
        claimed = await asyncio.to_thread(use.claim, self.db, models=models, limit=free, lease_s=s.lease_s)
        for line in claimed:
            task = asyncio.create_task(self._run(line), name=f"batch-line-{line.batch_id}-{line.line}")
            self._inflight[line.held] = task
            task.add_done_callback(partial(self._ended, line.held))
        return bool(claimed) or bool(self._inflight)

    def _ended(self, key: tuple[str, int, int], _task: asyncio.Task[None]) -> None:
        self._inflight.pop(key, None)
        self._wake.set()

    def _room(self, model: str) -> bool:
        """No interactive request waits for the model in this process's queue (and, checked beside it, this
        gateway routes the model: one that cannot serve it leaves its lines to those that can)."""
        flow = self.gateway.flow
        if flow is None:
            return True
        waiting = flow.model(model).waiting_by_band()
        return not any(n for band, n in waiting.items() if band > BATCH_BAND)

    async def _principal(self, key_id: uuid.UUID | None) -> Principal | None:
        if key_id is None:
            return None
        cached = self._principals.get(key_id)
        if cached is not None and time.monotonic() - cached[1] < PRINCIPAL_TTL_S:
            return cached[0]
        principal = await asyncio.to_thread(load_principal_by_id, self.db, key_id, self._salt)
        self._principals[key_id] = (principal, time.monotonic())
        return principal

    async def _run(self, line: use.Claimed) -> None:
        rid = f"req-{line.request_id.hex}"
        usage: dict[str, Any] | None = None
        try:
            if line.attempt > self.settings.max_attempts + TAKEOVERS:
                # taken over again and again: whatever ends its runs (a crash, a result that cannot be kept)
                # would end every later one too
                raise errors.ServerError(f"The request could not be completed in {line.attempt - 1} attempts.")
            ref = BatchLineRef(line.batch_id, line.request_id)
            body = await self._answer(line, ref)
            ok, response = True, {"status_code": 200, "request_id": rid, "body": orjson.Fragment(body)}
            if ref.outcome is not None and ref.outcome.metered:
                usage = ref.outcome.rows()[0]
        except asyncio.CancelledError:
            raise
        except errors.BatonError as exc:
            if _retryable(exc) and line.attempt < self.settings.max_attempts:
                await asyncio.to_thread(use.put_back, self.db, line, after_s=_retry_after(exc, line.attempt))
                return
            error = orjson.loads(openai_error_body(client_message(exc), status=exc.status, param=exc.param,
                                                   code=exc.extra.get("openai_code", exc.code),
                                                   type_=exc.extra.get("openai_type")))
            ok, response = False, {"status_code": exc.status, "request_id": rid, "body": error}
        except Exception:  # never lose a line to a bug: it fails with a server error, logged
            log.exception("batch %s line %d failed", line.batch_id, line.line)
            ok, response = False, _server_error(rid)
        try:
            kept = await self._write(use.Result(line, ok, response, usage))
        except errors.ClientError:  # Postgres refused the result itself: the line fails, it is not run again
            log.exception("batch %s line %d: its result could not be kept", line.batch_id, line.line)
            kept = await asyncio.to_thread(use.finish, self.db, line, ok=False, response=_server_error(rid))
        if kept:
            self.lines_run += 1

    async def _write(self, result: use.Result) -> bool:
        """Queues a line's result for the writer; whether it was kept (this attempt still held the line)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._results.append((result, fut))
        self._results_ready.set()
        return await fut

    async def _writer(self) -> None:
        """Writes the results that came in since its last write, in one transaction (with many lines ending
        each second, one transaction a line kept the lines waiting on Postgres instead of the engines). A
        group that fails is written a line at a time, so that one bad result fails only its own line."""
        while True:
            await self._results_ready.wait()
            self._results_ready.clear()
            group, self._results = self._results, []
            if not group:
                continue
            try:
                kept = await asyncio.to_thread(use.finish_many, self.db, [r for r, _ in group])
            except asyncio.CancelledError:
                raise
            except Exception:
                for result, fut in group:
                    try:
                        one = await asyncio.to_thread(use.finish_many, self.db, [result])
                    except Exception as exc:
                        if not fut.done():
                            fut.set_exception(exc)
                    else:
                        if not fut.done():
                            fut.set_result(one[0])
                continue
            for (_, fut), k in zip(group, kept, strict=True):
                if not fut.done():
                    fut.set_result(k)

    async def _answer(self, line: use.Claimed, ref: BatchLineRef) -> bytes:
        principal = await self._principal(line.api_key_id)
        if principal is None:
            raise errors.AuthenticationError("The API key that created this batch no longer exists.")
        principal.check(time.time())
        body = orjson.loads(line.body)
        if line.endpoint == "responses":
            try:
                req = responses.ResponseRequest.model_validate(body)
            except PydanticValidationError as exc:
                raise validation_error(exc.errors()) from None
            answer = await responses.create(self.gateway, principal, req, traceparent=None, auth_ns=None, line=ref)
        else:
            try:
                parsed = _SCHEMAS[line.endpoint].model_validate(body)
            except PydanticValidationError as exc:
                raise validation_error(exc.errors()) from None
            payload = parsed.model_dump(mode="json", exclude_unset=True,
                                        exclude_none=line.endpoint == "embeddings")
            answer = await self.gateway.serve(line.endpoint, principal, payload, traceparent=None, line=ref)
        return bytes(answer.body)  # JSON the gateway has parsed already (it metered the answer's usage)
