"""The decode server's spans of one request (:func:`baton.dataplane.tracing.begin`): one tree, under the
caller's span when the request carries a ``traceparent``, under a ``dataplane.request`` root of its own
when it does not (a replica's warm-up, a direct call of the Serve app)."""

from __future__ import annotations

from types import SimpleNamespace

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.core import telemetry as t
from baton.dataplane import tracing as dp_tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"



def _request(headers: dict[str, str]) -> None:
    rt = dp_tracing.begin(SimpleNamespace(headers=headers), replica="r1")
    assert rt is not None
    rt.start_prefill(SimpleNamespace(kv_transfer_params={}))
    rt.end_prefill(SimpleNamespace(), 300, 3)
    rt.start_decode(SimpleNamespace(kv_transfer_params={}), {"prompt_tokens": 300, "remote_blocks": 3})
    rt.chunk({"choices": [{"text": "a"}]})
    rt.finish(None)


def test_a_request_without_a_traceparent_is_one_tree_under_its_own_root(spans: InMemorySpanExporter) -> None:
    _request({"x-request-id": "baton-warmup-abc"})
    got = {s.name: s for s in spans.get_finished_spans()}
    root = got[t.SPAN_DATAPLANE_REQUEST]
    assert root.parent is None and root.attributes[t.ATTR_REQUEST_ID] == "baton-warmup-abc"
    for name in (t.SPAN_PREFILL, t.SPAN_DECODE, t.SPAN_KV_HANDOFF):
        assert got[name].context.trace_id == root.context.trace_id, name
    assert got[t.SPAN_PREFILL].parent.span_id == root.context.span_id
    assert got[t.SPAN_DECODE].parent.span_id == root.context.span_id
    assert got[t.SPAN_KV_HANDOFF].parent.span_id == got[t.SPAN_DECODE].context.span_id


def test_a_request_with_a_traceparent_joins_the_callers_trace(spans: InMemorySpanExporter) -> None:
    _request({"traceparent": f"00-{TRACE}-{PARENT}-01", "x-request-id": "feedface"})
    got = {s.name: s for s in spans.get_finished_spans()}
    assert t.SPAN_DATAPLANE_REQUEST not in got
    assert {format(s.context.trace_id, "032x") for s in got.values()} == {TRACE}
    assert format(got[t.SPAN_DECODE].parent.span_id, "016x") == PARENT
    assert got[t.SPAN_DECODE].attributes[t.ATTR_REQUEST_ID] == "feedface"
