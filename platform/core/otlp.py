"""Spans to an OTLP/HTTP collector, encoded by hand.

OpenTelemetry's own OTLP exporter builds a protobuf message object per span, attribute and value before
it serialises them: on a gateway that ends three spans per request, that encoding alone cost more CPU
than the request's relay. :func:`encode_spans` writes the same bytes (``ExportTraceServiceRequest``,
fields in number order, proto3 defaults left out) straight from the finished spans; a test decodes them
with the official message classes and compares with the official encoder's result.
:class:`OtlpHttpExporter` posts them (``application/x-protobuf``) from the batch processor's thread,
retrying a failed post once within its timeout; a collector that is down only loses spans.

The OpenTelemetry exporter settings a hosted tracing backend needs are honoured as the specification
names them (:func:`exporter_options`): ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` where Baton's own
``telemetry.otlp_endpoint`` is not set, ``..._HEADERS`` (``key=value,...``, values URL-encoded; never
logged), ``..._COMPRESSION`` (``gzip``) and ``..._CERTIFICATE`` (a CA bundle for https). The protocol is
OTLP/HTTP with protobuf; ``..._PROTOCOL=grpc`` is refused with a clear message at start-up.
"""

from __future__ import annotations

import gzip
import logging
import os
import ssl
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind

log = logging.getLogger(__name__)

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_D = struct.Struct("<d").pack
_Q = struct.Struct("<Q").pack
_I = struct.Struct("<I").pack


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _any(value: Any) -> bytes:
    """An ``AnyValue`` (its one field is always written, even a zero: it is a oneof)."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _D(value)
    if isinstance(value, str):
        return _field(1, value.encode())
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, Sequence):
        return _field(5, b"".join(_field(1, _any(v)) for v in value))
    return _field(1, str(value).encode())


def _attributes(number: int, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    return b"".join(_field(number, _field(1, key.encode()) + _field(2, _any(value)))
                    for key, value in attributes.items())


def _count(number: int, n: int) -> bytes:
    return _varint(number << 3) + _varint(n) if n else b""


def _flags(parent: SpanContext | None) -> int:
    return _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)


def _trace_state(ctx: SpanContext) -> bytes:
    state = ctx.trace_state
    if not state:
        return b""
    return _field(3, ",".join(f"{k}={v}" for k, v in state.items()).encode())


def _span(span: ReadableSpan) -> bytes:
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    parts = [_field(1, ctx.trace_id.to_bytes(16, "big")), _field(2, ctx.span_id.to_bytes(8, "big")),
             _trace_state(ctx)]
    if parent is not None:
        parts.append(_field(4, parent.span_id.to_bytes(8, "big")))
    if span.name:
        parts.append(_field(5, span.name.encode()))
    parts += [b"\x30" + _varint(_KINDS[span.kind]),
              b"\x39" + _Q(span.start_time or 0) if span.start_time else b"",
              b"\x41" + _Q(span.end_time or 0) if span.end_time else b"",
              _attributes(9, span.attributes), _count(10, span.dropped_attributes)]
    for event in span.events:
        body = (b"\x09" + _Q(event.timestamp) if event.timestamp else b"") + _field(2, event.name.encode())
        parts.append(_field(11, body + _attributes(3, event.attributes) + _count(4, event.dropped_attributes)))
    parts.append(_count(12, span.dropped_events))
    for link in span.links:
        linked = link.context
        body = (_field(1, linked.trace_id.to_bytes(16, "big")) + _field(2, linked.span_id.to_bytes(8, "big"))
                + _attributes(4, link.attributes) + _count(5, link.dropped_attributes)
                + b"\x35" + _I(_flags(link.context)))
        parts.append(_field(13, body))
    parts.append(_count(14, span.dropped_links))
    status = span.status
    code = status.status_code.value
    parts.append(_field(15, (_field(2, status.description.encode()) if status.description else b"")
                        + (b"\x18" + _varint(code) if code else b"")))
    parts.append(b"\x85\x01" + _I(_flags(parent)))
    return b"".join(parts)


def encode_spans(spans: Iterable[ReadableSpan]) -> bytes:
    """``ExportTraceServiceRequest`` bytes: spans grouped by resource, then by instrumentation scope."""
    grouped: dict[int, tuple[Any, dict[Any, list[bytes]]]] = {}
    for span in spans:
        resource = span.resource
        entry = grouped.get(id(resource))
        if entry is None:
            entry = grouped[id(resource)] = (resource, {})
        entry[1].setdefault(span.instrumentation_scope, []).append(_field(2, _span(span)))
    out = []
    for resource, scopes in grouped.values():
        body = [_field(1, _attributes(1, resource.attributes))]
        for scope, encoded in scopes.items():
            head = b""
            if scope is not None:
                head = _field(1, (_field(1, scope.name.encode()) if scope.name else b"")
                              + (_field(2, scope.version.encode()) if scope.version else b"")
                              + _attributes(3, scope.attributes))
            tail = _field(3, scope.schema_url.encode()) if scope is not None and scope.schema_url else b""
            body.append(_field(2, head + b"".join(encoded) + tail))
        if resource.schema_url:
            body.append(_field(3, resource.schema_url.encode()))
        out.append(_field(1, b"".join(body)))
    return b"".join(out)


@dataclass(frozen=True)
class ExporterOptions:
    """Where and how spans are posted (:func:`exporter_options`)."""

    endpoint: str | None
    headers: dict[str, str] = field(default_factory=dict, repr=False)  #: may hold credentials
    compression: str | None = None  #: None or "gzip"
    certificate: str | None = None  #: a CA bundle for an https endpoint


def _env(environ: Mapping[str, str], name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>`` (the signal's own first)."""
    for key in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(key, "").strip()
        if value:
            return value
    return None


