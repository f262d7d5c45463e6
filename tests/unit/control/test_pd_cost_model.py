"""The planner's cost model: the seed's formulas exactly, and the trade-offs it is meant to capture."""

from __future__ import annotations

import datetime as dt

import pytest

from baton.control import pd_cost_model as cost


def test_kv_bytes_is_the_seed_formula() -> None:
    # 32 layers, 8 KV heads, head_dim 128, BF16, 4096 tokens: 512 MiB.
    n = cost.kv_bytes(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", tokens=4096)
    assert n == 2 * 32 * 8 * 128 * 4096 * 2 == 536_870_912 == 512 * 2**20


@pytest.mark.parametrize(("dtype", "size"), [("float32", 4), ("bfloat16", 2), ("float16", 2), ("fp8", 1)])
def test_kv_bytes_scales_with_the_element_size(dtype: str, size: int) -> None:
    n = cost.kv_bytes(num_layers=2, num_kv_heads=2, head_dim=32, dtype=dtype, tokens=10)
    assert n == 2 * 2 * 2 * 32 * 10 * size


def test_transfer_lower_bound_is_bytes_over_bandwidth() -> None:
    assert cost.transfer_lower_bound_s(536_870_912, 1.9) == pytest.approx(536_870_912 / 1.9e9)


SHAPE = cost.ModelShape(32, 8, 128, "bfloat16", params_b=8.0)


def _plan(**traffic: float) -> cost.Plan:
    hw = cost.Hardware(prefill_tokens_per_s=10_000, decode_step_ms=15, decode_ms_per_seq=0.2,
                       memory_bytes=80e9, link_bandwidth_gbps=25)
    t = cost.Traffic.lognormal(prompt_mean=traffic.get("prompt", 2048), output_mean=traffic.get("output", 256),
                               arrival_rate=traffic.get("rate"))
    return cost.plan(SHAPE, hw, t, cost.Slo(ttft_ms=1000, tpot_ms=30))


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
    hw = cost.Hardware(prefill_tokens_per_s=10_000, decode_step_ms=15, decode_ms_per_seq=0.2, link_bandwidth_gbps=0.05)
    t = cost.Traffic.lognormal(prompt_mean=4096, output_mean=256)
    p = cost.plan(SHAPE, hw, t, cost.Slo(ttft_ms=1000, tpot_ms=30))
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
    cal = cost.calibrate(records, cost.Hardware(link_bandwidth_gbps=1.9))
    assert cal is not None and cal.samples == 11
    assert cal.hardware.prefill_tokens_per_s == pytest.approx(1000 / 0.1, rel=0.1)
    assert cal.hardware.decode_step_ms == pytest.approx(5.1)
    assert cal.hardware.transfer_efficiency == pytest.approx(1_900_000 / 0.002 / 1.9e9)
    assert cal.traffic.arrival_rate == pytest.approx(1.0)
    assert cost.calibrate(records[:3], cost.Hardware()) is None


def test_plot_renders_png_and_svg() -> None:
    p = _plan()
    assert cost.render_plot(p, "png")[:4] == b"\x89PNG"
    assert b"<svg" in cost.render_plot(p, "svg")


def test_the_narrow_plot_stacks_its_charts() -> None:
    p = _plan()
    wide, narrow = cost.plot_figure(p), cost.plot_figure(p, "narrow")
    (w1, w2), (n1, n2) = [(f.axes[0].get_position(), f.axes[1].get_position()) for f in (wide, narrow)]
    assert w1.x1 <= w2.x0 and abs(w1.y0 - w2.y0) < 0.05  # side by side
    assert n2.y1 <= n1.y0 and abs(n1.x0 - n2.x0) < 0.05  # one above the other
    assert narrow.get_figheight() > narrow.get_figwidth() and wide.get_figwidth() > wide.get_figheight()


# --- when nothing meets the SLO -------------------------------------------------------------------

HW = cost.Hardware(prefill_tokens_per_s=10_000, decode_step_ms=15, decode_ms_per_seq=0.2, memory_bytes=80e9,
                   link_bandwidth_gbps=25)


def _traffic() -> cost.Traffic:
    return cost.Traffic.lognormal(prompt_mean=2048, output_mean=256)


@pytest.mark.parametrize(("slo", "loosened"), [(cost.Slo(ttft_ms=5, tpot_ms=30), "ttft_ms"),
                                               (cost.Slo(ttft_ms=1000, tpot_ms=1), "tpot_ms")])
def test_an_unmeetable_slo_gets_no_recommendation_but_the_closest_and_what_would_meet_it(
        slo: cost.Slo, loosened: str) -> None:
    p = cost.plan(SHAPE, HW, _traffic(), slo)
    assert not p.feasible and p.recommended is None
    assert all(c.goodput_per_gpu == 0 for c in p.configs)
    d = p.as_dict()
    assert d["recommendation"] is None and d["closest"]["name"] == p.closest
    assert "Nothing meets this SLO" in p.reason
    assert p.to_meet, "a way to meet the SLO is offered"
    remedy = p.to_meet[0]
    assert loosened in remedy.changes and remedy.changes[loosened] > getattr(slo, loosened)
    # the remedy was checked: planning again with it finds a configuration within the SLO
    again = cost.plan(SHAPE, HW, _traffic(), cost.Slo(**{**slo.__dict__, **remedy.changes}))
    assert again.feasible and again.recommended == remedy.then["recommended"]


def test_a_meetable_slo_is_feasible_with_a_recommendation() -> None:
    p = cost.plan(SHAPE, HW, _traffic(), cost.Slo(ttft_ms=1000, tpot_ms=30))
    assert p.feasible and p.recommended and p.closest is None and p.to_meet == []
    assert p.as_dict()["recommendation"]["name"] == p.recommended


def test_the_plot_of_an_unmeetable_slo_draws_attainment_on_a_real_axis() -> None:
    import io

    from PIL import Image

    p = cost.plan(SHAPE, HW, _traffic(), cost.Slo(ttft_ms=260, tpot_ms=30))
    assert not p.feasible and max(c.slo_attainment for c in p.configs) > 0
    png = cost.render_plot(p)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    # the closest configuration's bar is drawn in orange (tab:orange), none green (no recommendation)
    colours = {c for _, c in img.getcolors(maxcolors=1 << 24) or []}
    assert (255, 127, 14) in colours
    assert (44, 160, 44) not in colours


def test_calibration_leaves_out_impossible_tpots() -> None:
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    recs = [{"prompt_tokens": 512, "completion_tokens": 128, "ttft_ms": 200.0 + i, "tpot_ms": 0.03,
             "handoff_ms": None, "kv_bytes": None, "started_at": t0 + dt.timedelta(seconds=i)} for i in range(20)]
    cal = cost.calibrate(recs, HW)
    assert cal is not None
    assert cal.hardware.decode_step_ms == HW.decode_step_ms  # kept from the settings, not 0.03 ms
    assert any("TPOT" in n for n in cal.notes)


def test_the_figure_of_an_unmeetable_slo_has_labelled_bars_on_a_non_degenerate_axis() -> None:
    # The fresh-box case: nothing meets the SLO, every goodput is 0.
    p = cost.plan(SHAPE, HW, _traffic(), cost.Slo(ttft_ms=5, tpot_ms=30))
    assert not p.feasible and all(c.goodput_per_gpu == 0 for c in p.configs)
    fig = cost.plot_figure(p)
    bars, curves = fig.axes[0], fig.axes[1]
    lo, hi = bars.get_ylim()
    assert lo == 0 and hi >= 100  # attainment in %, never -0.04..0.04
    assert "nothing meets the SLO" in bars.get_title()
    assert len([t for t in bars.texts if t.get_text().endswith("%")]) == len(p.configs)
    x0, x1 = curves.get_xlim()
    assert x1 > x0 and any(len(line.get_xdata()) > 1 for line in curves.get_lines())


def test_the_figure_of_a_meetable_slo_labels_each_goodput() -> None:
    p = cost.plan(SHAPE, HW, _traffic(), cost.Slo(ttft_ms=1000, tpot_ms=30))
    bars = cost.plot_figure(p).axes[0]
    assert bars.get_ylim()[1] > max(c.goodput_per_gpu for c in p.configs) > 0
    assert [t.get_text() for t in bars.texts] == [f"{c.goodput_per_gpu:.3g}" for c in p.configs]


T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _record(i: int, *, start_s: float, ttft: float, tpot: float, e2e_s: float) -> dict:  # type: ignore[type-arg]
    start = T0 + dt.timedelta(seconds=start_s)
    return {"prompt_tokens": 512, "completion_tokens": 128, "ttft_ms": ttft, "tpot_ms": tpot, "handoff_ms": None,
            "kv_bytes": None, "started_at": start, "finished_at": start + dt.timedelta(seconds=e2e_s)}


def test_a_saturated_box_is_not_calibrated_from() -> None:
    # 371 requests measured on a saturated box: each queued ~6.4 s, its answer flushed at once.
    recs = [_record(i, start_s=i * 0.1, ttft=6400.0, tpot=0.03, e2e_s=6.5) for i in range(371)]
    base = cost.Hardware(prefill_tokens_per_s=20_000, decode_step_ms=5, decode_ms_per_seq=0.3)
    cal = cost.calibrate(recs, base)
    assert cal is not None and cal.samples == 371 and cal.used == 0
    assert cal.hardware == base  # the settings' figures, not 80 tokens/s and 0.03 ms
    assert cal.rejected == {"coalesced": 371}
    assert any("burst" in n for n in cal.notes) and any("settings" in n for n in cal.notes)
    # and the 512/128 plan from those figures meets a 1 s / 50 ms SLO
    t = cost.Traffic.lognormal(prompt_mean=512, output_mean=128)
    p = cost.plan(cost.ModelShape(2, 2, 32, "float32", 0.01), cal.hardware, t, cost.Slo(1000, 50))
    assert p.feasible and p.recommended


def test_calibration_uses_only_requests_that_ran_alone() -> None:
    alone = [_record(i, start_s=100 + i * 10, ttft=50.0, tpot=5.0, e2e_s=1.0) for i in range(8)]
    # a burst of 40 overlapping requests: their TTFTs are queueing
    loaded = [_record(i, start_s=i * 0.05, ttft=3000.0 + i, tpot=40.0, e2e_s=8.0) for i in range(40)]
    cal = cost.calibrate(alone + loaded, cost.Hardware())
    assert cal is not None and cal.used == 8 and cal.rejected == {"loaded": 40}
    assert cal.hardware.prefill_tokens_per_s == pytest.approx(512 / 0.05)
    assert cal.hardware.decode_step_ms == pytest.approx(5.0)
    assert len(cal.traffic.prompt_tokens) == 48  # the mix is every request's
