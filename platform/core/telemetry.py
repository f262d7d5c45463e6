"""Tracing, set up once per process and passed down.

Baton's spans (docs/architecture.md, "A request, end to end"): ``gateway.request`` with ``gateway.auth`` and
``gateway.ratelimit``; ``dataplane.prefill``, ``dataplane.kv_handoff``, ``dataplane.decode``; and one
``recovery.<step>`` per step of the recovery ladder. Attributes follow OpenTelemetry's gen_ai
conventions plus ``baton.*``; never key material, never prompt text unless a tenant allows it.

Tracing never breaks serving: exporting happens off the request path in a batch processor with a
short timeout, and an exporter that is down only loses spans. Spans go out through Baton's own OTLP
encoder (:mod:`baton.core.otlp`); ``telemetry.sample_ratio`` records a share of new traces, and a
request that brings a ``traceparent`` follows its caller's sampling decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from baton.core.settings import TelemetrySettings

log = logging.getLogger(__name__)

SPAN_GATEWAY_REQUEST = "gateway.request"
SPAN_GATEWAY_AUTH = "gateway.auth"
SPAN_GATEWAY_RATELIMIT = "gateway.ratelimit"
SPAN_FLOW_QUEUE = "flow.queue"
#: The decode server's root span of a request that came without a ``traceparent`` (a replica's warm-up, a
#: direct call of the Serve app): its prefill, handoff and decode spans are then one trace under it.
SPAN_DATAPLANE_REQUEST = "dataplane.request"
SPAN_PREFILL = "dataplane.prefill"
SPAN_KV_HANDOFF = "dataplane.kv_handoff"
SPAN_DECODE = "dataplane.decode"
SPAN_KV_TRANSFER = "dataplane.kv_transfer"  # inside the decode engine: the KV pull itself
SPAN_KV_HOLD = "dataplane.kv_hold"  # inside the prefill engine: KV pinned until the decode side read it
RECOVERY_PREFIX = "recovery."

#: The request's id: on the gateway's span the one its client sees (``req-<hex>``); on the decode server's
#: spans the ``x-request-id`` it was called with (the gateway sends ``<hex>``; a replica's warm-up
#: ``baton-warmup-<hex>``).
ATTR_REQUEST_ID = "baton.request_id"
ATTR_TENANT = "baton.tenant_id"
ATTR_DEPLOYMENT = "baton.deployment"
ATTR_FLOW_CLASS = "baton.flow.class"  # the SLO class a request was queued as
ATTR_FLOW_BAND = "baton.flow.band"  # its priority band
ATTR_FLOW_OUTCOME = "baton.flow.outcome"  # running (went upstream), or why it was refused
ATTR_BATCH = "baton.batch.id"  # the batch a request is a line of
ATTR_MODEL = "gen_ai.request.model"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True)
class Tracing:
    """What a process traces with. ``provider`` is None when tracing is off."""

    tracer: trace.Tracer
    provider: TracerProvider | None

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup_tracing(
    settings: TelemetrySettings, *, exporter: SpanExporter | None = None, batch: bool = True
) -> Tracing:
    """Builds this process's tracer.

    ``exporter`` overrides the OTLP exporter (tests pass an in-memory one). Without an endpoint and
    without an exporter, spans are still created (so trace ids reach request records and
    ``traceparent`` headers) but go nowhere.
    """
    if not settings.enabled:
        return Tracing(trace.NoOpTracer(), None)
    # deferred: the SDK's sampling and Baton's exporter, only when tracing is on
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}),
                              sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
                              meter_provider=NoOpMeterProvider())  # no SDK self-metrics per span
    if exporter is None:
        from baton.core.otlp import exporter_options, new_exporter  # deferred: only when tracing is on

        try:  # Baton's endpoint, with the standard OTEL_EXPORTER_OTLP_* variables
            options = exporter_options(settings.otlp_endpoint)
        except ValueError as exc:  # spans are still made (trace ids in records), only not exported
            log.error("traces are not exported: %s", exc)
        else:
            if options.endpoint:
                exporter = new_exporter(options, timeout_s=2)
    if exporter is not None:
        processor = (
            BatchSpanProcessor(exporter, max_queue_size=8192, schedule_delay_millis=500, export_timeout_millis=2000)
            if batch
            else SimpleSpanProcessor(exporter)
        )
        provider.add_span_processor(processor)
    return Tracing(provider.get_tracer("baton"), provider)


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Writes W3C ``traceparent``/``tracestate`` for the current (or given) context into ``headers``."""
    _PROPAGATOR.inject(headers, context=context)


def extract(headers: Mapping[str, str]) -> Context:
    """The context a caller sent (W3C ``traceparent``), or an empty one."""
    return _PROPAGATOR.extract(dict(headers))


def traceparent_of(span: trace.Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def context_from_traceparent(value: str | None) -> Context | None:
    """Parses a ``traceparent`` carried inside a payload (e.g. ``kv_transfer_params``)."""
    if not value:
        return None
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        span_ctx = SpanContext(
            trace_id=int(parts[1], 16), span_id=int(parts[2], 16), is_remote=True,
            trace_flags=TraceFlags(int(parts[3], 16)),
        )
    except ValueError:
        return None
    if not span_ctx.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_ctx))


def trace_id_hex(span: trace.Span) -> str | None:
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


def handoff_attributes(
    *, connector: str, kv_bytes: int, expected_bytes: int | None, transfer_ms: float, bandwidth_gbps: float
) -> dict[str, str | int | float]:
    """The ``dataplane.kv_handoff`` attributes: bytes, time, the ideal time at the link's bandwidth."""
    ideal_ms = kv_bytes / (bandwidth_gbps * 1e9) * 1e3
    attrs: dict[str, str | int | float] = {
        "baton.kv.connector": connector,
        "baton.kv.bytes": kv_bytes,
        "baton.kv.transfer_ms": transfer_ms,
        "baton.kv.ideal_ms": ideal_ms,
        "baton.kv.efficiency": (ideal_ms / transfer_ms) if transfer_ms > 0 else 0.0,
        "baton.kv.link_gbps": bandwidth_gbps,
    }
    if expected_bytes is not None:
        attrs["baton.kv.expected_bytes"] = expected_bytes
    return attrs

