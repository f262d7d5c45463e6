"""`baton bench gateway --upstream zero` end to end on a small load: Baton's real gateway (`baton gateway
run`, Postgres tenant and key, Redis limits) in front of the zero-latency stub, no engine."""

from __future__ import annotations

from pathlib import Path

from baton.bench.gateway import GatewayConfig, run_gateway

ROOT = Path(__file__).resolve().parents[3]


def test_gateway_bench_runs_every_arm_and_reports_added_latency(pg_url: str, tmp_path: Path) -> None:
    cfg = GatewayConfig(upstream="zero", tracing="both", litellm=False, blocks=2, block_size=4, warmup=1,
                        output_len=5, throughput_requests=30, throughput_concurrency=4, token_requests=20,
                        db_url=pg_url, model_dir=str(tmp_path / "no-model"), state_dir=str(tmp_path))
    res = run_gateway(cfg, log=lambda _m: None)
    (rnd,) = res["rounds"]
    assert set(rnd["arms"]) == {"direct", "baton", "baton-notrace", "baton-noflow"}
    for name, arm in rnd["arms"].items():
        assert arm["failed"] == 0, (name, arm["errors"])
        assert arm["completed"] == 2 * 4
        assert arm["total_output_tokens"] == 8 * 5
        assert arm["itl_ms"]["count"] == 8 * 4
    assert rnd["arms"]["direct"]["proxy_cpu_ms_per_request"] is None
    # measured (8 requests can fit in one 10 ms tick of the process CPU clock, so it may read 0 here);
    # the throughput phase below is long enough to show CPU > 0
    assert rnd["arms"]["baton"]["proxy_cpu_ms_per_request"] >= 0
    for name in ("baton", "baton-notrace"):
        assert set(rnd["added"][name]) == {"ttft_ms", "itl_ms", "e2el_ms"}
        assert set(rnd["added"][name]["ttft_ms"]) == {"p50", "p99"}
    assert "tracing_overhead" in rnd["ratios"]
    # flow control's cost when nothing queues: the same gateway with it off, side by side
    assert set(rnd["ratios"]["flow_control_overhead"]) == {"ttft_p50_ms", "e2el_p50_ms", "cpu_ms_per_request"}
    tp = res["throughput"]["baton"]
    assert tp["completed"] == 30 and tp["requests_per_cpu_s"] > 0 and tp["rss_mb"] > 0
    assert res["headline"]["throughput"]["targets"] == {"requests_per_cpu_s": 2000, "rss_mb": 200,
                                                        "workers_over_one": 1.8}
    # per relayed token: each Baton arm served 20 requests of 1 and of 5 tokens; the figure is their difference
    pt = res["per_token"]
    for name in ("baton", "baton-notrace"):
        per_request = pt[name]["cpu_ms_per_request"]
        assert set(per_request) == {"1", "5"} and pt[name]["requests"] == 20
        assert pt[name]["cpu_ms_per_token"] == (per_request["5"] - per_request["1"]) / 4
    assert res["headline"]["per_token"]["target"] == 0.02
    # the bare byte relay: the reference of both phases, never in the latency rounds
    assert res["throughput"]["relay-floor"]["completed"] == 30 and "relay-floor" not in rnd["arms"]
    assert pt["relay-floor"]["requests"] == 20 and "relay-floor" in res["headline"]["per_token"]["cpu_ms_per_token"]
    # the same gateway with 2 worker processes, in the throughput phase only: both serve, both are counted
    two = res["throughput"]["baton-2w"]
    assert two["completed"] == 30 and two["requests_per_cpu_s"] > 0 and "baton-2w" not in rnd["arms"]
    assert res["headline"]["throughput"]["workers_over_one"] > 0
