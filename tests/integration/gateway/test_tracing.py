"""Gateway spans with the in-memory exporter: tree shape, attributes, no key material, recovery spans,
data-plane facts merged from Redis, and an unreachable collector that costs nothing but spans."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.api.gateway.fact_reader import FactMerger
from baton.api.gateway.metering import Outcome
from baton.core import telemetry as t
from baton.core.contracts import (
    ENV_FACTS_REDIS_URL,
    HandoffFact,
    KvLoadFailedFact,
    KvTransferFact,
    RecoveryStep,
    RecoveryStepsFact,
    RequestFacts,
    fact_key,
)
from baton.core.settings import Settings, TelemetrySettings
from tests.integration.gateway.conftest import Catalogue, MakeTenant, request_rows, serve, wait_for

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def tracing(exporter: InMemorySpanExporter) -> t.Tracing:
    return t.setup_tracing(TelemetrySettings(), exporter=exporter, batch=False)


@pytest.fixture(scope="module")
def traced_url(gw_settings: Settings, tracing: t.Tracing) -> Iterator[str]:
    from baton.api.app import create_app

    with serve(create_app(gw_settings, optional_routers=(), tracing=tracing)) as url:
        yield url


def _spans(exporter: InMemorySpanExporter, trace_id: str) -> dict[str, object]:
    return {s.name: s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id}


def test_one_tree_per_request_under_the_clients_trace(
    traced_url: str, stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant, exporter: InMemorySpanExporter,
    tracing: t.Tracing, monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[str] = []
    start_span = tracing.tracer.start_span

    def counted(name: str, *args: object, **kwargs: object) -> object:
        started.append(name)
        return start_span(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tracing.tracer, "start_span", counted)
    key = make_tenant([catalogue.big])
    for stream in (False, True):
        exporter.clear()
        started.clear()
        resp = httpx.post(f"{traced_url}/v1/chat/completions", timeout=30, headers={
            **key.headers, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            json={"model": catalogue.big, "messages": [{"role": "user", "content": "secret prompt text"}],
                  "stream": stream, "max_tokens": 3})
        assert resp.status_code == 200, resp.text
        if stream:
            assert b"[DONE]" in resp.content
        spans = wait_for(lambda: (s := _spans(exporter, CLIENT_TRACE)) and t.SPAN_GATEWAY_REQUEST in s and s)
        root = spans[t.SPAN_GATEWAY_REQUEST]
        assert f"{root.parent.span_id:016x}" == CLIENT_SPAN  # a child of the client's span
        for name in (t.SPAN_GATEWAY_AUTH, t.SPAN_GATEWAY_RATELIMIT):
            assert spans[name].parent.span_id == root.context.span_id
            assert root.start_time <= spans[name].start_time <= spans[name].end_time <= root.end_time
        assert started == [t.SPAN_GATEWAY_REQUEST]  # the children were written finished, never started live
        attrs = dict(root.attributes)
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs[t.ATTR_MODEL] == catalogue.big
        assert attrs[t.ATTR_TENANT] == str(key.tenant_id)
        assert attrs["baton.api_key_id"] == str(key.key_id)
        assert attrs[t.ATTR_INPUT_TOKENS] > 0 and attrs[t.ATTR_OUTPUT_TOKENS] > 0
        assert attrs["baton.request_id"] == resp.headers["x-request-id"]
        # The upstream continues the trace from the gateway's span.
        sent = httpx.get(f"{stub_url}/_last").json()["headers"]["traceparent"]
        assert sent == f"00-{CLIENT_TRACE}-{root.context.span_id:016x}-01"
        # Never key material or prompt text in any span.
        dumped = json.dumps([dict(s.attributes) for s in spans.values()])
        assert key.secret not in dumped and key.secret[:16] not in dumped and "secret prompt" not in dumped


def test_a_request_without_traceparent_gets_a_root_span_and_its_record_the_trace_id(
    traced_url: str, catalogue: Catalogue, make_tenant: MakeTenant, exporter: InMemorySpanExporter, db,
) -> None:
    from baton.core import models as m

    key = make_tenant([catalogue.big])
    exporter.clear()
    resp = httpx.post(f"{traced_url}/v1/completions", headers=key.headers, timeout=30,
                      json={"model": catalogue.big, "prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 200
    roots = wait_for(lambda: [s for s in exporter.get_finished_spans() if s.name == t.SPAN_GATEWAY_REQUEST])
    assert roots[0].parent is None
    assert dict(roots[0].attributes)["gen_ai.operation.name"] == "text_completion"
    rid = uuid.UUID(resp.headers["x-request-id"].removeprefix("req-"))

    def record():  # type: ignore[no-untyped-def]
        with db.tenant(key.tenant_id) as uow:
            rec = uow.session.get(m.RequestRecord, rid)
            return rec and rec.trace_id

    assert wait_for(record) == f"{roots[0].context.trace_id:032x}"


def test_a_rate_limited_request_is_traced_as_refused(
    traced_url: str, catalogue: Catalogue, make_tenant: MakeTenant, exporter: InMemorySpanExporter,
) -> None:
    key = make_tenant([catalogue.big], tenant_limits={"rpm": 1})
    body = {"model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    url = f"{traced_url}/v1/chat/completions"
    assert httpx.post(url, headers=key.headers, json=body, timeout=30).status_code == 200
    exporter.clear()
    assert httpx.post(url, headers=key.headers, json=body, timeout=30).status_code == 429
    root = wait_for(lambda: [s for s in exporter.get_finished_spans() if s.name == t.SPAN_GATEWAY_REQUEST])[0]
    assert root.attributes["http.response.status_code"] == 429
    rl = next(s for s in exporter.get_finished_spans() if s.name == t.SPAN_GATEWAY_RATELIMIT)
    assert rl.attributes["baton.ratelimit.allowed"] is False


def test_an_unreachable_collector_costs_only_the_spans(
    gw_settings: Settings, catalogue: Catalogue, make_tenant: MakeTenant,
) -> None:
    from baton.api.app import create_app

    settings = gw_settings.model_copy(update={"telemetry": TelemetrySettings(otlp_endpoint="http://127.0.0.1:9")})
    key = make_tenant([catalogue.big])
    with serve(create_app(settings, optional_routers=())) as url:
        for stream in (False, True, False):
            resp = httpx.post(f"{url}/v1/chat/completions", headers=key.headers, timeout=30, json={
                "model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "stream": stream,
                "max_tokens": 2})
            assert resp.status_code == 200


def test_a_sample_ratio_of_zero_records_only_traces_a_caller_sampled(
    gw_settings: Settings, stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant, db,
) -> None:
    """``telemetry.sample_ratio = 0``: a new trace is not recorded (its id still reaches the engine, unsampled,
    and the request record); a caller's sampled ``traceparent`` is followed and recorded."""
    from baton.api.app import create_app

    memory = InMemorySpanExporter()
    tracing = t.setup_tracing(TelemetrySettings(sample_ratio=0.0), exporter=memory, batch=False)
    key = make_tenant([catalogue.big])
    body = {"model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    with serve(create_app(gw_settings, optional_routers=(), tracing=tracing)) as url:
        resp = httpx.post(f"{url}/v1/chat/completions", headers=key.headers, json=body, timeout=30)
        assert resp.status_code == 200
        sent = httpx.get(f"{stub_url}/_last").json()["headers"]["traceparent"]
        assert sent.endswith("-00") and memory.get_finished_spans() == ()
        rid = uuid.UUID(resp.headers["x-request-id"].removeprefix("req-"))
        record = wait_for(lambda: next((r for r in request_rows(db, key.tenant_id) if r.id == rid), None))
        assert record.trace_id == sent[3:35]
        resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30,
                          headers={**key.headers, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        assert resp.status_code == 200
        spans = wait_for(lambda: _spans(memory, CLIENT_TRACE))
        assert {t.SPAN_GATEWAY_REQUEST, t.SPAN_GATEWAY_AUTH, t.SPAN_GATEWAY_RATELIMIT} <= set(spans)


def _outcome(**kw: object) -> Outcome:
    return Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model="m", endpoint="completions",
                   stream=True, started=time.time(), start_pc=time.perf_counter(), **kw)  # type: ignore[arg-type]


def test_recovery_steps_become_spans_in_the_requests_trace() -> None:
    """A scripted outcome (gateway-side steps) and data-plane steps merged from facts."""
    from baton.api.gateway import spans as gw_spans

    exporter = InMemorySpanExporter()
    tracing = t.setup_tracing(TelemetrySettings(), exporter=exporter, batch=False)
    o = _outcome(deployment="d")
    span = gw_spans.start_request(tracing.tracer, traceparent=None, start_ns=int(o.started * 1e9),
                                    request_id=o.request_id.hex, endpoint="completions", model="m",
                                    tenant_id=o.tenant_id, key_id=None, stream=True)
    o.trace_id, o.span_id = f"{span.get_span_context().trace_id:032x}", f"{span.get_span_context().span_id:016x}"
    o.recovery_steps.append({"step": "decode_resume", "at_ms": 40.0, "duration_ms": 12.5, "outcome": "recovered",
                             "detail": "upstream RemoteProtocolError"})
    o.end_pc = o.start_pc + 0.1
    gw_spans.finish_request(tracing.tracer, span, o)
    FactMerger(None, tracing.tracer).merge(o, RequestFacts.of([
        HandoffFact(connector="nixl", kv_bytes=131072, transfer_ms=3.5, prompt_tokens=100),
        RecoveryStepsFact((RecoveryStep("prefill_retry", 5, 20, "recovered", "prefill replica died"),)),
        # the decode engine's KV pull failed 30 ms in, after 4 ms of waiting: it recomputed the prompt
        KvLoadFailedFact(connector="nixl", blocks=2, wait_ms=4.0, t_unix=o.started + 0.030)]))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans[t.SPAN_GATEWAY_REQUEST]
    for name, at, dur in (("recovery.decode_resume", 40.0, 12.5), ("recovery.prefill_retry", 5, 20),
                          ("recovery.kv_recompute", 30.0, 4.0)):
        s = spans[name]
        assert s.context.trace_id == root.context.trace_id and s.parent.span_id == root.context.span_id
        assert s.start_time == root.start_time + int(at * 1e6)
        assert s.end_time - s.start_time == int(dur * 1e6)
    assert (o.kv_bytes, o.handoff_ms) == (131072, 3.5)
    assert [s["step"] for s in o.rows()[1]["recovery_steps"]] == ["decode_resume", "prefill_retry", "kv_recompute"]


def test_facts_written_by_the_data_plane_reach_the_outcome(settings: Settings) -> None:
    import asyncio

    asyncio.run(_facts_round_trip(settings))


@contextlib.asynccontextmanager
async def _facts_to(url: str) -> AsyncIterator[None]:
    """The data plane's fact writer pointed at ``url`` for the block (one client, closed after)."""
    from baton.dataplane import facts

    os.environ[ENV_FACTS_REDIS_URL] = url
    facts._client = None
    try:
        yield
    finally:
        del os.environ[ENV_FACTS_REDIS_URL]
        if facts._client is not None:
            await facts._client.aclose()
        facts._client = None


async def _facts_round_trip(settings: Settings) -> None:
    import asyncio

    import redis.asyncio as aioredis

    from baton.dataplane import facts

    o = _outcome(deployment="tiny-pd")
    async with _facts_to(settings.redis.url):
        await facts.record_fact(f"req-{o.request_id.hex}", HandoffFact(kv_bytes=7, transfer_ms=1.25))
        red = aioredis.Redis.from_url(settings.redis.url)
        assert await red.ttl(fact_key(o.request_id.hex)) > 0
        await FactMerger(red)([o])
        await red.aclose()
    assert (o.kv_bytes, o.handoff_ms, o.facts_merged) == (7, 1.25, True)
    # The decode engine's own measurement (posted from its busy loop through a writer thread) wins.
    o2 = _outcome(deployment="tiny-pd")
    async with _facts_to(settings.redis.url):
        await facts.record_fact(f"req-{o2.request_id.hex}", HandoffFact(kv_bytes=8192, transfer_ms=9.0))
        facts.post_fact(f"req-{o2.request_id.hex}", KvTransferFact(kv_bytes=8000, transfer_ms=0.75))
        red = aioredis.Redis.from_url(settings.redis.url)
        for _ in range(100):  # the writer thread is asynchronous by design
            if await red.hexists(fact_key(o2.request_id.hex), "kv_transfer"):
                break
            await asyncio.sleep(0.05)
        await FactMerger(red)([o2])
        await red.aclose()
    assert (o2.kv_bytes, o2.handoff_ms) == (8000, 0.75)
    # A static route (no deployment name; the chaos harness's gateway, a k8s route by URL) to a P/D
    # deployment: the decode server's recovery steps still reach the record.
    o3 = _outcome(deployment=None)
    async with _facts_to(settings.redis.url):
        await facts.record_fact(f"req-{o3.request_id.hex}", RecoveryStepsFact(
            (RecoveryStep("local_prefill", 1.0, 30.0, "recovered", "x"),)))
        red = aioredis.Redis.from_url(settings.redis.url)
        await FactMerger(red)([o3])
        await red.aclose()
    assert [(s["step"], s["source"]) for s in o3.recovery_steps] == [("local_prefill", "dataplane")]
    # Redis unreachable: no facts, no error.
    down = aioredis.Redis.from_url("redis://127.0.0.1:9", socket_connect_timeout=0.2)
    await FactMerger(down)([_outcome(deployment="x")])
    await facts.record_fact("req-x", HandoffFact())  # no URL configured: nothing, no error
