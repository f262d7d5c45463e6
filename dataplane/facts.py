"""Per-request facts the data plane hands to the gateway, through Redis.

The decode server writes what only it sees (the KV handoff, recovery steps taken inside Ray) to the
hash ``baton:req:<request id>`` (fields are JSON, TTL 10 minutes); the gateway's metering reads and
merges them into the request record off the request path. The request id is the gateway's
``x-request-id`` upstream header (hex; a ``req-`` prefix is dropped), which Ray Serve takes as its
request id. Redis is optional: ``BATON_DATAPLANE_REDIS_URL`` unset, or Redis down, costs only the facts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from typing import Any

log = logging.getLogger(__name__)

ENV_REDIS_URL = "BATON_DATAPLANE_REDIS_URL"
TTL_S = 600
_client: Any = None


def fact_key(request_id: str) -> str:
    return f"baton:req:{request_id.removeprefix('req-')}"


def _redis() -> Any:
    global _client  # one client per process (a Ray replica), built on first use
    if _client is None:
        url = os.environ.get(ENV_REDIS_URL)
        if not url:
            return None
        import redis.asyncio as aioredis

        _client = aioredis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    return _client


async def record_fact(request_id: str | None, field: str, value: Any) -> None:
    """Writes one fact of a request. Never raises: a fact that cannot be written is dropped."""
    if not request_id:
        return
    try:
        client = _redis()
        if client is None:
            return
        key = fact_key(request_id)
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, field, json.dumps(value, separators=(",", ":")))
            pipe.expire(key, TTL_S)
            await pipe.execute()
    except Exception as exc:  # Redis down, bad value: the request is served anyway
        log.debug("fact %s of %s not recorded: %s", field, request_id, type(exc).__name__)


_queue: queue.Queue[tuple[str, str, Any]] | None = None
_QUEUE_MAX = 1024


def post_fact(request_id: str | None, field: str, value: Any) -> None:
    """Writes one fact from a thread that must not wait on Redis (a vLLM engine's busy loop).

    The fact is queued and written by one daemon thread per process; when Redis is unset, down or
    behind, facts are dropped, never the request."""
    global _queue  # one writer thread per process, started on first use
    if not request_id or not os.environ.get(ENV_REDIS_URL):
        return
    if _queue is None:
        _queue = queue.Queue(maxsize=_QUEUE_MAX)
        threading.Thread(target=_writer, args=(_queue, os.environ[ENV_REDIS_URL]), name="baton-facts",
                         daemon=True).start()
    with contextlib.suppress(queue.Full):
        _queue.put_nowait((request_id, field, value))


def _writer(q: queue.Queue[tuple[str, str, Any]], url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    while True:
        request_id, field, value = q.get()
        try:
            key = fact_key(request_id)
            pipe = client.pipeline(transaction=False)
            pipe.hset(key, field, json.dumps(value, separators=(",", ":")))
            pipe.expire(key, TTL_S)
            pipe.execute()
        except Exception as exc:
            log.debug("fact %s of %s not recorded: %s", field, request_id, type(exc).__name__)
