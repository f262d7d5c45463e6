"""The learned concurrency limit (baton.api.gateway.capacity) on made-up latencies and a hand-driven clock."""

from __future__ import annotations

import pytest

from baton.api.gateway.capacity import AdaptiveLimit, CapacitySettings
from baton.core.contracts import EngineLoad


def limit(**settings: float) -> tuple[AdaptiveLimit, dict[str, float]]:
    now = {"t": 0.0}
    base = {"initial": 8, "min_samples": 4, "update_every": 1, "slack_s": 0.0}
    return AdaptiveLimit(CapacitySettings(**{**base, **settings}), clock=lambda: now["t"]), now  # type: ignore[arg-type]


def feed(lim: AdaptiveLimit, n: int, *, ttft: float = 0.05, tpot: float = 0.01, saturated: bool = True) -> None:
    for _ in range(n):
        if saturated:
            lim.saturated()
        lim.observe(prompt_tokens=100, ttft_s=ttft, tpot_s=tpot)


def test_no_view_before_enough_requests_completed() -> None:
    lim, _ = limit()
    feed(lim, 3)
    assert lim.limit() is None  # the queue reads None as: no queue, limits only
    feed(lim, 1)
    assert lim.limit() is not None


def test_at_its_floor_a_limit_in_use_grows() -> None:
    lim, _ = limit()
    feed(lim, 4)
    start = lim.limit()
    feed(lim, 10)
    assert start is not None and lim.limit() is not None and lim.limit() > start  # type: ignore[operator]


def test_an_idle_limit_does_not_grow_without_evidence() -> None:
    lim, _ = limit()
    feed(lim, 20, saturated=False)
    assert lim.limit() == 8


def test_latency_over_the_tolerance_shrinks_the_limit_in_proportion() -> None:
    lim, _ = limit(tolerance=1.3)
    feed(lim, 8)
    high = lim.limit()
    feed(lim, 12, tpot=0.04)  # decode steps four times their floor
    low = lim.limit()
    assert high is not None and low is not None and low < high / 2
    assert lim.gradient < 1.0


def test_a_slow_prefill_shrinks_it_too_but_a_long_prompt_is_not_a_slow_one() -> None:
    lim, _ = limit()
    feed(lim, 8)
    before = lim.limit()
    for _ in range(8):  # prompts 30x longer take 10x the time: another class, its own floor
        lim.saturated()
        lim.observe(prompt_tokens=3000, ttft_s=0.5, tpot_s=0.01)
    assert lim.limit() >= before  # type: ignore[operator]
    for _ in range(8):  # the short prompts' first token now takes 6x its floor
        lim.observe(prompt_tokens=100, ttft_s=0.3, tpot_s=0.01)
    assert lim.limit() < before  # type: ignore[operator]


def test_a_floor_from_another_time_ages_out() -> None:
    lim, now = limit(window_s=10.0)
    feed(lim, 8, tpot=0.001)  # a floor measured once, never again
    now["t"] = 25.0
    feed(lim, 30, tpot=0.01)  # two windows later the floor is today's
    assert lim.tpot.floor.value == pytest.approx(0.01)
    assert lim.gradient == 1.0


def test_jitter_within_the_slack_is_not_overload() -> None:
    lim, _ = limit(slack_s=0.005)
    feed(lim, 8, ttft=0.001, tpot=0.0005)
    feed(lim, 8, ttft=0.004, tpot=0.003)  # 4-6x a floor of a millisecond, yet within 5 ms of it
    assert lim.gradient == 1.0


def test_the_limit_stays_within_its_bounds() -> None:
    lim, _ = limit(min_limit=2, max_limit=12)
    feed(lim, 60)
    assert lim.limit() == 12
    feed(lim, 60, tpot=1.0)
    assert lim.limit() == 2


