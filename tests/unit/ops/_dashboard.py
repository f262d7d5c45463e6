"""The dashboard's metric contract: ops/grafana/metrics.yaml, the queries of ops/grafana/baton.json,
and a check of a live Prometheus exposition against the contract."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
GRAFANA = ROOT / "ops" / "grafana"

# PromQL words that look like identifiers but are not metric names.
_KEYWORDS = {"bool", "and", "or", "unless", "offset", "inf", "nan", "atan2", "group_left", "group_right"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


@dataclass(frozen=True)
class Metric:
    name: str
    source: str
    type: str
    labels: tuple[str, ...]

    def series(self) -> set[str]:
        """Names this metric's samples carry in the exposition (what PromQL selects)."""
        return {self.name + s for s in _SUFFIXES.get(self.type, ("",))}

    def series_labels(self, series: str) -> set[str]:
        return set(self.labels) | ({"le"} if series.endswith("_bucket") else set())


@dataclass(frozen=True)
class Contract:
    metrics: tuple[Metric, ...]
    scrape_labels: frozenset[str]

    def by_series(self) -> dict[str, Metric]:
        return {s: m for m in self.metrics for s in m.series()}


def load_contract() -> Contract:
    doc = yaml.safe_load((GRAFANA / "metrics.yaml").read_text())
    return Contract(
        metrics=tuple(Metric(m["name"], m["source"], m["type"], tuple(m["labels"])) for m in doc["metrics"]),
        scrape_labels=frozenset(doc["scrape_labels"]),
    )


def load_dashboard() -> dict[str, Any]:
    return json.loads((GRAFANA / "baton.json").read_text())


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in _walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*([A-Za-z_]\w*)\s*\)", q)
            assert m, f"variable {var['name']}: unsupported query {q!r}"
            yield f"variable {var['name']}", f"count by ({m.group(2)}) ({m.group(1)})"


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _walk_panels(p.get("panels", []))


@dataclass(frozen=True)
class Parsed:
    series: frozenset[str]
    #: label names used in a selector, per series
    selector_labels: dict[str, frozenset[str]]
    #: label names used in by/without/on/ignoring clauses
    grouping_labels: frozenset[str]


def parse(expr: str) -> Parsed:
    """Metric names and label names a PromQL expression uses (the subset Baton's dashboard writes)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    s = re.sub(r"\$\{?\w+\}?", "", s)  # Grafana variables ($tenant, $__rate_interval)
    s = re.sub(r"\[[^\]]*\]", "", s)  # range and subquery durations
    s = re.sub(r"(?<![A-Za-z0-9_:])\d[\w.]*", " ", s)  # numbers and durations (0.99, 5m, 1e3)
    grouping: set[str] = set()
    for m in _GROUPING.finditer(s):
        grouping |= {x.strip() for x in m.group(2).split(",") if x.strip()}
    s = _GROUPING.sub(" ", s)
    selector_labels: dict[str, frozenset[str]] = {}
    for m in _MATCHERS.finditer(s):
        if m.group(1):
            names = frozenset(_IDENT.match(x.strip()).group(0) for x in m.group(2).split(",") if x.strip())  # type: ignore[union-attr]
            selector_labels[m.group(1)] = selector_labels.get(m.group(1), frozenset()) | names
    s = _MATCHERS.sub(lambda m: f" {m.group(1) or ''} ", s)
    series = set()
    for m in _IDENT.finditer(s):
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        series.add(m.group(0))
    return Parsed(frozenset(series), selector_labels, frozenset(grouping))


def exposition_families(text: str) -> dict[str, tuple[str, set[str], set[str]]]:
    """series name -> (type, family name, label names seen) from a Prometheus text exposition.

    A labelled metric that has not been observed yet has no samples but still shows its `# TYPE` line:
    its series count as present, with no labels seen."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[str, set[str], set[str]]] = {}
    for fam in text_string_to_metric_families(text):
        kind = fam.type
        names = {fam.name + s for s in _SUFFIXES.get(kind, ("",))}
        if kind == "counter":
            names = {fam.name + "_total"}
        labels: set[str] = set()
        for sample in fam.samples:
            if not sample.name.endswith("_created"):
                names.add(sample.name)
                labels |= set(sample.labels)
        for n in names:
            out[n] = (kind, fam.name, labels)
    return out


def check_exposition(text: str, contract: Contract, source: str) -> list[str]:
    """Problems of a live /metrics body against the contract's entries for ``source``."""
    live = exposition_families(text)
    problems = []
    for m in contract.metrics:
        if m.source != source:
            continue
        for series in sorted(m.series()):
            if series not in live:
                problems.append(f"{series}: not exported")
                continue
            kind, _, labels = live[series]
            if kind != m.type:
                problems.append(f"{series}: exported as {kind}, the dashboard expects {m.type}")
            if labels and not set(m.labels) <= labels:
                problems.append(f"{series}: labels {sorted(labels)} lack {sorted(set(m.labels) - labels)}")
    return problems
