"""Derived figures of the gateway, handoff and P/D benchmarks on known inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from baton.bench import gateway, handoff, report
from baton.bench.stats import RequestResult


def test_kv_bytes_follow_the_formula() -> None:
    tiny = {"layers": 2, "kv_heads": 2, "head_dim": 32}
    assert handoff.kv_bytes(tiny, 1) == 2 * 2 * 2 * 32 * 4 == 1024
    assert handoff.kv_bytes(tiny, 2048) == 2048 * 1024
    bench = {"layers": 8, "kv_heads": 8, "head_dim": 64}
    assert handoff.kv_bytes(bench, 1) == 32 * 1024


def test_nixl_metrics_are_summed_over_label_sets() -> None:
    text = "\n".join([
        "# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration",
        "# TYPE vllm:nixl_xfer_time_seconds histogram",
        'vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.001"} 1.0',
        'vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="tiny"} 0.0025',
        'vllm:nixl_xfer_time_seconds_count{engine="0",model_name="tiny"} 2.0',
        'vllm:nixl_xfer_time_seconds_count{engine="1",model_name="tiny"} 1.0',
        'vllm:nixl_bytes_transferred_sum{engine="0"} 2.097152e+06',
        "vllm:nixl_num_failed_transfers_total 0.0",
    ])
    m = handoff.parse_metrics(text, handoff.NIXL_METRICS)
    assert m["vllm:nixl_xfer_time_seconds_sum"] == pytest.approx(0.0025)
    assert m["vllm:nixl_xfer_time_seconds_count"] == 3.0
    assert m["vllm:nixl_bytes_transferred_sum"] == 2097152.0
    assert m["vllm:nixl_post_time_seconds_sum"] == 0.0


def test_memcpy_bandwidth_is_a_positive_rate() -> None:
    m = handoff.measure_memcpy(size_mb=8, repeats=3)
    assert m["bytes"] == 8 * 2**20
    assert m["best_GBps"] >= m["median_GBps"] > 0


def test_handoff_medians_by_length() -> None:
    rows = [{"prompt_len": 256, "kv_bytes": 262144, "nixl_bytes": 262144.0, "nixl_xfer_ms": x, "client_handoff_ms": 5.0,
             "ideal_memcpy_ms": 0.05, "ideal_link_ms": 0.14, "efficiency": 0.05 / x, "efficiency_client": 0.01,
             "prefill_ms": 10.0, "decode_ttft_ms": 6.0, "nixl_failed": 0.0} for x in (1.0, 2.0, 4.0)]
    (row,) = handoff._by_length(rows)
    assert row["nixl_xfer_ms"] == 2.0
    assert row["efficiency"] == pytest.approx(0.025)
    assert row["failed_transfers"] == 0


def _arm_round(added_baton: float, added_lite: float, cpu_b: float, cpu_l: float) -> dict:
    def add(v: float) -> dict:
        return {"ttft_ms": {"p50": v, "p99": 2 * v}, "itl_ms": {"p50": v / 10, "p99": v / 5},
                "e2el_ms": {"p50": v, "p99": 2 * v}}

    added = {"baton": add(added_baton), "baton-notrace": add(added_baton / 2), "litellm": add(added_lite)}
    arms = {"direct": {"proxy_cpu_ms_per_request": None}, "baton": {"proxy_cpu_ms_per_request": cpu_b},
            "baton-notrace": {"proxy_cpu_ms_per_request": cpu_b - 0.5}, "litellm": {"proxy_cpu_ms_per_request": cpu_l}}
    return {"concurrency": 1, "added": added, "arms": arms, "ratios": gateway._ratios(added, arms)}


def test_gateway_ratios_and_tracing_overhead() -> None:
    r = _arm_round(2.0, 40.0, 3.0, 120.0)
    assert r["ratios"]["baton_over_litellm"]["ttft_p50"] == pytest.approx(0.05)
    assert r["ratios"]["baton_over_litellm"]["cpu_per_request"] == pytest.approx(0.025)
    assert r["ratios"]["tracing_overhead"]["ttft_p50_ms"] == pytest.approx(1.0)
    assert r["ratios"]["tracing_overhead"]["cpu_ms_per_request"] == pytest.approx(0.5)
    h = gateway.headline({"rounds": [r]})
    assert h["baton"]["added_ttft_p50_ms"] == 2.0
    assert h["baton"]["added_itl_p50_ms"] == pytest.approx(0.2)
    assert h["litellm"]["cpu_ms_per_request"] == 120.0
    assert h["targets"]["added_ttft_p50_ms"] == 0.5


def test_ratio_is_undefined_when_litellm_adds_nothing() -> None:
    assert gateway._ratio(1.0, 0.0) is None
    assert gateway._ratio(1.0, -3.0) is None
    assert gateway._ratio(math.nan, 2.0) is None


def test_json_has_no_nan_or_inf(tmp_path: Path) -> None:
    prov = report.provenance(report.provenance())
    path = report.write_json(tmp_path / "x.json", {"a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf},
                                                   "provenance": prov})
    assert json.loads(path.read_text()) == {"a": None, "b": ["inf", 1.5], "c": {"d": "-inf"}, "provenance": prov}


def test_a_result_without_provenance_is_never_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="provenance"):
        report.write_json(tmp_path / "x.json", {"a": 1})
    with pytest.raises(ValueError, match="provenance"):
        report.write_json(tmp_path / "x.json", {"a": 1, "provenance": report.provenance()})  # no end
    assert not (tmp_path / "x.json").exists()


def test_provenance_says_commit_command_machine_load_time_and_versions() -> None:
    prov = report.provenance(report.provenance())
    assert len(prov["commit"]) == 40 and isinstance(prov["dirty"], bool)
    assert prov["command"] and prov["machine"]["cpus"] >= 1 and prov["machine"]["memory_gib"] > 0
    assert len(prov["start"]["loadavg"]) == 3 and prov["end"]["time"] >= prov["start"]["time"]
    assert "baton" in prov["versions"]


def test_default_out_is_under_var_bench() -> None:
    p = report.default_out("serve", "var")
    assert p.parent == Path("var/bench") and p.name.startswith("serve-") and p.suffix == ".json"


def test_latency_plot_is_written(tmp_path: Path) -> None:
    def run(rate: float) -> dict:
        d = {"p50": 1.0, "p99": 2.0}
        return {"request_rate": rate, "request_throughput": 3.0, "ttft_ms": d, "tpot_ms": d, "itl_ms": d}

    png = report.plot_latency_vs_rate(tmp_path / "p.png", [run(1.0), run(math.inf)], title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_request_result_round_trips_to_dict() -> None:
    r = RequestResult(success=True, output_tokens=3, ttft=0.1, latency=0.3, itl=[0.1, 0.1])
    assert r.to_dict()["itl"] == [0.1, 0.1]
