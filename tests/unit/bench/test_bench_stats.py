"""The benchmark statistics on known inputs: percentiles, vLLM's TTFT/TPOT/ITL definitions, goodput
with failures as misses, reproducible Poisson arrivals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from baton.bench.stats import (
    RequestResult,
    added_latency,
    describe,
    is_good,
    parse_goodput,
    percentile,
    poisson_arrivals,
    summarize,
)


def test_percentile_interpolates_linearly_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 11)), 90) == pytest.approx(9.1)
    assert percentile(list(range(101)), 99) == 99
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    rng = np.random.default_rng(1)
    xs = list(rng.exponential(3.0, 257))
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_describe_scales_and_names_percentiles() -> None:
    d = describe([0.001, 0.002, 0.003], (50, 99.9), scale=1000)
    assert d["mean"] == pytest.approx(2.0)
    assert d["median"] == pytest.approx(2.0)
    assert d["p50"] == pytest.approx(2.0)
    assert d["p99.9"] == pytest.approx(2.998)
    assert d["min"] == pytest.approx(1.0) and d["max"] == pytest.approx(3.0)


def _req(ttft: float, gaps: list[float], *, tokens: int | None = None, ok: bool = True) -> RequestResult:
    latency = ttft + sum(gaps)
    return RequestResult(success=ok, prompt_len=10, output_tokens=tokens if tokens is not None else len(gaps) + 1,
                         ttft=ttft, latency=latency, itl=list(gaps))


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    r = _req(0.100, [0.010, 0.020, 0.030])  # 4 tokens, e2e 0.160
    assert r.latency == pytest.approx(0.160)
    assert r.tpot == pytest.approx((0.160 - 0.100) / 3)
    assert _req(0.05, [], tokens=1).tpot == 0.0


def test_summary_uses_vllm_definitions() -> None:
    a = _req(0.100, [0.010, 0.020, 0.030])          # tpot 20 ms
    b = _req(0.300, [0.040])                        # tpot 40 ms
    c = _req(0.200, [], tokens=1)                   # one token: no TPOT sample, no ITL sample
    failed = RequestResult(success=False, prompt_len=10, error="HTTP 503: busy")
    s = summarize([a, b, c, failed], duration=2.0, percentiles=(50, 99))
    assert (s["num_requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["errors"] == {"HTTP 503: busy": 1}
    # TTFT over successful requests only
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    # TPOT over requests with more than one token
    assert s["tpot_ms"]["count"] == 2
    assert s["tpot_ms"]["mean"] == pytest.approx(30.0)
    # ITL: every gap of every request is one sample
    assert s["itl_ms"]["count"] == 4
    assert s["itl_ms"]["mean"] == pytest.approx(25.0)
    assert s["itl_ms"]["p50"] == pytest.approx(25.0)
    # E2EL
    assert s["e2el_ms"]["p50"] == pytest.approx(200.0)
    # throughput counts successful requests and their tokens
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["total_output_tokens"] == 4 + 2 + 1
    assert s["output_throughput"] == pytest.approx(3.5)
    assert s["total_token_throughput"] == pytest.approx((30 + 7) / 2.0)


def test_goodput_counts_failures_as_misses() -> None:
    good = _req(0.050, [0.010, 0.010])         # ttft 50 ms, tpot 10 ms
    slow_first = _req(0.500, [0.010, 0.010])   # misses ttft
    slow_decode = _req(0.050, [0.100, 0.100])  # misses tpot
    failed = RequestResult(success=False, error="timeout")
    slo = parse_goodput(["ttft:200", "tpot:50"])
    assert slo == {"ttft": 200.0, "tpot": 50.0}
    assert [is_good(r, slo) for r in (good, slow_first, slow_decode, failed)] == [True, False, False, False]
    s = summarize([good, slow_first, slow_decode, failed], duration=4.0, slo=slo)
    assert s["good_requests"] == 1
    assert s["goodput"] == pytest.approx(0.25)
    assert s["goodput_fraction"] == pytest.approx(0.25)
    # a failed request with zero latency must not look good under any SLO
    assert not is_good(RequestResult(success=False), {"e2el": 1.0})


def test_goodput_limits_are_inclusive_and_e2el_works() -> None:
    r = _req(0.2, [0.05])
    assert is_good(r, {"ttft": 200.0, "e2el": 250.0})
    assert not is_good(r, {"e2el": 249.0})


@pytest.mark.parametrize("bad", ["ttft", "foo:1", "ttft:x", "ttft:-1", "tpot:0"])
def test_parse_goodput_rejects_bad_specs(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_goodput([bad])


def test_parse_goodput_accepts_one_string_with_both() -> None:
    assert parse_goodput(["ttft:100 tpot:20"]) == {"ttft": 100.0, "tpot": 20.0}


def test_poisson_arrivals_are_reproducible_from_the_seed() -> None:
    a = poisson_arrivals(1000, 10.0, seed=7)
    assert a == poisson_arrivals(1000, 10.0, seed=7)
    assert a != poisson_arrivals(1000, 10.0, seed=8)
    assert a[0] == 0.0
    assert all(y >= x for x, y in itertools.pairwise(a))
    gaps = np.diff(a)
    # exponential gaps: mean 1/rate, coefficient of variation 1 (loose bounds, 999 samples)
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.15)


def test_infinite_rate_sends_everything_at_once_and_bad_rates_fail() -> None:
    assert poisson_arrivals(5, math.inf, seed=0) == [0.0] * 5
    with pytest.raises(ValueError):
        poisson_arrivals(5, 0.0, seed=0)


def test_burstiness_changes_the_spread_not_the_mean() -> None:
    a = np.diff(poisson_arrivals(4000, 5.0, seed=3, burstiness=4.0))
    assert a.mean() == pytest.approx(0.2, rel=0.1)
    assert a.std() / a.mean() == pytest.approx(0.5, rel=0.15)  # gamma CV = 1/sqrt(shape)


def test_added_latency_is_the_difference_of_percentiles() -> None:
    base = [1.0, 2.0, 3.0, 4.0, 5.0]
    other = [x + 0.5 for x in base]
    d = added_latency(base, other, (50, 99))
    assert d["p50"] == pytest.approx(0.5)
    assert d["p99"] == pytest.approx(0.5)
