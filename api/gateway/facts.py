"""Data-plane facts merged into request records (see :mod:`baton.dataplane.facts` for the writer).

Called by the usage meter on each batch before it is written, off the request path: one pipelined
``HGETALL baton:req:<request id>`` per outcome (static routes to a Serve deployment included). The ``handoff`` fact
(the decode server's view, submit to first token) fills ``kv_bytes``/``handoff_ms``; the
``kv_transfer`` fact (NIXL's own timing inside the decode engine), when present, replaces them with
the transfer itself; data-plane ``recovery_steps`` (and a ``kv_recompute`` step where the decode
engine's KV pull failed and it recomputed the prompt) are appended to the outcome's own and
become ``recovery.<step>`` spans in the request's trace (parent: its ``gateway.request`` span).
Redis down or slow costs only the facts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from opentelemetry import trace

from baton.api.gateway import tracing as gw_tracing
from baton.api.gateway.metering import Outcome
from baton.core import telemetry as t

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5
#: Step of a request whose KV the decode engine failed to load and recomputed instead (never decoded on it).
KV_RECOMPUTE_STEP = "kv_recompute"


def fact_key(request_hex: str) -> str:
    return f"baton:req:{request_hex}"


class FactMerger:
    """The meter's ``enrich`` hook: ``await merger(outcomes)``."""

    def __init__(self, redis: Any, tracer: trace.Tracer | None = None) -> None:
        self._redis = redis
        self._tracer = tracer

    async def __call__(self, outcomes: list[Outcome]) -> None:
        # Every outcome went upstream (an outcome exists once a request is admitted): a static route to a
        # Serve deployment has facts as well as a routed one; a bare engine's key is simply empty.
        todo = [o for o in outcomes if not o.facts_merged]
        if not todo:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for o in todo:
                    pipe.hgetall(fact_key(o.request_id.hex))
                results = await asyncio.wait_for(pipe.execute(), TIMEOUT_S)
        except Exception as exc:  # Redis down: records are written without the facts
            log.debug("request facts not read: %s", type(exc).__name__)
            return
        for o, raw in zip(todo, results, strict=True):
            o.facts_merged = True
            if raw:
                try:
                    self.merge(o, {_s(k): json.loads(v) for k, v in raw.items()})
                except (ValueError, TypeError):
                    continue

    def merge(self, o: Outcome, facts: dict[str, Any]) -> None:
        handoff = facts.get("handoff")
        if isinstance(handoff, dict):
            if isinstance(handoff.get("kv_bytes"), int):
                o.kv_bytes = handoff["kv_bytes"]
            if isinstance(handoff.get("transfer_ms"), int | float):
                o.handoff_ms = float(handoff["transfer_ms"])
        measured = facts.get("kv_transfer")  # timed inside the decode engine: preferred over the upper bound
        if isinstance(measured, dict):
            if isinstance(measured.get("kv_bytes"), int) and measured["kv_bytes"] > 0:
                o.kv_bytes = measured["kv_bytes"]
            if isinstance(measured.get("transfer_ms"), int | float):
                o.handoff_ms = float(measured["transfer_ms"])
        steps = facts.get("recovery_steps")
        steps = [dict(s, source="dataplane") for s in steps if isinstance(s, dict) and "step" in s] \
            if isinstance(steps, list) else []
        failed_load = facts.get("kv_load_failed")  # the decode engine could not pull the KV: it recomputed
        if isinstance(failed_load, dict):
            t_unix = failed_load.get("t_unix")
            wait_ms = failed_load.get("wait_ms")
            at_ms = (float(t_unix) - o.started) * 1000 if isinstance(t_unix, int | float) else 0.0
            steps.append({"step": KV_RECOMPUTE_STEP, "at_ms": round(max(at_ms, 0.0), 3),
                          "duration_ms": round(float(wait_ms), 3) if isinstance(wait_ms, int | float) else 0.0,
                          "outcome": "recovered", "source": "dataplane",
                          "detail": f"KV pull over {failed_load.get('connector', 'the connector')} failed "
                                    f"({failed_load.get('blocks', '?')} blocks); the decode engine recomputed "
                                    "the prompt"})
        if steps:
            o.recovery_steps.extend(steps)
            if self._tracer is not None and o.trace_id and o.span_id:
                parent = t.context_from_traceparent(f"00-{o.trace_id}-{o.span_id}-01")
                gw_tracing.recovery_spans(self._tracer, parent, steps, int(o.started * 1e9))


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