def parse_headers(raw: str) -> dict[str, str]:
    """The specification's ``key1=value1,key2=value2`` (values URL-encoded); malformed pairs are skipped.
    As ``opentelemetry.util.re.parse_env_headers(liberal=True)`` parses them, but silently: that one logs a
    malformed pair's text, which may hold a credential."""
    out: dict[str, str] = {}
    for pair in raw.split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            out[urllib.parse.unquote(key.strip()).lower()] = urllib.parse.unquote(value.strip())
    return out


def exporter_options(configured: str | None, environ: Mapping[str, str] | None = None) -> ExporterOptions:
    """The exporter's options from Baton's ``telemetry.otlp_endpoint`` (a base URL; ``/v1/traces`` is added)
    and the standard ``OTEL_EXPORTER_OTLP_*`` variables: without Baton's setting, the traces endpoint
    variable as it is, or the generic one with ``/v1/traces``. Raises ``ValueError`` for what Baton's
    exporter cannot do (gRPC, a compression other than gzip)."""
    env = os.environ if environ is None else environ
    protocol = _env(env, "PROTOCOL")
    if protocol is not None and protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: Baton exports traces over OTLP/HTTP with "
                         "protobuf ('http/protobuf'); point it at the collector's HTTP port (4318)")
    compression = _env(env, "COMPRESSION")
    if compression is not None and compression not in ("gzip", "none"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_COMPRESSION={compression!r}: 'gzip' or 'none'")
    if configured:
        endpoint: str | None = configured.rstrip("/") + "/v1/traces"
    elif (traces := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()):
        endpoint = traces
    elif (base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()):
        endpoint = base.rstrip("/") + "/v1/traces"
    else:
        endpoint = None
    raw = _env(env, "HEADERS")
    return ExporterOptions(endpoint=endpoint, headers=parse_headers(raw) if raw else {},
                           compression="gzip" if compression == "gzip" else None,
                           certificate=_env(env, "CERTIFICATE"))


class OtlpHttpExporter(SpanExporter):
    """Posts :func:`encode_spans` batches to ``endpoint`` (``.../v1/traces``), with ``headers`` and gzip
    when asked (:class:`ExporterOptions`)."""

    def __init__(self, endpoint: str, *, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None,
                 compression: str | None = None, certificate: str | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._headers = {**(headers or {}), "content-type": "application/x-protobuf"}
        if compression == "gzip":
            self._headers["content-encoding"] = "gzip"
        self._gzip = compression == "gzip"
        self._ssl = ssl.create_default_context(cafile=certificate) if certificate else None
        self._shutdown = False
        self._warned = 0.0  # when a lost batch was last logged (at most one line a minute)

    @classmethod
    def of(cls, options: ExporterOptions, *, timeout_s: float = 2.0) -> OtlpHttpExporter:
        assert options.endpoint is not None
        return cls(options.endpoint, timeout_s=timeout_s, headers=options.headers,
                   compression=options.compression, certificate=options.certificate)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        data = encode_spans(spans)
        if self._gzip:
            data = gzip.compress(data, compresslevel=6)
        deadline = time.monotonic() + self.timeout_s
        for attempt in (1, 2):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            request = urllib.request.Request(self.endpoint, data=data, method="POST",  # noqa: S310 - http(s) only
                                             headers=self._headers)
            try:
                with urllib.request.urlopen(request, timeout=left, context=self._ssl) as response:  # noqa: S310
                    if 200 <= response.status < 300:
                        return SpanExportResult.SUCCESS
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code != 429:
                    self._lost(f"{len(spans)} spans refused by the trace collector (HTTP {exc.code})")
                    return SpanExportResult.FAILURE
            except (OSError, ValueError):
                pass
            if attempt == 1:
                time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        self._lost(f"{len(spans)} spans not exported: the trace collector at {self.endpoint} did not take them")
        return SpanExportResult.FAILURE

    def _lost(self, why: str) -> None:
        now = time.monotonic()
        if now - self._warned >= 60:
            self._warned = now
            log.warning("%s (said at most once a minute)", why)

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
