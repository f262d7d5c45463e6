"""Shared by the data plane's unit tests."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.core import telemetry as t
from baton.core.settings import TelemetrySettings
from baton.dataplane import tracing as dp_tracing


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The replica process's tracing (:func:`baton.dataplane.tracing.tracing_from_env`) into memory."""
    exporter = InMemorySpanExporter()
    monkeypatch.setattr(dp_tracing, "_tracing",
                        t.setup_tracing(TelemetrySettings(service_name="engine"), exporter=exporter, batch=False))
    return exporter
