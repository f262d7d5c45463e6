"""The benchmarks that start their own vLLM engines run as a user runs them (``baton bench handoff`` and
``baton bench pd``, tiny sizes): each writes its JSON with provenance and a plot, every request completes,
the KV really moves over NIXL, and ``baton bench report`` renders the result. The figures are the
benchmarks' to report (docs/benchmarks.md), not the tests'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bench_cli import run_bench

pytestmark = [pytest.mark.e2e, pytest.mark.solo]  # loads both cores (engines under load): runs alone (tests/stages.py)

def _bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    result = run_bench(tmp_path, *args, timeout_s=900)
    assert (tmp_path / f"{args[0]}.png").exists()
    return result


@pytest.mark.timeout(1200)
def test_handoff_moves_the_kv_over_nixl_and_times_each_transfer(tmp_path: Path) -> None:
    from baton.bench import docreport

    r = _bench(tmp_path, "handoff", "--shape", "tiny", "--prompt-len", "256", "--prompt-len", "1024",
               "--repeats", "1", "--output-len", "2")
    [shape] = r["shapes"]
    assert [row["prompt_len"] for row in shape["by_length"]] == [256, 1024]
    for row in shape["by_length"]:
        assert row["failed_transfers"] == 0
        assert row["nixl_xfer_ms"] > 0 and row["efficiency"] > 0  # NIXL's own telemetry saw a transfer
        assert row["kv_bytes"] >= row["prompt_len"] * shape["kv_bytes_per_token"] // 2
    assert r["memcpy"]["best_GBps"] > 0
    assert "| tiny | 1,024 |" in docreport.render("handoff", r)


@pytest.mark.timeout(1500)
def test_pd_serves_the_same_mix_both_ways_and_the_planner_predicts(tmp_path: Path) -> None:
    from baton.bench import docreport

    r = _bench(tmp_path, "pd", "--num-prompts", "4", "--request-rate", "4", "--long-len", "512",
               "--short-len", "64", "--long-fraction", "0.25", "--output-len", "4")
    assert set(r["arms"]) >= {"aggregated"} and len(r["arms"]) == 2
    for arm, runs in r["arms"].items():
        [run] = runs
        assert (run["completed"], run["failed"]) == (4, 0), (arm, run["errors"], run)
        assert run["by_kind"]["long"]["completed"] == 1 and run["by_kind"]["short"]["completed"] == 3
    [pd_run] = r["arms"]["pd"]
    assert pd_run["kv"]["transfers"] > 0, pd_run["kv"]  # the decode engine read the prompts' KV over NIXL
    pred = r["prediction"]
    assert "error" not in pred, pred
    assert pred["by_rate"][0]["recommended"]
    assert "Planner (calibrated" in docreport.render("pd", r)
