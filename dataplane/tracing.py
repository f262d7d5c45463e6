"""Data-plane spans of a P/D request: ``dataplane.prefill``, ``dataplane.kv_handoff``, ``dataplane.decode``.

The decode server (:class:`baton.dataplane.pd.BatonPDDecodeServer`) sets tracing up once per replica
(on its first request, in the replica process) from the env the renderer puts in the app's runtime
env (``BATON_TELEMETRY__*``), continues the ``traceparent`` the gateway sent (header ``traceparent``,
carried by Ray Serve in the raw request info), and passes each span's own ``traceparent`` on: to the
prefill replica (header, and ``kv_transfer_params["baton.traceparent"]``), and to the decode engine
(header and ``kv_transfer_params``), so
vLLM's own request spans (when started with ``otlp_traces_endpoint``) hang below Baton's.

What the spans measure, from the orchestrator (honestly named):

- ``dataplane.prefill``: the remote prefill call, dispatch to its answer (queueing + prefill).
- ``dataplane.kv_handoff``: from submitting the decode request with the prefill's KV handle to the
  decode engine's first token. That interval contains the KV pull (NIXL) plus scheduling and one
  decode step, so it is an upper bound of the transfer: the attributes say ``transfer_ms_upper_bound``
  and ``efficiency_lower_bound``. The transfer itself is measured inside the decode engine, by NIXL,
  and shows as its child ``dataplane.kv_transfer`` (:mod:`baton.dataplane.kv_trace`).
  ``baton.kv.bytes`` is what NIXL moved: the prefill's KV blocks (whole blocks of
  ``baton.kv.block_size`` tokens); ``baton.kv.expected_bytes`` is the KV-size formula for exactly the
  prompt's tokens.
- ``dataplane.decode``: submit to last chunk: first-token time, output tokens, gaps between the chunks
  the engine yields (Ray may batch several tokens per chunk).
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from baton.core import telemetry as t
from baton.core.contracts import HandoffFact, ReplicaEnv, dtype_bytes, kv_bytes
from baton.core.settings import TelemetrySettings

log = logging.getLogger(__name__)

TRACEPARENT_PARAM = "baton.traceparent"
#: On ``dataplane.prefill``: when the decode server began handling the request (ns since the epoch), so
#: the time between the gateway and the decode server's first step is measurable.
ATTR_RECEIVED = "baton.server.received_unix_nano"
REQUEST_ID_PARAM = "baton.request_id"

_tracing: t.Tracing | None = None


def tracing_from_env() -> t.Tracing:
    """This process's tracing, from the replica's environment (:class:`~baton.core.contracts.ReplicaEnv`;
    built once)."""
    global _tracing  # one provider per replica process
    if _tracing is None:
        tel = ReplicaEnv.from_environ().telemetry
        settings = TelemetrySettings(enabled=tel.enabled, otlp_endpoint=tel.otlp_endpoint,
                                     service_name=tel.service_name, link_bandwidth_gbps=tel.link_bandwidth_gbps)
        _tracing = t.setup_tracing(settings)
    return _tracing


def link_bandwidth_gbps() -> float:
    return ReplicaEnv.from_environ().telemetry.link_bandwidth_gbps


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                        bytes_per_element=self.dtype_bytes)


def model_shape(model_path: str, *, dtype: str | None, block_size: int) -> ModelShape | None:
    """The KV shape from a Hugging Face ``config.json`` (None when unreadable, or its dtype unknown).
    ``dtype``: the engine's (``auto`` or None: the model's own)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        dt = dtype if dtype and dtype != "auto" else str(cfg.get("torch_dtype") or "float32")
        return ModelShape(int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads") or heads), head_dim,
                          dtype_bytes(dt), block_size)
    except (OSError, KeyError, TypeError, ValueError):
        return None


