"""An OTLP/HTTP trace receiver in the benchmark's (or a test's) own process: every span the gateway,
the replicas and the engines export, flattened to dicts, so a run can be attributed hop by hop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Spans received over OTLP/HTTP (protobuf): name, trace and span ids, parent, attributes, service,
    start and end (ns since the epoch)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
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
                        attrs: dict[str, Any] = {}
                        for a in s.attributes:
                            v = a.value
                            kind = v.WhichOneof("value")
                            attrs[a.key] = getattr(v, kind) if kind else None
                        self.spans.append({"name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                                           "parent": s.parent_span_id.hex(), "attrs": attrs, "service": service,
                                           "start": s.start_time_unix_nano, "end": s.end_time_unix_nano})

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace"] == trace_id]

    def by_trace(self, trace_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {t: [] for t in trace_ids}
        with self.lock:
            for s in self.spans:
                if s["trace"] in out:
                    out[s["trace"]].append(s)
        return out

    def settle(self, *, quiet_s: float = 6.0, timeout_s: float = 60.0) -> int:
        """Waits until no span arrived for ``quiet_s`` (batch exporters flush every few seconds)."""
        deadline = time.monotonic() + timeout_s
        count = len(self.spans)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = len(self.spans)
            if now == count:
                break
            count = now
        return count


@contextmanager
def receiver() -> Iterator[tuple[str, Receiver]]:
    """``(endpoint, receiver)``: an OTLP/HTTP endpoint on a free loopback port, for as long as the block."""
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
