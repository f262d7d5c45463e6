"""`baton bench path` on the real stack, small: a bare engine, the P/D app on its own Ray head (Serve's
HAProxy ingress, Baton's decode server, NIXL) and Baton's gateway in front of it. Every request
completes, and every P/D request through Baton is split into hops from the spans that the gateway, the
decode server and the decode engine exported: the figures in docs/benchmarks.md come from this code."""

from __future__ import annotations

import pytest

from tests.engine_slots import engine_slots

from .conftest import stack_pids

pytestmark = [pytest.mark.e2e, pytest.mark.own_stack]  # own Ray head or engines: the lane (tests/stages.py)


@pytest.mark.timeout(1200)
def test_the_path_bench_attributes_every_pd_request_to_its_hops(settings, db, tiny_model, tmp_path) -> None:
    from baton.bench.path import HOPS, PathConfig, run_path

    cfg = PathConfig(model_dir=tiny_model, concurrencies=[1], num_prompts=3, rounds=1, input_len=128, output_len=8,
                     saturation_prompts=3, saturation_concurrency=2, warmup=1, arms=["engine", "baton-pd"],
                     state_dir=tmp_path)
    with engine_slots(3, __name__):  # a bare engine and a P/D app (tests/engine_slots.py)
        result = run_path(cfg, settings, db, log=print)
    assert stack_pids("/tmp/baton-head-") == []  # the head's raylet, workers, engines and HAProxy all ended
    c1 = result["concurrency"]["1"]
    for arm in ("engine", "baton-pd"):
        assert c1[arm]["summary"]["completed"] == 3, c1[arm]["summary"]["errors"]
        assert result["saturation"][arm]["completed"] == 3, result["saturation"][arm].get("errors")
    pd = c1["baton-pd"]
    assert pd["attributed_requests"] == 3  # spans of the gateway, the decode server and the engine arrived
    hops = pd["hops_ms_median"]
    assert set(hops) == set(HOPS)
    assert hops["KV transfer (NIXL)"] > 0  # NIXL's own telemetry: KV really moved
    assert {s["name"] for s in pd["example_trace"]} >= {"gateway.request", "dataplane.prefill", "dataplane.decode",
                                                         "dataplane.kv_transfer"}
    assert result["provenance"]["commit"] and result["provenance"]["end"]["time"]
    assert set(result["targets"]) == {"baton_pd_added_ttft_p50_ms", "baton_agg_added_ttft_p50_ms",
                                      "pd_saturation_vs_engine", "baton_pd_itl_p50_vs_engine"}
