"""Helpers of the e2e modules. The session's stack, its Ray head and the tiny models are fixtures of
:mod:`tests.shared_stack` (``baton_stack``, ``serve_cluster``, ``tiny_model``, ``otlp_receiver``)."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.shared_stack import Metric, ServeCluster, stack_pids

__all__ = ["Metric", "ServeCluster", "chat", "completion", "kv_keys", "stack_pids", "wait_new_keys"]

# Apps of a test's own run on the session stack's Ray head (tests.shared_stack.serve_cluster); their P/D
# deployments take NIXL side-channel ports from NIXL_PORT_BASE.
# The tests use NIXL_PORT_BASE + 0..510 (prefill) and + 2000..2510 (decode). The range stays clear of Ray's
# worker ports (10002-19999), the control plane's deployments (20000-24010, `control.spec.nixl_port_base`),
# the chaos stacks' (24000-29910) and Linux's ephemeral ports (from 32768): a listener there can find its
# port taken by any process's outgoing connection, and the replica then fails to start.
NIXL_PORT_BASE = int(os.environ.get("BATON_E2E_NIXL_PORT_BASE", str(30000 + os.getpid() % 3 * 100)))


def completion(base_url: str, prompt: str | list[int], *, max_tokens: int = 16, **extra) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{base_url}/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def chat(base_url: str, content: str, *, max_tokens: int = 16, **extra) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


@pytest.fixture
def redis_client(baton_stack):  # type: ignore[no-untyped-def]
    """The Redis the session stack's replicas and engines write their request facts to."""
    import redis

    client = redis.Redis.from_url(baton_stack.env["BATON_REDIS__URL"])
    yield client
    client.close()


def kv_keys(client) -> set[bytes]:
    return set(client.scan_iter(match="*kv_bytes", count=1000))


def wait_new_keys(client, before: set[bytes], count: int, timeout_s: float = 60) -> set[bytes]:
    deadline = time.monotonic() + timeout_s
    while True:
        new = kv_keys(client) - before
        if len(new) >= count or time.monotonic() > deadline:
            return new
        time.sleep(0.5)
