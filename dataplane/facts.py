"""Writes the per-request facts the data plane hands to the gateway, through Redis.

The decode server and the decode engine write what only they see (the KV handoff, recovery steps and
phases of the prefill ladder, taken inside Ray) to the request's fact hash; the gateway's metering reads
and merges them into the request record off the request path. Key, fields, payloads and TTL are the
contract in :mod:`baton.core.contracts` (readers: :mod:`baton.api.gateway.fact_reader`). Redis is optional: no
facts URL in the replica's environment (:class:`~baton.core.contracts.ReplicaEnv`), or Redis down, costs
only the facts, never the request.

Three ways to write, by where the caller runs: :func:`record_fact` (awaited, in the replica's event
loop), :func:`spawn_fact` (in the event loop, not awaited: on the token path) and :func:`post_fact`
(from a thread that must not wait, such as a vLLM engine's busy loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import Any

from baton.core.contracts import FACT_TTL_S, Fact, ReplicaEnv, encode_fact, fact_key

log = logging.getLogger(__name__)

_client: Any = None


def redis_client() -> Any:
    """The process's asyncio Redis client for the data plane's writes (facts, engine loads), or None where
    the replica's environment names no Redis."""
    global _client  # one client per process (a Ray replica), built on first use
    if _client is None:
        url = ReplicaEnv.from_environ().facts_redis_url
        if not url:
            return None
        import redis.asyncio as aioredis

        _client = aioredis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    return _client


async def record_fact(request_id: str | None, fact: Fact) -> None:
    """Writes one fact of a request. Never raises: a fact that cannot be written is dropped."""
    if not request_id:
        return
    try:
        client = redis_client()
        if client is None:
            return
        key = fact_key(request_id)
        name, value = encode_fact(fact)
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, name, value)
            pipe.expire(key, FACT_TTL_S)
            await pipe.execute()
    except Exception as exc:  # Redis down, bad value: the request is served anyway
        log.debug("fact %s of %s not recorded: %s", fact.FIELD, request_id, type(exc).__name__)


_background: set[asyncio.Task[None]] = set()


def spawn_fact(request_id: str | None, fact: Fact) -> None:
    """Writes one fact in the background of the running event loop (nothing waits on Redis)."""
    if not request_id:
        return
    try:
        task = asyncio.get_running_loop().create_task(record_fact(request_id, fact))
    except RuntimeError:  # no running loop
        return
    _background.add(task)  # a reference until it is done (the loop keeps only weak ones)
    task.add_done_callback(_background.discard)


_queue: queue.Queue[tuple[str, Fact]] | None = None
_QUEUE_MAX = 1024


def post_fact(request_id: str | None, fact: Fact) -> None:
    """Writes one fact from a thread that must not wait on Redis (a vLLM engine's busy loop).

    The fact is queued and written by one daemon thread per process; when Redis is unset, down or
    behind, facts are dropped, never the request."""
    global _queue  # one writer thread per process, started on first use
    if not request_id:
        return
    url = ReplicaEnv.from_environ().facts_redis_url
    if not url:
        return
    if _queue is None:
        _queue = queue.Queue(maxsize=_QUEUE_MAX)
        threading.Thread(target=_writer, args=(_queue, url), name="baton-facts", daemon=True).start()
    with contextlib.suppress(queue.Full):
        _queue.put_nowait((request_id, fact))


def _writer(q: queue.Queue[tuple[str, Fact]], url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    while True:
        request_id, fact = q.get()
        try:
            key = fact_key(request_id)
            name, value = encode_fact(fact)
            pipe = client.pipeline(transaction=False)
            pipe.hset(key, name, value)
            pipe.expire(key, FACT_TTL_S)
            pipe.execute()
        except Exception as exc:
            log.debug("fact %s of %s not recorded: %s", fact.FIELD, request_id, type(exc).__name__)
