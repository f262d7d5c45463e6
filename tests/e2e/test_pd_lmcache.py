"""P/D with NIXL and the LMCache tiers together (MultiConnector): the prefill side's KV lands in Redis,
where a fresh engine finds it (what decode-failure recovery stands on)."""

from __future__ import annotations

import contextlib

import pytest

from baton.dataplane.spec import DeploymentSpec

from .conftest import NIXL_PORT_BASE, REDIS_URL, completion, kv_keys, wait_new_keys
from .test_lmcache_tiers import BY_SOURCE, CHUNK
from .test_pd_serving import token_prompt

pytestmark = pytest.mark.e2e

N = 600


def spec(name: str, tiny_model, mode: str) -> DeploymentSpec:
    return DeploymentSpec(
        name=name,
        model={"path": str(tiny_model), "served_name": "tiny"},
        mode=mode,
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
        kv={
            "connector": "nixl" if mode == "pd" else "none",
            "nixl_port_base": NIXL_PORT_BASE,
            "lmcache": {"chunk_size": CHUNK, "local_cpu_gib": 0.25, "redis_url": REDIS_URL},
        },
    )


def test_pd_prefill_kv_reaches_redis_and_a_fresh_engine_loads_it(serve_cluster, tiny_model, redis_client):
    prompt, salt = token_prompt(N, seed=2001), "tenant-c-salt"
    keys0 = kv_keys(redis_client)
    pd_url = serve_cluster.deploy(spec("pdc", tiny_model, "pd"))
    agg_url = None
    try:
        decode = serve_cluster.replica_ids("pdc", "Decode:tiny")
        before = serve_cluster.settled(BY_SOURCE, ReplicaId=decode, source="external_kv_transfer")
        out = completion(pd_url, prompt, cache_salt=salt)["choices"][0]["text"]
        stored = wait_new_keys(redis_client, keys0, N // CHUNK)
        assert len(stored) == N // CHUNK
        serve_cluster.wait_metric(BY_SOURCE, lambda v: v >= before + N, ReplicaId=decode, source="external_kv_transfer")
        assert serve_cluster.settled(BY_SOURCE, ReplicaId=decode, source="local_compute") == 0
        serve_cluster.delete("pdc")

        agg_url = serve_cluster.deploy(spec("pdc-agg", tiny_model, "aggregated"))
        fresh = serve_cluster.replica_ids("pdc-agg", "LLMServer:tiny")
        text = completion(agg_url, prompt, cache_salt=salt)["choices"][0]["text"]
        ext = serve_cluster.wait_metric(
            BY_SOURCE, lambda v: v >= 2 * CHUNK, ReplicaId=fresh, source="external_kv_transfer"
        )
        computed = serve_cluster.settled(BY_SOURCE, ReplicaId=fresh, source="local_compute")
        print(f"fresh engine: external {ext}, computed {computed}")
        assert ext == 2 * CHUNK
        assert computed == N - 2 * CHUNK
        assert text == out
    finally:
        for name in ("pdc", "pdc-agg"):
            with contextlib.suppress(Exception):  # already deleted
                serve_cluster.delete(name)
        for key in kv_keys(redis_client) - keys0:
            redis_client.delete(key, key[: -len(b"kv_bytes")] + b"metadata")
