from __future__ import annotations

import uuid

from prometheus_client.parser import text_string_to_metric_families

from baton.api.gateway.metering import Outcome
from baton.api.gateway.metrics import GatewayMetrics
from baton.core import models as m


def _sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def _outcome(tenant: uuid.UUID) -> Outcome:
    return Outcome(request_id=uuid.uuid4(), tenant_id=tenant, api_key_id=None, model="tiny",
                   endpoint="chat/completions", stream=True, started=0.0, start_pc=10.0, first_token=10.05,
                   end_pc=10.25, completion_tokens=5, gaps=[0.05, 0.05, 0.05, 0.05], kv_bytes=1_048_576,
                   handoff_ms=2.0, recovery_steps=[{"step": "decode_resume", "outcome": "recovered"}])


def test_one_outcome_feeds_every_request_series_once() -> None:
    metrics = GatewayMetrics(tenant_labels=True)
    tenant = uuid.uuid4()
    o = _outcome(tenant)
    metrics.admitted("tiny")
    metrics.finished("tiny")
    metrics.observe(o, slo_ttft_ms=100, slo_tpot_ms=10)
    text = metrics.exposition().decode()
    t = str(tenant)
    assert _sample(text, "baton_requests_total", tenant=t, model="tiny", outcome="completed") == 1
    assert _sample(text, "baton_request_ttft_seconds_count", tenant=t, model="tiny") == 1
    assert abs(_sample(text, "baton_request_ttft_seconds_sum", tenant=t, model="tiny") - 0.05) < 1e-9
    assert abs(_sample(text, "baton_request_tpot_seconds_sum", tenant=t, model="tiny") - 0.05) < 1e-9
    assert _sample(text, "baton_request_itl_seconds_count", tenant=t, model="tiny") == 4
    assert _sample(text, "baton_kv_handoff_bytes_sum", model="tiny") == 1_048_576
    assert _sample(text, "baton_recovery_events_total", model="tiny", step="decode_resume", outcome="recovered") == 1
    assert _sample(text, "baton_slo_requests_total", tenant=t, model="tiny", attained="false") == 1
    assert _sample(text, "baton_requests_in_flight", model="tiny") == 0
    assert o.status is m.RequestStatus.COMPLETED


def test_without_the_opt_in_no_series_names_a_tenant() -> None:
    metrics = GatewayMetrics()
    tenant = uuid.uuid4()
    metrics.observe(_outcome(tenant), slo_ttft_ms=100, slo_tpot_ms=10)
    metrics.rejected(str(tenant), "tiny")
    metrics.flow_rejected_by(tenant, "tiny", "ttl")
    text = metrics.exposition().decode()
    assert str(tenant) not in text
    # the empty label is no label to Prometheus: the series add up per model
    assert _sample(text, "baton_requests_total", tenant="", model="tiny", outcome="completed") == 1
    assert _sample(text, "baton_flow_rejected_total", tenant="", model="tiny", reason="ttl") == 1