@dataclass
class RequestTrace:
    """The spans of one request on the decode server (per-request state, kept in a context variable)."""

    tracer: trace.Tracer
    parent: Any  # Context of the caller (gateway span) or None
    request_id: str | None
    replica: str
    raw: Any = None  # Ray's RawRequestInfo: its headers go to the prefill replica and the decode engine
    prefill: trace.Span | None = None
    prefill_attempts: int = 0
    handoff: dict[str, Any] | None = None
    decode: trace.Span | None = None
    handoff_span: trace.Span | None = None
    decode_start_pc: float = 0.0
    decode_start_ns: int = 0
    first_pc: float | None = None
    first_ns: int = 0
    last_pc: float = 0.0
    gaps: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    chunks: int = 0
    handoff_done: bool = False
    root: trace.Span | None = None  # the request's own root span, when it came without a traceparent
    received_ns: int = field(default_factory=time.time_ns)  # the decode server began handling the request

    def _ids(self) -> dict[str, str]:
        return {t.ATTR_REQUEST_ID: self.request_id} if self.request_id else {}

    # -- prefill ----------------------------------------------------------------------------------

    def start_prefill(self, prefill_request: Any) -> None:
        if self.prefill is not None:  # a retry: the previous attempt did not answer
            self.prefill.set_status(Status(StatusCode.ERROR, "prefill attempt replaced"))
            self.prefill.end()
        self.prefill_attempts += 1
        self.prefill = self.tracer.start_span(t.SPAN_PREFILL, context=self.parent, kind=SpanKind.CLIENT,
                                              attributes={"baton.prefill.attempt": self.prefill_attempts,
                                                          "baton.replica": self.replica,
                                                          ATTR_RECEIVED: self.received_ns, **self._ids()})
        tp = t.traceparent_of(self.prefill)
        _set_param(prefill_request, TRACEPARENT_PARAM, tp)
        _set_header(self.raw, tp)

    def end_prefill(self, prefill_response: Any, prompt_tokens: int | None, blocks: int) -> None:
        span = self.prefill
        if span is None:
            return
        params = getattr(prefill_response, "kv_transfer_params", None) or {}
        if prompt_tokens is not None:
            span.set_attribute(t.ATTR_INPUT_TOKENS, prompt_tokens)
        span.set_attribute("baton.prefill.remote_engine_id", str(params.get("remote_engine_id") or ""))
        span.set_attribute("baton.kv.blocks", blocks)
        span.end()
        self.prefill = None

    # -- decode -----------------------------------------------------------------------------------

    def start_decode(self, decode_request: Any, handoff: dict[str, Any]) -> None:
        self.handoff = handoff
        self.decode_start_pc = time.perf_counter()
        self.decode_start_ns = time.time_ns()
        self.decode = self.tracer.start_span(t.SPAN_DECODE, context=self.parent, start_time=self.decode_start_ns,
                                             attributes={"baton.replica": self.replica, **self._ids()})
        # Open from now to the first token; the engine's own KV spans (``baton.dataplane.kv_trace``)
        # hang below it through the traceparent in ``kv_transfer_params``.
        self.handoff_span = self.tracer.start_span(t.SPAN_KV_HANDOFF, context=trace.set_span_in_context(self.decode),
                                                   start_time=self.decode_start_ns)
        tp = t.traceparent_of(self.decode)
        params = dict(getattr(decode_request, "kv_transfer_params", None) or {})
        params[TRACEPARENT_PARAM] = t.traceparent_of(self.handoff_span)
        if self.request_id:
            params[REQUEST_ID_PARAM] = self.request_id
        decode_request.kv_transfer_params = params
        _set_header(self.raw, tp)

    def chunk(self, item: Any) -> None:
        """One chunk from the decode engine: times only (usage is read at the end)."""
        now = time.perf_counter()
        self.chunks += 1
        if self.first_pc is None:
            self.first_pc = now
            self.first_ns = time.time_ns()
        else:
            self.gaps.append(now - self.last_pc)
        self.last_pc = now
        usage = _usage(item)
        if usage is not None:
            self.output_tokens = usage

    def finish(self, shape: ModelShape | None, error: BaseException | None = None) -> HandoffFact | None:
        """Ends the request's spans; returns the ``handoff`` fact for the gateway."""
        try:
            return self._finish(shape, error)
        finally:
            if self.root is not None:
                if error is not None:
                    self.root.set_status(Status(StatusCode.ERROR, type(error).__name__))
                self.root.end()
                self.root = None

    def _finish(self, shape: ModelShape | None, error: BaseException | None) -> HandoffFact | None:
        if self.prefill is not None:
            self.prefill.set_status(Status(StatusCode.ERROR, "prefill did not answer"))
            self.prefill.end()
            self.prefill = None
        span = self.decode
        if span is None:
            return None
        handoff = self.handoff or {}
        fact = None
        if self.first_pc is not None:
            if not self.handoff_done:
                fact = self.first_token(shape)
            span.set_attribute("baton.decode.first_token_ms", (self.first_pc - self.decode_start_pc) * 1000)
        if self.output_tokens is not None:
            span.set_attribute(t.ATTR_OUTPUT_TOKENS, self.output_tokens)
        if handoff.get("prompt_tokens") is not None:
            span.set_attribute(t.ATTR_INPUT_TOKENS, int(handoff["prompt_tokens"]))
        span.set_attribute("baton.decode.chunks", self.chunks)
        if self.gaps:
            gaps = sorted(self.gaps)
            span.set_attribute("baton.decode.itl_p50_ms", gaps[len(gaps) // 2] * 1000)
            span.set_attribute("baton.decode.itl_p99_ms", gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1000)
        if self.handoff_span is not None:  # no first token: the handoff never completed
            self.handoff_span.set_status(Status(StatusCode.ERROR, "no first token"))
            self.handoff_span.end()
            self.handoff_span = None
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()
        self.decode = None
        return fact

    def first_token(self, shape: ModelShape | None) -> HandoffFact | None:
        """At the decode engine's first token: the ``dataplane.kv_handoff`` span and the ``handoff`` fact."""
        if self.handoff_done or self.first_pc is None or self.decode is None:
            return None
        self.handoff_done = True
        return self._handoff_span(shape, self.handoff or {})

    def _handoff_span(self, shape: ModelShape | None, handoff: dict[str, Any]) -> HandoffFact:
        assert self.first_pc is not None
        ms = (self.first_pc - self.decode_start_pc) * 1000
        prompt = handoff.get("prompt_tokens")
        blocks = int(handoff.get("remote_blocks") or 0)
        moved = expected = None
        if shape is not None:
            moved = blocks * shape.block_size * shape.bytes_per_token
            if prompt is not None:
                expected = int(prompt) * shape.bytes_per_token
        attrs = t.handoff_attributes(connector=str(handoff.get("connector") or "nixl"), kv_bytes=moved or 0,
                                     expected_bytes=expected, transfer_ms=ms, bandwidth_gbps=link_bandwidth_gbps())
        # Measured from outside the engine: transfer + scheduling + one decode step.
        attrs["baton.kv.transfer_ms_upper_bound"] = attrs.pop("baton.kv.transfer_ms")
        attrs["baton.kv.efficiency_lower_bound"] = attrs.pop("baton.kv.efficiency")
        attrs["baton.kv.blocks"] = blocks
        if shape is not None:
            attrs["baton.kv.block_size"] = shape.block_size
        if prompt is not None:
            attrs[t.ATTR_INPUT_TOKENS] = int(prompt)
        span = self.handoff_span
        if span is None:
            span = self.tracer.start_span(t.SPAN_KV_HANDOFF, context=trace.set_span_in_context(self.decode)
                                          if self.decode is not None else self.parent, start_time=self.decode_start_ns)
        span.set_attributes(attrs)
        span.end(end_time=self.first_ns)
        self.handoff_span = None
        return HandoffFact(connector=str(attrs["baton.kv.connector"]), kv_bytes=moved, expected_bytes=expected,
                           transfer_ms=ms, transfer_ms_kind="upper_bound_to_first_token",
                           prompt_tokens=int(prompt) if prompt is not None else None)


#: The request the decode server is handling in this task (the backend hooks read it).
current: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("baton_request_trace", default=None)


def begin(raw_request_info: Any, *, replica: str) -> RequestTrace | None:
    """Starts tracing one request on the decode server (None when tracing is off)."""
    tracing = tracing_from_env()
    if tracing.provider is None:
        return None
    headers = getattr(raw_request_info, "headers", None) or {}
    parent = t.context_from_traceparent(headers.get("traceparent"))
    rt = RequestTrace(tracing.tracer, parent, headers.get("x-request-id"), replica, raw=raw_request_info)
    if parent is None:  # nobody's trace to join: one of its own, so its spans are one tree
        rt.root = tracing.tracer.start_span(t.SPAN_DATAPLANE_REQUEST, kind=SpanKind.SERVER,
                                            attributes={"baton.replica": replica, **rt._ids()})
        rt.parent = trace.set_span_in_context(rt.root)
    return rt


def _set_param(request: Any, key: str, value: str) -> None:
    try:
        params = dict(getattr(request, "kv_transfer_params", None) or {})
        params[key] = value
        request.kv_transfer_params = params
    except (AttributeError, TypeError, ValueError):
        pass


def _set_header(raw_request_info: Any, traceparent: str) -> None:
    headers = getattr(raw_request_info, "headers", None)
    if isinstance(headers, dict):
        headers["traceparent"] = traceparent


def _usage(item: Any) -> int | None:
    """Output tokens from an engine chunk that carries usage (a response object or SSE text)."""
    if isinstance(item, list):
        found = None
        for x in item:
            u = _usage(x)
            if u is not None:
                found = u
        return found
    usage = getattr(item, "usage", None)
    if usage is not None:
        n = getattr(usage, "completion_tokens", None)
        return int(n) if n is not None else None
    if isinstance(item, str) and '"usage":{' in item:
        for line in item.split("\n"):
            if line.startswith("data: {") and '"usage":{' in line:
                try:
                    data = json.loads(line[6:])
                except ValueError:
                    continue
                u = data.get("usage") if isinstance(data, dict) else None
                if isinstance(u, dict) and u.get("completion_tokens") is not None:
                    return int(u["completion_tokens"])
    return None
