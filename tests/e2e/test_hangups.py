"""A client that hangs up mid-stream stops the engines' work, on the path that ships: the official client
through the gateway, Serve's HAProxy and the decode replica of the session stack's P/D deployment.

The decode engine's own counter of generated tokens says how far the stream ran after the hang-up; a
stream the engine kept decoding would run to its ``max_tokens``. Several hang-ups at different points of
the stream, since a cancellation lost only sometimes (one that waits on the garbage collector to close
an abandoned generator) would pass one try."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.e2e

GENERATED = "ray_vllm_generation_tokens_total"
RUNNING = "ray_vllm_num_requests_running"
MAX_TOKENS = 1000


def test_a_hang_up_through_the_gateway_stops_the_decode_engine(baton_stack, serve_cluster) -> None:  # type: ignore[no-untyped-def]
    decode = serve_cluster.replica_ids(baton_stack.deployment, f"Decode:{baton_stack.model}")
    assert decode
    client = openai.OpenAI(base_url=f"{baton_stack.gateway_url}/v1", api_key=baton_stack.api_key, max_retries=0)
    ran = []
    for i, chunks in enumerate((3, 8, 13)):
        before = serve_cluster.settled(GENERATED, ReplicaId=decode)
        stream = client.completions.create(model=baton_stack.model, prompt=f"Hang-up {i}: tell me a long story.",
                                           max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        seen = 0
        for _ in stream:
            seen += 1
            if seen >= chunks:
                break
        stream.close()  # the client hangs up
        assert seen == chunks
        assert serve_cluster.wait_metric(RUNNING, lambda v: v == 0, timeout_s=60, ReplicaId=decode) == 0
        ran.append(serve_cluster.settled(GENERATED, ReplicaId=decode) - before)
    print(f"tokens the decode engine generated per hang-up: {ran} (max_tokens {MAX_TOKENS})")
    assert all(0 < n < MAX_TOKENS / 2 for n in ran), ran
