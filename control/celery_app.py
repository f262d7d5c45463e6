"""Celery: the reconcile, usage roll-up, key-expiry, stored-response purge and batch sweep jobs, on Redis, with an
embedded beat.

Nothing is built at import time. :func:`create_celery` builds the app from settings; the worker builds
its database and Ray client once per process, on the first task. The admin API enqueues a reconcile
after each committed change with :func:`reconcile_trigger`; beat repeats it for drift repair.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery, Task

from baton.control.keys import RedisKeyEvents
from baton.core.db import Database

if TYPE_CHECKING:
    from baton.control.reconciler import ReconcileResult

log = logging.getLogger(__name__)

RECONCILE = "baton.reconcile"
ROLLUP = "baton.usage_rollup"
EXPIRE_KEYS = "baton.expire_keys"
PURGE_RESPONSES = "baton.purge_responses"
SWEEP_BATCHES = "baton.sweep_batches"
QUEUE = "baton"
#: While a deployment is on its way, the reconcile polls again after this many seconds.
FOLLOW_UP_S = 5.0


class _Context:
    """Per-process resources of a worker, built on first use."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._db: Any = None
        self._reconciler: Any = None

    @property
    def db(self) -> Any:
        if self._db is None:
            self._db = Database.for_services(self.settings)
        return self._db

    @property
    def reconciler(self) -> Any:
        if self._reconciler is None:
            # deferred: the worker's reconciler (the Ray client, the data plane's renderer); a process that
            # only sends tasks never needs them
            from baton.control.ray_client import RayServeClient
            from baton.control.reconciler import Reconciler

            client = RayServeClient.from_settings(self.settings)
            self._reconciler = Reconciler.from_settings(self.settings, self.db, client)
        return self._reconciler


def create_celery(settings: Any, *, queue: str = QUEUE) -> Celery:
    app = Celery("baton", broker=settings.redis.url, backend=None, set_as_current=False)
    c = settings.control
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        beat_schedule={
            "reconcile": {"task": RECONCILE, "schedule": timedelta(seconds=c.reconcile_interval_s),
                          "kwargs": {"reason": "periodic"}},
            "usage-rollup": {"task": ROLLUP, "schedule": timedelta(seconds=c.rollup_interval_s)},
            "expire-keys": {"task": EXPIRE_KEYS, "schedule": timedelta(seconds=c.expire_keys_interval_s)},
            "purge-responses": {"task": PURGE_RESPONSES, "schedule": timedelta(hours=1)},
            "sweep-batches": {"task": SWEEP_BATCHES, "schedule": timedelta(minutes=5)},
        },
    )
    ctx = _Context(settings)
    app.conf.baton_context = ctx

    @app.task(name=RECONCILE, bind=True, max_retries=30)  # type: ignore[untyped-decorator,unused-ignore]
    def reconcile_task(self: Task, reason: str = "change") -> dict[str, Any]:
        from baton.control import jobs  # deferred: task bodies; a process that only sends tasks never needs them

        result: ReconcileResult = jobs.reconcile(ctx.db, ctx.reconciler, task_id=self.request.id, reason=reason)
        if not result.locked:
            raise self.retry(countdown=2.0)
        if not result.converged and _claim_follow_up(settings):
            self.apply_async(kwargs={"reason": "follow-up"}, countdown=FOLLOW_UP_S)
        summary: dict[str, Any] = result.as_dict()
        return summary

    @app.task(name=ROLLUP, bind=True)  # type: ignore[untyped-decorator,unused-ignore]
    def rollup_task(self: Task, days: int = 2) -> int:
        from baton.control import jobs  # deferred: task bodies; a process that only sends tasks never needs them

        rows: int = jobs.roll_up_usage(ctx.db, days=days, task_id=self.request.id)
        return rows

    @app.task(name=EXPIRE_KEYS, bind=True)  # type: ignore[untyped-decorator,unused-ignore]
    def expire_keys_task(self: Task) -> list[str]:
        from baton.control import jobs  # deferred: task bodies; a process that only sends tasks never needs them

        done: list[str] = jobs.expire_keys(ctx.db, task_id=self.request.id,
                                           events=RedisKeyEvents.from_settings(settings))
        return done

    @app.task(name=PURGE_RESPONSES, bind=True)  # type: ignore[untyped-decorator,unused-ignore]
    def purge_responses_task(self: Task) -> int:
        from baton.control import jobs  # deferred: task bodies; a process that only sends tasks never needs them

        deleted: int = jobs.purge_responses(ctx.db, task_id=self.request.id)
        return deleted

    @app.task(name=SWEEP_BATCHES, bind=True)  # type: ignore[untyped-decorator,unused-ignore]
    def sweep_batches_task(self: Task) -> dict[str, Any]:
        from baton.control import jobs  # deferred: task bodies; a process that only sends tasks never needs them

        b = settings.gateway.batch
        swept: dict[str, Any] = jobs.sweep_batches(ctx.db, part_bytes=b.part_bytes,
                                                   retention_days=b.file_retention_days, task_id=self.request.id)
        return swept

    return app


def _claim_follow_up(settings: Any) -> bool:
    """At most one pending follow-up poll at a time, across workers."""
    try:
        r = redis.Redis.from_url(settings.redis.url, socket_timeout=2)
        return bool(r.set("baton:reconcile:follow-up", "1", nx=True, px=int(FOLLOW_UP_S * 1000)))
    except redis.RedisError:
        return True


def reconcile_trigger(settings: Any, *, queue: str = QUEUE) -> Callable[[str], None]:
    """A function that enqueues a reconcile; never raises (the periodic pass repairs a lost trigger)."""
    app = Celery("baton-client", broker=settings.redis.url, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry=False, broker_connection_max_retries=0)

    def trigger(reason: str = "change") -> None:
        try:
            app.send_task(RECONCILE, kwargs={"reason": reason}, queue=queue, retry=False)
        except Exception as exc:
            log.warning("could not enqueue a reconcile (%s); the periodic pass will catch up", type(exc).__name__)

    return trigger


def run_beat(settings: Any, *, loglevel: str = "INFO") -> None:
    """Runs only the beat scheduler in this process (one per deployment: it enqueues the periodic jobs)."""
    app = create_celery(settings)
    schedule = settings.state_dir / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    app.start(["beat", f"--loglevel={loglevel}", f"--schedule={schedule}"])


def run_worker(settings: Any, *, concurrency: int = 1, loglevel: str = "INFO", beat: bool = True) -> None:
    """Runs a worker in this process (with the beat scheduler embedded unless ``beat`` is False)."""
    app = create_celery(settings)
    argv = ["worker", f"--concurrency={concurrency}", f"--loglevel={loglevel}", "-Q", QUEUE]
    if beat:
        schedule = settings.state_dir / "celerybeat-schedule"
        schedule.parent.mkdir(parents=True, exist_ok=True)
        argv += ["-B", f"--schedule={schedule}"]
    app.worker_main(argv)
