"""Each engine's scheduler load, written to Redis for the gateway's flow control.

vLLM hands every stat logger its scheduler's figures after each engine step (``SchedulerStats``: requests
running and waiting, KV-cache usage). :class:`EngineLoadLogger` is one such logger, added to the engine
that Ray Serve LLM starts (:func:`install`, called by :class:`baton.dataplane.engine.BatonVLLMEngine`). It
averages the running and waiting counts over the time of each interval, each step's counts weighted by
how long they held (a request that waits one step between two chunks of a prefill is not a queue, and the
many short empty steps of an engine waiting for KV are not its load), keeps the largest KV usage, and
writes an
:class:`~baton.core.contracts.EngineLoad` at most every ``ENGINE_LOAD_INTERVAL_S`` while the engine steps,
and once more when it goes idle. The key, its expiry and the payload are the contract in
:mod:`baton.core.contracts`; the writes go out on the replica's event loop, never waited on, and Redis
unset or down costs only the report.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

from baton.core.contracts import (
    ENGINE_LOAD_BUSY_TTL_S,
    ENGINE_LOAD_IDLE_TTL_S,
    ENGINE_LOAD_INDEX,
    ENGINE_LOAD_INTERVAL_S,
    EngineLoad,
    ReplicaEnv,
    engine_load_key,
    engine_load_message,
    indexed_set,
)
from baton.dataplane import facts

log = logging.getLogger(__name__)


class LoadWindow:
    """The figures of the steps since the last write, each weighted by how long it held (pure: the logger's
    arithmetic). A count holds from the step that reported it to the next step: an engine waiting for KV
    from another engine takes many short empty steps, which a plain mean over steps would count as much as
    a long decode step."""

    __slots__ = ("kv", "running", "seconds", "steps", "waiting")

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.running = 0.0  #: request-seconds
        self.waiting = 0.0
        self.kv = 0.0

    def add(self, running: int, waiting: int, kv_usage: float, held_s: float) -> None:
        self.steps += 1
        self.seconds += held_s
        self.running += running * held_s
        self.waiting += waiting * held_s
        self.kv = max(self.kv, kv_usage)

    def load(self, *, model: str, engine: str, role: str, at: float, now: tuple[int, int]) -> EngineLoad:
        """The window's time-weighted means; ``now``: the latest step's (running, waiting), the figures of a
        window that has held no time yet."""
        if self.seconds > 0:
            running, waiting = self.running / self.seconds, self.waiting / self.seconds
        else:
            running, waiting = float(now[0]), float(now[1])
        return EngineLoad(model=model, engine=engine, role=role, running=running, waiting=waiting,
                          kv_usage=self.kv, steps=self.steps, at=at)


class EngineLoadLogger:
    """A vLLM per-engine stat logger (the ``StatLoggerBase`` interface) that reports the scheduler's load."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, *, model: str | None = None,
                 role: str | None = None, clock: Any = time.monotonic) -> None:
        names = getattr(getattr(vllm_config, "model_config", None), "served_model_name", None)
        if isinstance(names, list | tuple):
            names = names[0] if names else None
        self.model = model or str(names or "unknown")
        self.role = role or ReplicaEnv.from_environ().engine_role or "both"
        self.engine = f"{socket.gethostname()}:{os.getpid()}" + (f":{engine_index}" if engine_index else "")
        self.clock = clock
        self.window = LoadWindow()
        self._last = clock()
        self._busy = False
        self._prev: tuple[int, int] = (0, 0)
        self._prev_t = self._last
        self._tasks: set[asyncio.Task[None]] = set()

    def record(self, scheduler_stats: Any, iteration_stats: Any = None, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is None:
            return
        running = int(getattr(scheduler_stats, "num_running_reqs", 0) or 0)
        waiting = int(getattr(scheduler_stats, "num_waiting_reqs", 0) or 0)
        kv = float(getattr(scheduler_stats, "kv_cache_usage", 0.0) or 0.0)
        now = self.clock()
        if self._busy:  # what the previous step reported held until this one (an idle spell counts nowhere)
            self.window.add(*self._prev, kv, max(now - self._prev_t, 0.0))
        else:
            self.window.kv = max(self.window.kv, kv)
        self._prev, self._prev_t = (running, waiting), now
        busy = running > 0 or waiting > 0
        if busy == self._busy and now - self._last < ENGINE_LOAD_INTERVAL_S:
            return
        self._busy = busy
        self._last = now
        load = self.window.load(model=self.model, engine=self.engine, role=self.role, at=time.time(),
                                now=(running, waiting))
        self.window = LoadWindow()
        if not busy:  # the idle report: what is left running is nothing, whatever the window averaged
            load = EngineLoad(model=load.model, engine=load.engine, role=load.role, running=0.0, waiting=0.0,
                              kv_usage=load.kv_usage, steps=load.steps, at=load.at)
        self._write(load, ENGINE_LOAD_BUSY_TTL_S if busy else ENGINE_LOAD_IDLE_TTL_S)

    def _write(self, load: EngineLoad, ttl_s: int) -> None:
        client = facts.redis_client()
        if client is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._set(client, load, ttl_s))
        except RuntimeError:  # no running loop
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _set(client: Any, load: EngineLoad, ttl_s: int) -> None:
        try:
            async with client.pipeline(transaction=False) as pipe:
                indexed_set(pipe, ENGINE_LOAD_INDEX, engine_load_key(load.model, load.engine),
                            engine_load_message(load), ttl_s, now=time.time())
                await pipe.execute()
        except Exception as exc:  # Redis down: flow control goes on with the gateway's own measures
            log.debug("engine load not written: %s", type(exc).__name__)

    # the rest of vLLM's StatLoggerBase
    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass


def install(engine_client: Any) -> bool:
    """Adds an :class:`EngineLoadLogger` per engine to a started vLLM ``AsyncLLM``'s stat loggers (vLLM takes
    custom loggers only at construction, which Ray Serve LLM does; vllm#17702). False where the engine keeps
    no stats or the replica has no Redis to write to: nothing is added."""
    if not ReplicaEnv.from_environ().facts_redis_url:
        return False
    manager = getattr(engine_client, "logger_manager", None)
    loggers = getattr(manager, "stat_loggers", None)
    if manager is None or not isinstance(loggers, list):
        log.info("engine load not reported: the engine keeps no stats")
        return False
    from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter

    config: Any = getattr(engine_client, "vllm_config", None)
    factory: Any = EngineLoadLogger  # vLLM's StatLoggerBase interface, by duck typing
    loggers.append(PerEngineStatLoggerAdapter(vllm_config=config, engine_indexes=list(manager.engine_indexes),
                                              per_engine_stat_logger_factory=factory))
    return True
