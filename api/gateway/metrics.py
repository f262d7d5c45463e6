"""The gateway's Prometheus metrics (``GET /metrics``), the series Baton's Grafana dashboard reads.

The names, types and labels are the contract in ``ops/grafana/metrics.yaml``. Request metrics are
observed once per request, when its outcome is written (after the data plane's facts were merged),
never per token on the stream. Each app has its own registry, so several apps in one process (tests,
benchmarks) do not collide.

Tenant ids are labels only when the operator opts in (``BATON_TELEMETRY__METRICS_TENANT_LABELS``): without it
the ``tenant`` label is empty (Prometheus reads an empty label as no label), so the series add up per model
and a scrape names no tenant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from baton.api.gateway.metering import Outcome

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TOKEN_GAP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
_BYTES = tuple(float(4**i * 1024) for i in range(12))  # 1 KiB .. 4 GiB


class GatewayMetrics:
    def __init__(self, *, tenant_labels: bool = False) -> None:
        self.tenant_labels = tenant_labels
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("baton_requests", "Requests that reached a final state.",
                                ["tenant", "model", "outcome"], registry=r)
        self.in_flight = Gauge("baton_requests_in_flight", "Requests accepted and not yet in a final state.",
                               ["model"], registry=r)
        self.ttft = Histogram("baton_request_ttft_seconds", "Time to first token as the client sees it.",
                              ["tenant", "model"], buckets=_LATENCY, registry=r)
        self.tpot = Histogram("baton_request_tpot_seconds", "Time per output token of a completed request.",
                              ["tenant", "model"], buckets=_TOKEN_GAP, registry=r)
        self.itl = Histogram("baton_request_itl_seconds", "Gaps between two streamed tokens.",
                             ["tenant", "model"], buckets=_TOKEN_GAP, registry=r)
        self.slo = Counter("baton_slo_requests", "Completed requests judged against their SLO class.",
                           ["tenant", "model", "attained"], registry=r)
        self.kv_bytes = Histogram("baton_kv_handoff_bytes", "KV bytes moved from prefill to decode per request.",
                                  ["model"], buckets=_BYTES, registry=r)
        self.kv_seconds = Histogram("baton_kv_handoff_seconds", "KV handoff time from prefill to decode.",
                                    ["model"], buckets=_LATENCY, registry=r)
        self.recovery = Counter("baton_recovery_events", "Steps of the recovery ladder run.",
                                ["model", "step", "outcome"], registry=r)
        self.flow_queue = Histogram("baton_flow_queue_seconds", "Time a request waited in its model's flow-control "
                                    "queue before going upstream.", ["tenant", "model", "slo_class"],
                                    buckets=_LATENCY, registry=r)
        self.flow_rejected = Counter("baton_flow_rejected", "Requests flow control refused: queue_full, ttl, "
                                     "backlog, slo (429 with Retry-After), unavailable (503).",
                                     ["tenant", "model", "reason"], registry=r)
        self.flow_tokens = Counter("baton_flow_tokens", "Tokens served under flow control: prompt (prefill) and "
                                   "completion (decode) apart.", ["tenant", "model", "kind"], registry=r)
        self.flow_slo = Counter("baton_flow_slo_requests", "Completed requests of a band judged against their SLO "
                                "class.", ["model", "band", "attained"], registry=r)
        self.flow_waiting = Gauge("baton_flow_waiting", "Requests waiting in the model's queue (this process).",
                                  ["model", "band"], registry=r)
        self.flow_limit = Gauge("baton_flow_limit", "The model's learned concurrency limit (this process; -1: no "
                                "view yet, limits only).", ["model"], registry=r)
        self.flow_running = Gauge("baton_flow_running", "Requests of the model upstream, dispatched by this process.",
                                  ["model"], registry=r)
        self.flow_fairness = Gauge("baton_flow_fairness", "Jain's index of weighted token service over the tenants "
                                   "backlogged in a band since the last scrape (1: exactly by weight).",
                                   ["model", "band"], registry=r)
        self._flow: Any = None
        self.pool_replicas = Gauge("baton_pool_replicas", "Engine replicas of a deployment's pool.",
                                   ["deployment", "pool", "state"], registry=r)

    def admitted(self, model: str) -> None:
        self.in_flight.labels(model).inc()

    def finished(self, model: str) -> None:
        self.in_flight.labels(model).dec()

    def _tenant(self, tenant: object) -> str:
        return str(tenant) if self.tenant_labels else ""

    def rejected(self, tenant: str, model: str) -> None:
        self.requests.labels(self._tenant(tenant), model, "rejected").inc()

    def bind_flow(self, flow: Any) -> None:
        """The gateway's :class:`~baton.api.gateway.flow.FlowController`, read at each scrape."""
        self._flow = flow

    def flow_rejected_by(self, tenant: object, model: str, reason: str) -> None:
        self.flow_rejected.labels(self._tenant(tenant), model, reason).inc()

    def observe(self, o: Outcome, *, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None) -> None:
        """One request's final figures (called once per request, off the stream)."""
        tenant, model = self._tenant(o.tenant_id), o.model
        if slo_ttft_ms is None:
            slo_ttft_ms, slo_tpot_ms = o.slo_ttft_ms, o.slo_tpot_ms
        if o.queue_ms is not None and o.dispatch_pc is not None:
            self.flow_queue.labels(tenant, model, o.flow_class or "default").observe(o.queue_ms / 1000)
            if o.metered:
                self.flow_tokens.labels(tenant, model, "prompt").inc(o.prompt_tokens)
                self.flow_tokens.labels(tenant, model, "completion").inc(o.completion_tokens)
        self.requests.labels(tenant, model, o.status.value).inc()
        ttft_s = (o.first_token - o.start_pc) if o.first_token is not None else None
        if ttft_s is not None:
            self.ttft.labels(tenant, model).observe(ttft_s)
        tpot_s = None
        if ttft_s is not None and o.completion_tokens > 1:
            tpot_s = max(o.end_pc - o.first_token, 0.0) / (o.completion_tokens - 1)  # type: ignore[operator]
            self.tpot.labels(tenant, model).observe(tpot_s)
        itl = self.itl.labels(tenant, model)
        for gap in o.gaps:
            itl.observe(gap)
        if o.kv_bytes:
            self.kv_bytes.labels(model).observe(o.kv_bytes)
        if o.handoff_ms is not None:
            self.kv_seconds.labels(model).observe(o.handoff_ms / 1000)
        for step in o.recovery_steps:
            self.recovery.labels(model, str(step.get("step", "unknown")), str(step.get("outcome", "unknown"))).inc()
        if o.status.value == "completed" and slo_ttft_ms is not None and ttft_s is not None:
            met = ttft_s * 1000 <= slo_ttft_ms and (
                slo_tpot_ms is None or tpot_s is None or tpot_s * 1000 <= slo_tpot_ms
            )
            self.slo.labels(tenant, model, "true" if met else "false").inc()
            if o.flow_band is not None:
                self.flow_slo.labels(model, str(o.flow_band), "true" if met else "false").inc()

    def exposition(self) -> bytes:
        if self._flow is not None:
            self._read_flow(self._flow)
        return generate_latest(self.registry)

    def _read_flow(self, controller: Any) -> None:
        for name, flow in list(controller.models.items()):
            limit = flow.capacity()
            self.flow_limit.labels(name).set(-1 if limit is None else limit)
            self.flow_running.labels(name).set(flow.in_flight)
            for band, waiting in flow.waiting_by_band().items():  # every band seen, 0 once emptied
                self.flow_waiting.labels(name, str(band)).set(waiting)
            for band, index in flow.fairness().items():
                self.flow_fairness.labels(name, str(band)).set(index)
