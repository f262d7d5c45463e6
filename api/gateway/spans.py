"""The gateway's spans: ``gateway.request`` with ``gateway.auth``, ``gateway.ratelimit`` and ``recovery.*``.

Cheap by construction: a request costs one root span started when it is admitted and ended with its
:class:`~baton.api.gateway.metering.Outcome`; the auth and rate-limit children are written after the
fact with the start/end times measured around them (no context switching, no per-chunk work while
the stream is relayed). Attributes follow OpenTelemetry's gen_ai conventions plus ``baton.*``; they
never carry key material (only the key's id) and never prompt or completion text.

When tracing is off (``BATON_TELEMETRY__ENABLED=false``) none of this runs: the gateway only forwards
the client's ``traceparent`` (or a fresh one) to keep trace ids on request records.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from baton.api.gateway.metering import Outcome
from baton.core import telemetry as t

#: gen_ai.operation.name per gateway endpoint.
OPERATIONS = {"chat/completions": "chat", "completions": "text_completion", "embeddings": "embeddings"}


def start_request(tracer: trace.Tracer, *, traceparent: str | None, start_ns: int, request_id: str, endpoint: str,
                  model: str, tenant_id: uuid.UUID, key_id: uuid.UUID | None, stream: bool,
                  max_tokens: Any = None) -> trace.Span:
    """The root span of one request: a child of the client's trace when it sent one."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": OPERATIONS.get(endpoint, endpoint),
        t.ATTR_MODEL: model,
        t.ATTR_TENANT: str(tenant_id),
        t.ATTR_REQUEST_ID: f"req-{request_id}",
        "baton.stream": stream,
    }
    if key_id is not None:
        attrs["baton.api_key_id"] = str(key_id)  # the key's row id, never the key
    if isinstance(max_tokens, int):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    return tracer.start_span(t.SPAN_GATEWAY_REQUEST, context=t.context_from_traceparent(traceparent),
                             kind=SpanKind.SERVER, start_time=start_ns, attributes=attrs)


def child(tracer: trace.Tracer, parent: trace.Span, name: str, start_ns: int, end_ns: int, *,
          attributes: dict[str, Any] | None = None, error: str | None = None) -> None:
    """A finished child span with measured times.

    Written straight to the tracer's span processors as a finished span (no live span to start, lock,
    sample and end: its parent was sampled, and it is done): a third of the SDK's cost. A tracer without
    that seam (another SDK) gets the same span the usual way."""
    if not parent.is_recording():
        return
    status = Status(StatusCode.ERROR, error) if error else _UNSET
    processor = getattr(tracer, "span_processor", None)
    ids = getattr(tracer, "id_generator", None)
    if processor is None or ids is None or not isinstance(parent, ReadableSpan):
        span = tracer.start_span(name, context=trace.set_span_in_context(parent), start_time=start_ns,
                                 attributes=attributes)
        if error:
            span.set_status(status)
        span.end(end_time=max(end_ns, start_ns))
        return
    ctx = parent.get_span_context()
    processor.on_end(ReadableSpan(
        name, context=SpanContext(ctx.trace_id, ids.generate_span_id(), is_remote=False, trace_flags=ctx.trace_flags,
                                  trace_state=ctx.trace_state),
        parent=ctx, resource=parent.resource, attributes=attributes or {}, kind=SpanKind.INTERNAL, status=status,
        start_time=start_ns, end_time=max(end_ns, start_ns), instrumentation_scope=parent.instrumentation_scope))


_UNSET = Status(StatusCode.UNSET)


def epoch_ns(outcome: Outcome, pc: float) -> int:
    """A perf_counter reading of this request as unix nanoseconds (span times)."""
    return int(outcome.started * 1e9 + (pc - outcome.start_pc) * 1e9)


def recovery_spans(tracer: trace.Tracer, parent: trace.Span | Context | None, steps: list[dict[str, Any]],
                   request_start_ns: int) -> None:
    """One ``recovery.<step>`` span per recorded step (``at_ms`` from the request's start, ``duration_ms``)."""
    ctx = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else parent
    for step in steps:
        try:
            name = str(step["step"])
            start = request_start_ns + int(float(step.get("at_ms") or 0.0) * 1e6)
            end = start + int(float(step.get("duration_ms") or 0.0) * 1e6)
        except (KeyError, TypeError, ValueError):
            continue
        span = tracer.start_span(t.RECOVERY_PREFIX + name, context=ctx, start_time=start, attributes={
            "baton.recovery.step": name,
            "baton.recovery.outcome": str(step.get("outcome") or ""),
            "baton.recovery.detail": str(step.get("detail") or "")[:200],
            "baton.recovery.source": str(step.get("source") or "gateway"),
        })
        if step.get("outcome") == "failed":
            span.set_status(Status(StatusCode.ERROR, "recovery step failed"))
        span.end(end_time=end)


def finish_request(tracer: trace.Tracer, span: trace.Span, outcome: Outcome) -> None:
    """Ends the root span with what the outcome knows (tokens, status, TTFT, recovery steps)."""
    try:
        span.set_attribute(t.ATTR_INPUT_TOKENS, outcome.prompt_tokens)
        span.set_attribute(t.ATTR_OUTPUT_TOKENS, outcome.completion_tokens)
        span.set_attribute("http.response.status_code", outcome.http_status)
        span.set_attribute("baton.status", str(outcome.status.value))
        if outcome.first_token is not None:
            span.set_attribute("baton.ttft_ms", (outcome.first_token - outcome.start_pc) * 1000)
        if outcome.error_code:
            span.set_attribute("error.type", outcome.error_code)
            if outcome.http_status >= 500:
                span.set_status(Status(StatusCode.ERROR, outcome.error_code))
        steps = getattr(outcome, "recovery_steps", None)
        if steps:
            recovery_spans(tracer, span, steps, int(outcome.started * 1e9))
    finally:
        span.end(end_time=epoch_ns(outcome, outcome.end_pc) if outcome.end_pc else time.time_ns())


def rejected(span: trace.Span, exc: BaseException) -> None:
    """Ends the root span of a request refused before it reached an upstream (limits, routing)."""
    try:
        code = getattr(exc, "code", None) or type(exc).__name__
        span.set_attribute("error.type", str(code))
        status = getattr(exc, "status", None)
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
    finally:
        span.end()
