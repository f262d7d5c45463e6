"""LMCache tiers on CPU engines: KV stored in Redis by one engine is loaded by another, per tenant, and KV
that changed in the tier is never decoded on: it is recomputed and the failure is counted.

The engine that stores is the session stack's P/D deployment (NIXL and the LMCache tiers together,
MultiConnector: its prefill side's KV lands in Redis, what decode-failure recovery stands on); the one
that loads is a fresh aggregated engine of this module's own beside it, on the same Redis tier."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pytest

from baton.dataplane.kv_connector import tenant_tag
from baton.dataplane.spec import DeploymentSpec
from tests.engine_slots import slots_fixture

from .conftest import completion, kv_keys, wait_new_keys
from .test_pd_serving import token_prompt

pytestmark = pytest.mark.e2e

CHUNK = 256
N = 600  # two whole chunks (512 tokens) are stored, the 88-token tail is not
BY_SOURCE = "ray_vllm_prompt_tokens_by_source_total"
INTEGRITY = "ray_baton_kv_integrity_failures_total"


@dataclass
class Engines:
    a_url: str  # the stack's P/D deployment (stores)
    b_url: str  # a fresh aggregated engine (loads)
    b: set[str]  # its replica id (labels its metrics)
    decode: set[str]  # the P/D deployment's decode replica
    model: str


engine_room = slots_fixture(1)  # the loading engine beside the shared stack (tests/engine_slots.py)


@pytest.fixture(scope="module")
def engines(engine_room, baton_stack, serve_cluster) -> Iterator[Engines]:  # type: ignore[no-untyped-def]
    stack = baton_stack
    spec = DeploymentSpec(  # the stack's model and LMCache settings: B finds what A stored
        name="cache-b",
        model={"path": str(stack.model_dir.resolve()), "served_name": stack.model},
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
        kv={"lmcache": {"chunk_size": CHUNK, "local_cpu_gib": 0.25, "redis_url": stack.lmcache_tier.url}},
    )
    b_url = serve_cluster.deploy(spec)
    try:
        yield Engines(a_url=stack.app_url(stack.deployment), b_url=b_url,
                      b=serve_cluster.replica_ids("cache-b", f"LLMServer:{stack.model}"),
                      decode=serve_cluster.replica_ids(stack.deployment, f"Decode:{stack.model}"), model=stack.model)
    finally:
        serve_cluster.delete("cache-b")


@pytest.fixture
def redis_client(baton_stack):  # type: ignore[no-untyped-def]
    """The LMCache tier's Redis (the stack's own redis-server); entries a test added are removed after it."""
    import redis

    client = redis.Redis.from_url(baton_stack.lmcache_tier.url)
    keys0 = kv_keys(client)
    yield client
    for key in kv_keys(client) - keys0:
        client.delete(key, key[: -len(b"kv_bytes")] + b"metadata")
    client.close()


def test_pd_prefill_kv_reaches_redis_and_a_fresh_engine_loads_it(engines, serve_cluster, redis_client):
    prompt, salt = token_prompt(N, seed=2001), "tenant-c-salt"
    on = partial(completion, model=engines.model, cache_salt=salt)
    keys0 = kv_keys(redis_client)
    ext0 = serve_cluster.settled(BY_SOURCE, ReplicaId=engines.decode, source="external_kv_transfer")
    computed0 = serve_cluster.settled(BY_SOURCE, ReplicaId=engines.decode, source="local_compute")
    out = on(engines.a_url, prompt)["choices"][0]["text"]
    stored = wait_new_keys(redis_client, keys0, N // CHUNK)
    assert len(stored) == N // CHUNK
    serve_cluster.wait_metric(BY_SOURCE, lambda v: v >= ext0 + N, ReplicaId=engines.decode,
                              source="external_kv_transfer")
    # the decode engine computed none of it: the prompt's KV came over NIXL
    assert serve_cluster.settled(BY_SOURCE, ReplicaId=engines.decode, source="local_compute") == computed0

    before = {src: serve_cluster.settled(BY_SOURCE, ReplicaId=engines.b, source=src)
              for src in ("external_kv_transfer", "local_compute")}
    text = on(engines.b_url, prompt)["choices"][0]["text"]
    ext = serve_cluster.wait_metric(BY_SOURCE, lambda v: v >= before["external_kv_transfer"] + 2 * CHUNK,
                                    ReplicaId=engines.b, source="external_kv_transfer") - before["external_kv_transfer"]
    computed = serve_cluster.settled(BY_SOURCE, ReplicaId=engines.b, source="local_compute") - before["local_compute"]
    print(f"fresh engine: external {ext}, computed {computed}")
    assert ext == 2 * CHUNK
    assert computed == N - 2 * CHUNK
    assert text == out


def test_redis_tier_shared_across_engines_and_separated_by_tenant(engines, serve_cluster, redis_client):
    p_prompt, q_prompt, r_prompt = token_prompt(N, seed=1001), token_prompt(N, seed=1002), token_prompt(N, seed=1003)
    salt_a, salt_b = "tenant-a-salt", "tenant-b-salt"
    completion_ = partial(completion, model=engines.model)
    a_url, b_url, b = engines.a_url, engines.b_url, engines.b

    keys0 = kv_keys(redis_client)
    out_p = completion_(a_url, p_prompt, cache_salt=salt_a)["choices"][0]["text"]
    p_keys = wait_new_keys(redis_client, keys0, N // CHUNK)
    out_q = completion_(a_url, q_prompt, cache_salt=salt_a)["choices"][0]["text"]
    q_keys = wait_new_keys(redis_client, keys0 | p_keys, N // CHUNK)
    assert len(p_keys) == N // CHUNK and len(q_keys) == N // CHUNK
    # r's chunks one at a time, so the test knows which entry holds its second chunk.
    completion_(a_url, r_prompt[: CHUNK + 44], cache_salt=salt_a)
    (r_first,) = wait_new_keys(redis_client, keys0 | p_keys | q_keys, 1)
    out_r = completion_(a_url, r_prompt, cache_salt=salt_a)["choices"][0]["text"]
    (r_second,) = wait_new_keys(redis_client, keys0 | p_keys | q_keys | {r_first}, 1)
    # Keys carry the tenant's tag (a digest of the salt, never the salt itself).
    assert all(tenant_tag(salt_a).encode() in k for k in p_keys | q_keys)
    assert not any(salt_a.encode() in k for k in p_keys | q_keys)

    # A fresh engine (empty local tiers, empty prefix cache) loads the prefix from Redis.
    assert len(b) == 1

    def b_counts() -> dict[str, float]:
        serve_cluster.settled(BY_SOURCE)
        return {
            src: serve_cluster.metric_sum(BY_SOURCE, ReplicaId=b, source=src)
            for src in ("local_compute", "external_kv_transfer", "local_cache_hit")
        }

    def on_b(prompt, salt) -> tuple[str, dict[str, float]]:
        before = b_counts()
        text = completion_(b_url, prompt, cache_salt=salt)["choices"][0]["text"]
        serve_cluster.wait_metric(BY_SOURCE, lambda v: v >= sum(before.values()) + N, ReplicaId=b)
        after = b_counts()
        return text, {k: after[k] - before[k] for k in before}

    text, delta = on_b(p_prompt, salt_a)
    print("engine B, same tenant:", delta)
    assert text == out_p
    assert delta["external_kv_transfer"] == 2 * CHUNK
    assert delta["local_compute"] == N - 2 * CHUNK

    # Same prefix under another tenant's salt: no tier hit, the whole prompt is computed.
    text, delta = on_b(p_prompt, salt_b)
    print("engine B, other tenant:", delta)
    assert text == out_p
    assert delta["external_kv_transfer"] == 0
    assert delta["local_compute"] == N

    tag_a = tenant_tag(salt_a)

    def failures() -> float:
        return serve_cluster.metric_sum(INTEGRITY, ReplicaId=b, tenant_tag=tag_a)

    def failed(after: float) -> float:
        serve_cluster.wait_metric(INTEGRITY, lambda v: v >= after, ReplicaId=b, tenant_tag=tag_a)
        return serve_cluster.settled(INTEGRITY, ReplicaId=b, tenant_tag=tag_a)

    # One byte changed in the second chunk of r: that chunk is a miss (recomputed), the first still loads.
    value = bytearray(redis_client.get(r_second))
    value[-1] ^= 0x01
    redis_client.set(r_second, bytes(value))
    before = failures()
    text, delta = on_b(r_prompt, salt_a)
    print("engine B, one byte changed in chunk 2:", delta)
    assert text == out_r
    assert delta["external_kv_transfer"] == CHUNK
    assert delta["local_compute"] == N - CHUNK
    assert failed(before + 1) == before + 1
    # The damaged entry is gone: removed from the tier, and stored again from the recomputed KV.
    assert redis_client.get(r_second) != bytes(value)

    # Random bytes over both chunks of q: nothing loads, the whole prompt is recomputed, same output.
    for key in q_keys:
        size = redis_client.strlen(key)
        redis_client.set(key, os.urandom(size))
    before = failures()
    text, delta = on_b(q_prompt, salt_a)
    print("engine B, corrupted tier:", delta)
    assert text == out_q
    assert delta["external_kv_transfer"] == 0
    assert delta["local_compute"] == N
    assert failed(before + len(q_keys)) == before + len(q_keys)
