"""Decode-failure recovery on the real P/D stack (Ray Serve LLM, vLLM, NIXL): the decode replica is
SIGKILLed (with its engine) mid-stream; the gateway's resume logic waits out Ray's replacement of the
replica and continues the stream; the client's text equals the undisturbed greedy run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.api.gateway import tracing as gw_tracing
from baton.api.gateway.resume import ResumePolicy
from baton.bench.recovery import relay_stream
from baton.core import models as m
from baton.core import telemetry as t
from baton.dataplane.spec import DeploymentSpec

from .conftest import NIXL_PORT_BASE

pytestmark = pytest.mark.e2e

APP = "rec"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 20}],
        "max_tokens": 96, "temperature": 0}


def replica_family(title: str) -> list:  # type: ignore[type-arg]
    """Every process whose title names the replica, and their children (the vLLM engine)."""
    psutil = pytest.importorskip("psutil")
    family = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(title in part for part in proc.info["cmdline"] or []):
                family += [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return family


def kill(family: list) -> list[int]:  # type: ignore[type-arg]
    """SIGKILL, at once: the processes were found before the stream started, so the kill lands mid-stream."""
    psutil = pytest.importorskip("psutil")
    killed = []
    for p in family:
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            os.kill(p.pid, signal.SIGKILL)
            killed.append(p.pid)
    return killed


def test_a_killed_decode_replica_does_not_break_the_clients_stream(serve_cluster, tiny_model, otlp_receiver):
    endpoint, received = otlp_receiver
    spec = DeploymentSpec(name=APP, model={"path": str(tiny_model), "served_name": "tiny"}, mode="pd",
                          engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
                          kv={"connector": "nixl", "nixl_port_base": NIXL_PORT_BASE + 300},
                          telemetry={"otlp_endpoint": endpoint})
    url = serve_cluster.deploy(spec)
    try:
        baseline = asyncio.run(relay_stream(lambda: url, "chat/completions", CHAT))
        assert baseline.outcome.status is m.RequestStatus.COMPLETED and baseline.outcome.recovery_steps == []
        assert baseline.outcome.completion_tokens == 96

        # The gateway's side of the trace, as the gateway writes it: a root span, the request's traceparent
        # sent upstream on every attempt, recovery steps as spans when the outcome is final.
        gateway_spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(gateway_spans))
        tracer = provider.get_tracer("baton.gateway")
        root = gw_tracing.start_request(tracer, traceparent=None, start_ns=time.time_ns(), request_id="e2e",
                                        endpoint="chat/completions", model="tiny", tenant_id=uuid.uuid4(),
                                        key_id=None, stream=True)
        trace_id = f"{root.get_span_context().trace_id:032x}"

        killed: list[int] = []
        family = replica_family(f"ServeReplica:{APP}:Decode")
        run = asyncio.run(relay_stream(
            lambda: url, "chat/completions", CHAT, kill_after=2,
            kill=lambda: killed.extend(kill(family)),
            policy=ResumePolicy(attempts=200, budget_s=400, backoff_s=0.5, backoff_max_s=2.0),
            headers={"traceparent": t.traceparent_of(root)}))
        gw_tracing.finish_request(tracer, root, run.outcome)
        print(f"killed {killed}; recovery {run.recovery_ms:.0f} ms; steps {run.outcome.recovery_steps}")
        assert killed, "no decode replica process found"
        o = run.outcome
        assert o.status is m.RequestStatus.COMPLETED, run.raw[-500:]
        assert run.text == baseline.text  # no token lost, repeated or reordered
        assert o.completion_tokens == 96 and o.prompt_tokens == baseline.outcome.prompt_tokens
        assert b"event: error" not in run.raw and run.raw.count(b"[DONE]") == 1
        finishes = [c["finish_reason"] for ev in run.events for c in ev["choices"] if c.get("finish_reason")]
        assert finishes == ["length"] and len({ev["id"] for ev in run.events}) == 1
        assert run.events[-1]["usage"]["completion_tokens"] == 96
        assert o.recovery_steps and o.recovery_steps[-1]["step"] == "decode_resume"
        assert o.recovery_steps[-1]["outcome"] == "recovered"

        # One trace: the recovery step below the request's root, and the resumed attempt's data-plane
        # spans (prefill, KV handoff, decode on the replacement replica) in the same trace.
        gw = {s.name: s for s in gateway_spans.get_finished_spans()}
        resume = gw["recovery.decode_resume"]
        assert resume.parent is not None and resume.parent.span_id == root.get_span_context().span_id
        assert resume.context.trace_id == root.get_span_context().trace_id
        assert resume.attributes["baton.recovery.outcome"] == "recovered"
        kill_ns = int(run.outcome.started * 1e9 + (run.kill_pc - run.outcome.start_pc) * 1e9)
        root_id = f"{root.get_span_context().span_id:016x}"

        def resumed() -> list[dict]:
            spans = received.trace(trace_id)
            late = [s for s in spans if s["name"] == t.SPAN_DECODE and s["parent"] == root_id and s["start"] > kill_ns]
            return spans if late and {t.SPAN_PREFILL, t.SPAN_KV_HANDOFF} <= {s["name"] for s in spans} else []

        deadline = time.monotonic() + 60
        while not (spans := resumed()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert spans, f"data-plane spans of {trace_id}: {[(s['name'], s['start']) for s in received.trace(trace_id)]}"
        by_id = {s["id"]: s for s in spans}
        # The resumed attempt's spans each reach the gateway's root. (The killed replica's unexported spans
        # are lost with it, so a span of the first attempt may have lost its parent: that is allowed.)
        for s in (s for s in spans if s["start"] > kill_ns):
            node, hops = s, 0
            while node["parent"] != root_id:
                assert node["parent"] in by_id, f"{s['name']} is not connected"
                node, hops = by_id[node["parent"]], hops + 1
                assert hops < 20
    finally:
        serve_cluster.delete(APP)
