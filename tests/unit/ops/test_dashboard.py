"""The Grafana dashboard reads only metrics in ops/grafana/metrics.yaml, with labels they carry; the
live tests (tests/integration/ops) hold that list against real /metrics bodies."""

from __future__ import annotations

import pytest

from tests.unit.ops import _dashboard as dash


def test_every_query_uses_only_contract_metrics_and_their_labels() -> None:
    contract = dash.load_contract()
    by_series = contract.by_series()
    problems = []
    for where, expr in dash.queries(dash.load_dashboard()):
        parsed = dash.parse(expr)
        if not parsed.series:
            problems.append(f"{where}: reads no metric")
        known: set[str] = set(contract.scrape_labels)
        for series in parsed.series:
            metric = by_series.get(series)
            if metric is None:
                problems.append(f"{where}: {series} is not in ops/grafana/metrics.yaml")
                continue
            labels = metric.series_labels(series) | contract.scrape_labels
            known |= labels
            unknown = parsed.selector_labels.get(series, frozenset()) - labels
            if unknown:
                problems.append(f"{where}: {series} has no label {sorted(unknown)}")
        if parsed.grouping_labels - known:
            problems.append(f"{where}: groups by unknown labels {sorted(parsed.grouping_labels - known)}")
    assert problems == []


def test_the_dashboard_covers_what_operators_need() -> None:
    used = set().union(*(dash.parse(e).series for _, e in dash.queries(dash.load_dashboard())))
    for series in (
        "baton_request_ttft_seconds_bucket", "baton_request_tpot_seconds_bucket", "baton_request_itl_seconds_bucket",
        "baton_slo_requests_total", "baton_kv_handoff_bytes_sum", "baton_kv_handoff_seconds_bucket",
        "baton_recovery_events_total", "baton_pool_replicas",
    ):
        assert series in used, series


def test_every_contract_metric_is_used() -> None:
    used = set().union(*(dash.parse(e).series for _, e in dash.queries(dash.load_dashboard())))
    unused = [m.name for m in dash.load_contract().metrics if not (m.series() & used)]
    assert unused == []


def test_per_tenant_latency_panels_group_by_tenant() -> None:
    for where, expr in dash.queries(dash.load_dashboard()):
        if any(s.startswith(("baton_request_ttft", "baton_request_tpot", "baton_request_itl"))
               for s in dash.parse(expr).series) and where.startswith("panel"):
            assert "tenant" in dash.parse(expr).grouping_labels, where


def test_dashboard_is_well_formed() -> None:
    d = dash.load_dashboard()
    ids = [p["id"] for p in dash._walk_panels(d["panels"])]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "tenant", "model"}
    for p in dash._walk_panels(d["panels"]):
        assert {"h", "w", "x", "y"} <= set(p["gridPos"])
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize(
    ("expr", "series", "grouping"),
    [
        ('sum by (le, tenant) (rate(a_bucket{tenant=~"$t"}[$__rate_interval]))', {"a_bucket"}, {"le", "tenant"}),
        ("rate(x_total[5m]) / on (pod) group_left rate(y_total[5m]) > bool 0", {"x_total", "y_total"}, {"pod"}),
        ('vllm:kv_cache_usage_perc{model_name="m"} offset 5m', {"vllm:kv_cache_usage_perc"}, set()),
    ],
)
def test_promql_parser(expr: str, series: set[str], grouping: set[str]) -> None:
    parsed = dash.parse(expr)
    assert parsed.series == series
    assert parsed.grouping_labels == grouping


def _exposition(skip: str | None = None, counter_as_gauge: str | None = None) -> str:
    """A /metrics body from prometheus_client with the gateway's contract metrics (what the gateway
    must register), unobserved: labelled metrics show only their # TYPE lines."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    kinds = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
    for m in dash.load_contract().metrics:
        if m.source != "gateway" or m.name == skip:
            continue
        kind = "gauge" if m.name == counter_as_gauge else m.type
        name = m.name.removesuffix("_total") if kind == "counter" else m.name
        kinds[kind](name, m.name, list(m.labels), registry=reg)
    return generate_latest(reg).decode()


def test_exposition_check_accepts_a_conforming_gateway() -> None:
    assert dash.check_exposition(_exposition(), dash.load_contract(), "gateway") == []


def test_exposition_check_reports_missing_and_mistyped_metrics() -> None:
    contract = dash.load_contract()
    assert dash.check_exposition(_exposition(skip="baton_kv_handoff_bytes"), contract, "gateway") == [
        "baton_kv_handoff_bytes_bucket: not exported",
        "baton_kv_handoff_bytes_count: not exported",
        "baton_kv_handoff_bytes_sum: not exported",
    ]
    problems = dash.check_exposition(_exposition(counter_as_gauge="baton_requests_total"), contract, "gateway")
    assert problems == ["baton_requests_total: exported as gauge, the dashboard expects counter"]


def test_exposition_check_reports_missing_labels() -> None:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    Gauge("baton_pool_replicas", "x", ["deployment"], registry=reg).labels("d").set(1)
    text = generate_latest(reg).decode()
    problems = dash.check_exposition(text, dash.load_contract(), "gateway")
    assert "baton_pool_replicas: labels ['deployment'] lack ['pool', 'state']" in problems
