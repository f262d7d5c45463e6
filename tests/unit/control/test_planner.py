"""The planner's cost model: the seed's formulas exactly, and the trade-offs it is meant to capture."""

from __future__ import annotations

import datetime as dt

import pytest

from baton.control import planner as pl


def test_kv_bytes_is_the_seed_formula() -> None:
    # 32 layers, 8 KV heads, head_dim 128, BF16, 4096 tokens: 512 MiB.
    n = pl.kv_bytes(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", tokens=4096)
    assert n == 2 * 32 * 8 * 128 * 4096 * 2 == 536_870_912 == 512 * 2**20


@pytest.mark.parametrize(("dtype", "size"), [("float32", 4), ("bfloat16", 2), ("float16", 2), ("fp8", 1)])
def test_kv_bytes_scales_with_the_element_size(dtype: str, size: int) -> None:
    assert pl.kv_bytes(num_layers=2, num_kv_heads=2, head_dim=32, dtype=dtype, tokens=10) == 2 * 2 * 2 * 32 * 10 * size


def test_transfer_lower_bound_is_bytes_over_bandwidth() -> None:
    assert pl.transfer_lower_bound_s(536_870_912, 1.9) == pytest.approx(536_870_912 / 1.9e9)


SHAPE = pl.ModelShape(32, 8, 128, "bfloat16", params_b=8.0)


def _plan(**traffic: float) -> pl.Plan:
    hw = pl.Hardware(prefill_tokens_per_s=10_000, decode_step_ms=15, decode_ms_per_seq=0.2,
                     memory_bytes=80e9, link_bandwidth_gbps=25)
    t = pl.Traffic.lognormal(prompt_mean=traffic.get("prompt", 2048), output_mean=traffic.get("output", 256),
                             arrival_rate=traffic.get("rate"))
    return pl.plan(SHAPE, hw, t, pl.Slo(ttft_ms=1000, tpot_ms=30))


def test_plan_reports_the_handoff_and_every_configuration() -> None:
    p = _plan()
    assert p.kv_bytes_per_token == 131_072
    assert p.transfer_lower_bound_ms == pytest.approx(p.kv_bytes_per_request / 25e9 * 1000)
    names = [c.name for c in p.configs]
    assert names[0] == "aggregated" and {"pd 1:1", "pd 1:2", "pd 2:1", "pd 1:3"} <= set(names)
    assert p.recommended in names
    for c in p.configs:
        assert c.goodput_per_gpu >= 0
        if c.goodput_per_gpu > 0:  # at its goodput a configuration meets both SLOs
            assert c.ttft_ms <= 1000 * 1.001 and c.tpot_ms <= 30 * 1.001


def test_long_prompts_with_a_tight_tpot_favour_disaggregation() -> None:
    p = _plan(prompt=2048, output=256)
    best = next(c for c in p.configs if c.name == p.recommended)
    assert best.prefill > 0
    assert p.configs[0].bottleneck.startswith("TPOT")  # aggregated loses to prefill interference


def test_short_prompts_stay_aggregated() -> None:
    p = _plan(prompt=64, output=512)
    assert p.recommended == "aggregated"


def test_a_slow_link_makes_disaggregation_lose() -> None:
    hw = pl.Hardware(prefill_tokens_per_s=10_000, decode_step_ms=15, decode_ms_per_seq=0.2, link_bandwidth_gbps=0.05)
    t = pl.Traffic.lognormal(prompt_mean=4096, output_mean=256)
    p = pl.plan(SHAPE, hw, t, pl.Slo(ttft_ms=1000, tpot_ms=30))
    assert p.recommended == "aggregated"


def test_small_loads_count_the_minimum_footprint() -> None:
    p = _plan(prompt=4096, rate=0.2)
    agg = p.configs[0]
    assert agg.gpus_needed == 1
    assert all(c.gpus_needed is None or c.gpus_needed >= c.gpus for c in p.configs)


def test_calibration_reads_throughput_and_mix_from_records() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    records = [
        {"prompt_tokens": 1000, "completion_tokens": 50, "ttft_ms": 100.0 + i, "tpot_ms": 5.0 + i / 10,
         "handoff_ms": 2.0, "kv_bytes": 1_900_000, "started_at": t0 + dt.timedelta(seconds=i)}
        for i in range(11)
    ]
    cal = pl.calibrate(records, pl.Hardware(link_bandwidth_gbps=1.9))
    assert cal is not None and cal.samples == 11
    assert cal.hardware.prefill_tokens_per_s == pytest.approx(1000 / 0.1, rel=0.1)
    assert cal.hardware.decode_step_ms == pytest.approx(5.1)
    assert cal.hardware.transfer_efficiency == pytest.approx(1_900_000 / 0.002 / 1.9e9)
    assert cal.traffic.arrival_rate == pytest.approx(1.0)
    assert pl.calibrate(records[:3], pl.Hardware()) is None


def test_plot_renders_png_and_svg() -> None:
    p = _plan()
    assert pl.render_plot(p, "png")[:4] == b"\x89PNG"
    assert b"<svg" in pl.render_plot(p, "svg")
