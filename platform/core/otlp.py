"""Where and how spans are exported: OTLP/HTTP with protobuf, by OpenTelemetry's own exporter.

The OpenTelemetry exporter settings a hosted tracing backend needs are honoured as the specification
names them (:func:`exporter_options`): ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` where Baton's own
``telemetry.otlp_endpoint`` is not set, ``..._HEADERS`` (``key=value,...``, values URL-encoded; never
logged), ``..._COMPRESSION`` (``gzip``) and ``..._CERTIFICATE`` (a CA bundle for https). The protocol is
OTLP/HTTP with protobuf; ``..._PROTOCOL=grpc`` is refused with a clear message at start-up.

Baton encoded spans by hand until the gateway bench weighed that against OpenTelemetry's exporter in one
run (``docs/benchmarks.md``, "Hand-written parts against their libraries"): the exporter's arm used no
more gateway CPU per request, short of the 15% saving that would keep a part of Baton's own.
:func:`new_exporter` builds the library's.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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


def new_exporter(options: ExporterOptions, *, timeout_s: float = 2.0) -> Any:
    """OpenTelemetry's OTLP/HTTP span exporter for ``options`` (its endpoint set)."""
    # deferred: the exporter and its protobuf classes, only when tracing exports
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    gzip = options.compression == "gzip"
    return OTLPSpanExporter(endpoint=options.endpoint, headers=options.headers, timeout=timeout_s,
                            certificate_file=options.certificate,
                            compression=Compression.Gzip if gzip else Compression.NoCompression)
