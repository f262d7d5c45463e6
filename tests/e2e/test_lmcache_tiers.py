"""LMCache tiers on CPU engines: KV stored in Redis by one engine is loaded by another, per tenant."""

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


def spec(name: str, tiny_model) -> DeploymentSpec:
    return DeploymentSpec(
        name=name,
        model={"path": str(tiny_model), "served_name": "tiny"},
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
        kv={"lmcache": {"chunk_size": CHUNK, "local_cpu_gib": 0.25, "redis_url": REDIS_URL}},
    )


def test_redis_tier_shared_across_engines_and_separated_by_tenant(serve_cluster, tiny_model, redis_client):
    p_prompt, q_prompt = token_prompt(N, seed=1001), token_prompt(N, seed=1002)
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

        # Corrupting the stored KV changes what B generates from it: the tier is really read.
        for key in q_keys:
            size = redis_client.strlen(key)
            redis_client.set(key, os.urandom(size))
        text, delta = on_b(q_prompt, salt_a)
        print("engine B, corrupted tier:", delta)
        assert delta["external_kv_transfer"] == 2 * CHUNK
        assert text != out_q
    finally:
        serve_cluster.delete("cache-a")
        if b_url is not None:
            serve_cluster.delete("cache-b")
        for key in kv_keys(redis_client) - keys0:
            redis_client.delete(key, key[: -len(b"kv_bytes")] + b"metadata")