def test_a_lone_tenant_keeps_the_pools_throughput_and_a_second_meets_the_shared_limit_at_once() -> None:
    """Alone on the model, a tenant's own prefills waiting for each other do not shrink its limit; the shared
    limit learns from the same first tokens all along, and is in force from the second tenant's first request."""
    lim, _ = limit()
    others = {"about": False}
    lim.contended = lambda: others["about"]
    feed(lim, 8)
    before = lim.limit()
    for _ in range(8):
        lim.saturated()
        lim.observe(prompt_tokens=100, ttft_s=0.3, tpot_s=0.01)
    assert before is not None and lim.limit() >= before  # type: ignore[operator]
    alone = lim.limit()
    others["about"] = True  # another tenant sends: no completion needed for the limit to change
    shared = lim.limit()
    assert shared is not None and alone is not None and shared < before <= alone
    others["about"] = False
    assert lim.limit() == alone


def load(role: str, engine: str, *, running: float, waiting: float = 0.0, kv: float = 0.1,
         at: float = 100.0) -> EngineLoad:
    return EngineLoad(model="m", engine=engine, role=role, running=running, waiting=waiting, kv_usage=kv, steps=10,
                      at=at)


def test_engines_queueing_bring_the_limit_down_to_the_share_that_runs_once_per_report() -> None:
    lim, _ = limit(initial=12)
    feed(lim, 4)
    before = lim.estimate
    reports = [load("prefill", "p1", running=1.0), load("decode", "d1", running=3.0, waiting=1.0),
               load("decode", "d2", running=3.0, waiting=2.0)]
    lim.engine_view(reports, now=100.5)
    assert lim.estimate == pytest.approx(before * 6 / 9)  # the decode pool runs 6 of the 9 it holds
    assert lim.engine_pressure is not None and lim.engine_pressure.startswith("decode")
    lim.engine_view(reports, now=101.0)  # the same reports read again: no new evidence
    assert lim.estimate == pytest.approx(before * 6 / 9)
    # while the engines queue, latencies at their floor do not grow the limit back
    held = lim.limit()
    feed(lim, 6)
    assert lim.limit() == held


def test_a_nearly_full_kv_cache_backs_the_limit_off() -> None:
    lim, _ = limit()
    feed(lim, 4)
    before = lim.estimate
    lim.engine_view([load("both", "a1", running=4.0, kv=0.95)], now=100.0)
    assert lim.estimate == pytest.approx(before * 0.9) and "KV" in (lim.engine_pressure or "")


def test_stale_or_calm_reports_leave_the_limit_to_the_latencies() -> None:
    lim, _ = limit()
    feed(lim, 4)
    before = lim.estimate
    lim.engine_view([load("decode", "d1", running=2.0, waiting=5.0, at=90.0)], now=100.0)  # 10 s old: gone
    lim.engine_view([load("decode", "d1", running=2.0, waiting=0.4, at=99.5)], now=100.0)  # a step's wait
    assert lim.estimate == before and lim.engine_pressure is None
    feed(lim, 6)  # and the latencies grow it as before
    assert lim.estimate > before


def test_no_report_moves_a_model_without_a_view() -> None:
    lim, _ = limit()
    lim.engine_view([load("decode", "d1", running=1.0, waiting=4.0)], now=100.0)
    assert lim.limit() is None and lim.estimate == 8


def test_only_the_limit_in_force_grows_on_the_evidence_that_it_is_in_use() -> None:
    """A lone tenant's limit is not tried while the shared one is in force: it must not grow then (it would
    let a flood into the engines the moment the second tenant left), nor the shared one while a tenant is alone."""
    lim, _ = limit()
    others = {"about": True}
    lim.contended = lambda: others["about"]
    feed(lim, 4)
    alone = lim.alone
    feed(lim, 40)  # contended, at the floor, the shared limit in use
    assert lim.estimate > alone and lim.alone == alone
    others["about"] = False
    shared = lim.estimate
    feed(lim, 40)  # alone now: its own limit grows, the shared one stays
    assert lim.alone > alone and lim.estimate == shared
