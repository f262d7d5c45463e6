"""Data-plane facts merged into request records (the contract: :mod:`baton.core.contracts`; the writer:
:mod:`baton.dataplane.facts`).

Called by the usage meter on each batch before it is written, off the request path: one pipelined
``HGETALL`` of each outcome's :func:`~baton.core.contracts.fact_key` (static routes to a Serve
deployment included). The ``handoff`` fact (the decode server's view, submit to first token) fills
``kv_bytes``/``handoff_ms``; the ``kv_transfer`` fact (NIXL's own timing inside the decode engine), when
present, replaces them with the transfer itself; the ``phases`` fact (the decode server's measured
prefill attempts, KV handoff and local prefill) becomes the record's ``phases``, on the request's time
axis; data-plane ``recovery_steps`` (and a ``kv_recompute`` step where the decode engine's KV pull
failed and it recomputed the prompt) are appended to the outcome's own and become ``recovery.<step>``
spans in the request's trace (parent: its ``gateway.request`` span). Redis down or slow costs only the
facts.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from opentelemetry import trace

from baton.api.gateway import spans as gw_spans
from baton.api.gateway.metering import Outcome
from baton.core import contracts as c
from baton.core import telemetry as t

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5


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
                    pipe.hgetall(c.fact_key(o.request_id.hex))
                results = await asyncio.wait_for(pipe.execute(), TIMEOUT_S)
        except Exception as exc:  # Redis down: records are written without the facts
            log.debug("request facts not read: %s", type(exc).__name__)
            return
        for o, raw in zip(todo, results, strict=True):
            o.facts_merged = True
            if raw:
                self.merge(o, c.RequestFacts.from_hash(raw))

    def merge(self, o: Outcome, facts: c.RequestFacts) -> None:
        if facts.handoff is not None:
            if facts.handoff.kv_bytes is not None:
                o.kv_bytes = facts.handoff.kv_bytes
            if facts.handoff.transfer_ms is not None:
                o.handoff_ms = facts.handoff.transfer_ms
        measured = facts.kv_transfer  # timed inside the decode engine: preferred over the upper bound
        if measured is not None:
            if measured.kv_bytes is not None and measured.kv_bytes > 0:
                o.kv_bytes = measured.kv_bytes
            if measured.transfer_ms is not None:
                o.handoff_ms = measured.transfer_ms
        if facts.phases is not None:
            o.phases = [p.to_json() for p in facts.phases.on_request_axis(o.started)]
        steps = [replace(s, source="dataplane").to_json()
                 for s in (facts.recovery_steps.steps if facts.recovery_steps is not None else ())]
        failed_load = facts.kv_load_failed  # the decode engine could not pull the KV: it recomputed
        if failed_load is not None:
            at_ms = (failed_load.t_unix - o.started) * 1000 if failed_load.t_unix is not None else 0.0
            blocks = failed_load.blocks if failed_load.blocks is not None else "?"
            detail = (f"KV pull over {failed_load.connector} failed ({blocks} blocks); the decode engine "
                      "recomputed the prompt")
            steps.append(c.RecoveryStep(c.STEP_KV_RECOMPUTE, round(max(at_ms, 0.0), 3),
                                        round(failed_load.wait_ms or 0.0, 3), "recovered", detail[:c.DETAIL_MAX],
                                        "dataplane").to_json())
        if steps:
            o.recovery_steps.extend(steps)
            if self._tracer is not None and o.trace_id and o.span_id:
                parent = t.context_from_traceparent(f"00-{o.trace_id}-{o.span_id}-01")
                gw_spans.recovery_spans(self._tracer, parent, steps, int(o.started * 1e9))
