from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.core import telemetry as t
from baton.core.settings import TelemetrySettings


def test_spans_reach_the_exporter_and_traceparent_round_trips() -> None:
    exporter = InMemorySpanExporter()
    tracing = t.setup_tracing(TelemetrySettings(), exporter=exporter, batch=False)
    with tracing.tracer.start_as_current_span(t.SPAN_GATEWAY_REQUEST) as root:
        headers: dict[str, str] = {}
        t.inject(headers)
        assert headers["traceparent"] == t.traceparent_of(root)
        ctx = t.context_from_traceparent(headers["traceparent"])
    with tracing.tracer.start_as_current_span(t.SPAN_KV_HANDOFF, context=ctx):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans[t.SPAN_KV_HANDOFF].parent.span_id == spans[t.SPAN_GATEWAY_REQUEST].context.span_id
    assert spans[t.SPAN_KV_HANDOFF].context.trace_id == spans[t.SPAN_GATEWAY_REQUEST].context.trace_id


def test_bad_traceparents_are_ignored() -> None:
    for bad in (None, "", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-zz-yy-01"):
        assert t.context_from_traceparent(bad) is None


def test_unreachable_collector_costs_only_the_spans() -> None:
    tracing = t.setup_tracing(TelemetrySettings(otlp_endpoint="http://127.0.0.1:9"))
    for _ in range(100):
        with tracing.tracer.start_as_current_span("x"):
            pass
    tracing.shutdown()


def test_handoff_attributes_ratio() -> None:
    attrs = t.handoff_attributes(connector="nixl", kv_bytes=2_000_000_000, expected_bytes=None, transfer_ms=2000,
                                 bandwidth_gbps=2.0)
    assert attrs["baton.kv.ideal_ms"] == 1000
    assert attrs["baton.kv.efficiency"] == 0.5
