"""LMCache tiers on CPU engines: KV stored in Redis by one engine is loaded by another, per tenant, and KV
that changed in the tier is never decoded on: it is recomputed and the failure is counted."""

from __future__ import annotations

import os

import pytest

from baton.dataplane.kv_connector import tenant_tag
from baton.dataplane.spec import DeploymentSpec

from .conftest import REDIS_URL, completion, kv_keys, wait_new_keys
from .test_pd_serving import token_prompt

pytestmark = pytest.mark.e2e

CHUNK = 256
N = 600  # two whole chunks (512 tokens) are stored, the 88-token tail is not
BY_SOURCE = "ray_vllm_prompt_tokens_by_source_total"
INTEGRITY = "ray_baton_kv_integrity_failures_total"


def spec(name: str, tiny_model) -> DeploymentSpec:
    return DeploymentSpec(
        name=name,
        model={"path": str(tiny_model), "served_name": "tiny"},
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
        kv={"lmcache": {"chunk_size": CHUNK, "local_cpu_gib": 0.25, "redis_url": REDIS_URL}},
    )


def test_redis_tier_shared_across_engines_and_separated_by_tenant(serve_cluster, tiny_model, redis_client):
    p_prompt, q_prompt, r_prompt = token_prompt(N, seed=1001), token_prompt(N, seed=1002), token_prompt(N, seed=1003)
    salt_a, salt_b = "tenant-a-salt", "tenant-b-salt"

    keys0 = kv_keys(redis_client)
    a_url = serve_cluster.deploy(spec("cache-a", tiny_model))
    b_url = None
    try:
        out_p = completion(a_url, p_prompt, cache_salt=salt_a)["choices"][0]["text"]
        p_keys = wait_new_keys(redis_client, keys0, N // CHUNK)
        out_q = completion(a_url, q_prompt, cache_salt=salt_a)["choices"][0]["text"]
        q_keys = wait_new_keys(redis_client, keys0 | p_keys, N // CHUNK)
        assert len(p_keys) == N // CHUNK and len(q_keys) == N // CHUNK
        # r's chunks one at a time, so the test knows which entry holds its second chunk.
        completion(a_url, r_prompt[: CHUNK + 44], cache_salt=salt_a)
        (r_first,) = wait_new_keys(redis_client, keys0 | p_keys | q_keys, 1)
        out_r = completion(a_url, r_prompt, cache_salt=salt_a)["choices"][0]["text"]
        (r_second,) = wait_new_keys(redis_client, keys0 | p_keys | q_keys | {r_first}, 1)
        # Keys carry the tenant's tag (a digest of the salt, never the salt itself).
        assert all(tenant_tag(salt_a).encode() in k for k in p_keys | q_keys)
        assert not any(salt_a.encode() in k for k in p_keys | q_keys)

        # A fresh engine (empty local tiers, empty prefix cache) loads the prefix from Redis.
        b_url = serve_cluster.deploy(spec("cache-b", tiny_model))
        b = serve_cluster.replica_ids("cache-b", "LLMServer:tiny")
        a = serve_cluster.replica_ids("cache-a", "LLMServer:tiny")
        assert len(b) == 1 and len(a) == 1

        def b_counts() -> dict[str, float]:
            serve_cluster.settled(BY_SOURCE)
            return {
                src: serve_cluster.metric_sum(BY_SOURCE, ReplicaId=b, source=src)
                for src in ("local_compute", "external_kv_transfer", "local_cache_hit")
            }

        def on_b(prompt, salt) -> tuple[str, dict[str, float]]:
            before = b_counts()
            text = completion(b_url, prompt, cache_salt=salt)["choices"][0]["text"]
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
    finally:
        serve_cluster.delete("cache-a")
        if b_url is not None:
            serve_cluster.delete("cache-b")
        for key in kv_keys(redis_client) - keys0:
            redis_client.delete(key, key[: -len(b"kv_bytes")] + b"metadata")
