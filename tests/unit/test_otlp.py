"""Baton's OTLP encoder against OpenTelemetry's: the same request, decoded by the official message classes."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as official_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from baton.core import telemetry as t
from baton.core.otlp import exporter_options, new_exporter, parse_headers
from baton.core.settings import TelemetrySettings


def _spans() -> list:  # type: ignore[type-arg]
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "baton-test", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("baton", "1.2")
    remote = t.context_from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    root = tracer.start_span("gateway.request", context=remote, kind=SpanKind.SERVER, start_time=1_000,
                             attributes={"s": "é text", "b": False, "i": -5, "big": 2**40, "f": 0.25,
                                         "zero": 0, "empty": "", "list": ["a", "b"], "ints": [1, 2]})
    child = tracer.start_span("gateway.auth", context=trace.set_span_in_context(root), start_time=1_100,
                              links=[Link(root.get_span_context(), {"why": "x"})])
    child.add_event("held", {"tokens": 2}, timestamp=1_150)
    child.set_status(Status(StatusCode.ERROR, "broke"))
    child.end(end_time=1_200)
    root.set_status(Status(StatusCode.OK))
    root.end(end_time=2_000)
    other = TracerProvider(resource=Resource.create({"service.name": "other"})).get_tracer("x")
    lone = other.start_span("lone", start_time=5)
    lone.end(end_time=6)
    spans = list(memory.get_finished_spans())
    return [*spans, lone]


class _Collector(BaseHTTPRequestHandler):
    bodies: list[bytes] = []
    status = 200
    required: dict[str, str] = {}  #: headers without which the collector answers 401, as a hosted one does

    def do_POST(self) -> None:
        if any(self.headers.get(k) != v for k, v in type(self).required.items()):
            self.send_response(401)
            self.end_headers()
            return
        length = int(self.headers["content-length"])
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def collector() -> Iterator[str]:
    _Collector.bodies = []
    _Collector.required = {}
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1/traces"
    server.shutdown()


def test_the_exporter_posts_the_batch_and_says_when_the_collector_refuses_it(collector: str) -> None:
    spans = _spans()
    exporter = new_exporter(exporter_options(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector}))
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert ExportTraceServiceRequest.FromString(_Collector.bodies[0]) == official_encode(spans)
    _Collector.status = 400
    try:
        assert exporter.export(spans) is SpanExportResult.FAILURE
    finally:
        _Collector.status = 200
    gone = new_exporter(exporter_options("http://127.0.0.1:9"), timeout_s=0.5)
    assert gone.export(spans) is SpanExportResult.FAILURE


def test_the_standard_otel_variables_name_the_endpoint_headers_and_compression() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otlp.example.com/", "OTEL_EXPORTER_OTLP_HEADERS":
           "x-honeycomb-team=abc%3D1,Authorization=Basic%20dXNlcjpw, junk", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    o = exporter_options(None, env)
    assert o.endpoint == "https://otlp.example.com/v1/traces" and o.compression == "gzip"
    assert o.headers == {"x-honeycomb-team": "abc=1", "authorization": "Basic dXNlcjpw"}
    assert "dXNlcjpw" not in repr(o)  # credentials stay out of logs
    # the signal's own variables first; Baton's setting names the endpoint when set
    traces = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom",
              "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=b"}
    assert exporter_options(None, traces).endpoint == "http://c:4318/custom"
    assert exporter_options(None, traces).headers == {"a": "b"}
    assert exporter_options("http://mine:4318", traces).endpoint == "http://mine:4318/v1/traces"
    assert exporter_options(None, {}).endpoint is None
    assert parse_headers("=x,k=,a=1=2") == {"k": "", "a": "1=2"}
    for bad in ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"}):
        with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP"):
            exporter_options("http://c:4318", bad)


def test_a_collector_that_requires_a_header_gets_the_spans_with_it_gzipped(collector: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """As a hosted tracing backend: without the header 401 and nothing stored; the process's tracing, set up
    from the standard variables alone (no Baton setting), delivers its spans with the header, gzipped."""
    _Collector.required = {"x-api-key": "s3cret"}
    spans = _spans()
    bare = new_exporter(exporter_options(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector}))
    assert bare.export(spans) is SpanExportResult.FAILURE and _Collector.bodies == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    tracing = t.setup_tracing(TelemetrySettings(enabled=True, service_name="baton-test"), batch=False)
    tracing.tracer.start_span("gateway.request").end()
    tracing.shutdown()
    assert len(_Collector.bodies) == 1
    got = ExportTraceServiceRequest.FromString(gzip.decompress(_Collector.bodies[0]))
    assert got.resource_spans[0].scope_spans[0].spans[0].name == "gateway.request"
