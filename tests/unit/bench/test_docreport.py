"""docs/benchmarks.md's generated tables are what `baton bench report` writes from the committed JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from baton.bench import docreport, gateway, report, stats
from baton.bench import fairness as fb
from baton.bench.gateway import GatewayConfig
from baton.bench.pd import PdConfig
from baton.bench.serve import ServeConfig

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_the_documents_tables_are_in_sync_with_the_committed_json() -> None:
    doc = DOCS / "benchmarks.md"
    assert docreport.blocks(doc.read_text()), "no generated blocks in docs/benchmarks.md"
    assert docreport.check(doc) == [], "run `baton bench report`"


def test_a_changed_figure_puts_the_document_out_of_sync_and_report_rewrites_it(tmp_path: Path) -> None:
    shutil.copy(DOCS / "bench-idle.json", tmp_path / "bench-idle.json")
    doc = tmp_path / "b.md"
    doc.write_text("intro\n<!-- report:idle -->\nstale\n<!-- /report -->\nafter\n")
    assert docreport.check(doc) == ["idle"]
    assert docreport.write(doc) and docreport.check(doc) == []
    data = json.loads((tmp_path / "bench-idle.json").read_text())
    data["stack_core_share"] = 0.5
    (tmp_path / "bench-idle.json").write_text(json.dumps(data))
    assert docreport.check(doc) == ["idle"]
    assert "**50.0%**" in docreport.render_block("idle", tmp_path)
    assert doc.read_text().startswith("intro\n") and doc.read_text().endswith("<!-- /report -->\nafter\n")


def test_a_result_without_provenance_cannot_be_shown(tmp_path: Path) -> None:
    data = json.loads((DOCS / "bench-idle.json").read_text())
    del data["provenance"]
    (tmp_path / "bench-idle.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="provenance"):
        docreport.render_block("idle", tmp_path)


# -- the renderers of the other benchmarks: small results shaped as their bench code builds them ------------

PROV = {"start": {"time": "2026-12-03T10:00:00+00:00", "loadavg": [1.5, 1.0, 1.0]},
        "end": {"time": "2026-12-03T10:05:00+00:00", "loadavg": [2.0, 1.0, 1.0]},
        "command": ["baton", "bench", "x"], "machine": {"cpus": 2, "cpu_model": "AMD EPYC", "memory_gib": 23.5},
        "commit": "0123456789abcdef", "dirty": False}


def _requests(n: int, ttft_s: float, gap_s: float, *, tokens: int = 4, failed: int = 0) -> list[stats.RequestResult]:
    ok = [stats.RequestResult(True, prompt_len=8, output_tokens=tokens, ttft=ttft_s,
                              latency=ttft_s + gap_s * (tokens - 1), itl=[gap_s] * (tokens - 1)) for _ in range(n)]
    return ok + [stats.RequestResult(False, prompt_len=8, error="boom") for _ in range(failed)]


def _serve() -> dict[str, Any]:
    slo = {"ttft": 200.0, "tpot": 20.0}
    runs = []
    for rate, ttft, failed in ((2.0, 0.0125, 0), (math.inf, 0.150, 2)):
        run = stats.summarize(_requests(10, ttft, 0.00174, failed=failed), 5.0, slo=slo)
        run.update(request_rate=rate, max_concurrency=None, by_kind={})
        runs.append(run)
    cfg = ServeConfig(base_url="http://127.0.0.1:8000/v1", model="tiny", num_prompts=10,
                      goodput=["ttft:200", "tpot:20"])
    return {"benchmark": "serve", "config": dataclasses.asdict(cfg), "runs": runs}


def _gateway() -> dict[str, Any]:
    per_arm = {}
    for name, ttft, cpu in (("direct", 0.010, None), ("baton", 0.0128, 2.5), ("litellm", 0.040, 30.6)):
        per_arm[name] = stats.summarize(_requests(8, ttft, 0.001), 1.0, percentiles=(50, 90, 99))
        per_arm[name]["proxy_cpu_ms_per_request"] = cpu
    added = {name: {"ttft_ms": {"p50": ttft, "p99": ttft + 1}, "itl_ms": {"p50": 0.02, "p99": 0.03},
                    "e2el_ms": {"p50": ttft, "p99": ttft}} for name, ttft in (("baton", 2.8), ("litellm", 30.0))}
    rounds = [{"concurrency": 1, "requests_per_arm": 8, "block_size": 8, "arms": per_arm, "added": added,
               "ratios": gateway._ratios(added, per_arm)}]
    ttft = stats.describe([0.1, 0.2], (50, 99), scale=1000.0)
    throughput = {
        "direct": {"requests": 100, "completed": 100, "duration_s": 1.0, "requests_per_s": 100.0, "proxy_cpu_s": None,
                   "requests_per_cpu_s": None, "rss_mb": None, "ttft_ms": ttft},
        "baton": {"requests": 100, "completed": 100, "duration_s": 4.0, "requests_per_s": 25.0, "proxy_cpu_s": 0.193,
                  "requests_per_cpu_s": 519.0, "rss_mb": 123.4, "ttft_ms": ttft},
        "baton-2w": {"requests": 100, "completed": 100, "duration_s": 2.5, "requests_per_s": 40.0,
                     "proxy_cpu_s": 0.2, "requests_per_cpu_s": 500.0, "rss_mb": 300.0, "ttft_ms": ttft}}
    per_token = {"concurrency": 32, "lengths": [1, 32],
                 "baton": {"requests": 1000, "cpu_ms_per_request": {"1": 1.2, "32": 1.82}, "cpu_ms_per_token": 0.02},
                 "litellm": {"requests": 100, "cpu_ms_per_request": {"1": 30.0, "32": 40.85}, "cpu_ms_per_token": 0.35}}
    out = {"benchmark": "gateway", "config": dataclasses.asdict(GatewayConfig(upstream="zero")), "notes": [],
           "upstream_url": "http://127.0.0.1:9100/v1", "rounds": rounds, "throughput": throughput,
           "per_token": per_token, "rss_mb": {"baton": 123.4}}
    out["headline"] = gateway.headline(out)
    return out


def _handoff() -> dict[str, Any]:
    def row(n: int, kv: int, xfer: float, ideal: float, eff: float) -> dict[str, Any]:
        return {"prompt_len": n, "kv_bytes": kv, "nixl_bytes": kv, "nixl_xfer_ms": xfer, "client_handoff_ms": 50.0,
                "ideal_memcpy_ms": ideal, "ideal_link_ms": kv / 1.9e6, "efficiency": eff, "efficiency_client": 0.01,
                "prefill_ms": 100.0, "decode_ttft_ms": 60.0, "failed_transfers": 0}

    tiny = [row(256, 262_144, 0.265, 0.021, 0.08), row(2048, 2_097_152, 0.518, 0.166, 0.32)]
    bench = [row(3584, 117_440_512, 9.0, 9.28, 1.03)]
    return {"benchmark": "handoff", "config": {"repeats": 3}, "memcpy": {"best_GBps": 12.66, "median_GBps": 10.48},
            "link_bandwidth_GBps": 1.9, "shapes": [
                {"shape": "tiny", "kv_bytes_per_token": 1024, "by_length": tiny},
                {"shape": "bench", "kv_bytes_per_token": 32768, "by_length": bench}],
            "target": {"efficiency": 0.5, "prompt_len_min": 2048}}


def _pd() -> dict[str, Any]:
    slo = {"ttft": 2000.0, "tpot": 50.0}

    def run(rate: float, ttft: float, failed: int) -> dict[str, Any]:
        r = stats.summarize(_requests(8, ttft, 0.02, failed=failed), 10.0, slo=slo, percentiles=(50, 90, 99))
        r["request_rate"] = rate
        r["by_kind"] = {"short": stats.summarize(_requests(6, ttft, 0.021), 10.0, slo=slo, percentiles=(50, 90, 99)),
                        "long": stats.summarize(_requests(2, 0.7071, 0.02), 10.0, slo=slo, percentiles=(50, 90, 99))}
        return r

    configs = {"aggregated": {"goodput_per_gpu": 2.045, "goodput_two_cores": 4.09, "bottleneck": "prefill",
                              "at_rate": {"rate_per_unit": 1.0, "ttft_ms": 1279.0, "tpot_ms": 20.5, "ok": True}},
               "pd 1:1": {"goodput_per_gpu": 1.02, "goodput_two_cores": 2.04, "bottleneck": "prefill",
                          "at_rate": {"rate_per_unit": 2.0, "ttft_ms": 2000.0, "tpot_ms": 8.0, "ok": False}}}
    return {"benchmark": "pd", "config": dataclasses.asdict(PdConfig()), "slo_ms": slo,
            "arms": {"aggregated": [run(1.0, 0.082, 0)],
                     "pd": [{**run(1.0, 1.591, 2),
                             "kv": {"transfers": 1200, "failed_transfers": 1, "expired_leases": 0}}]},
            "prediction": {"hardware": {"prefill_tokens_per_s": 2461.0, "decode_step_ms": 7.8}, "calibrated": True,
                           "notes": [], "by_rate": [{"request_rate": 2.0, "recommended": "aggregated", "reason": "",
                                                     "transfer_lower_bound_ms": 0.1, "configs": configs}]}}


def _fairness() -> dict[str, Any]:
    """A fairness result as ``baton bench fairness`` builds it, from made-up outcomes of every phase."""

    def o(kind: str, ttft_ms: float | None = None, tokens: int = 0, retry_after: str | None = None,
          prompt: int = 0) -> dict[str, Any]:
        return dataclasses.asdict(fb.Outcome(kind=kind, status=int(kind) if kind.isdigit() else 0,
                                             ttft_s=None if ttft_ms is None else ttft_ms / 1000.0,
                                             completion_tokens=tokens, retry_after=retry_after, prompt_tokens=prompt,
                                             usage=kind == "200"))

    def t(name: str, outs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"tenant": name, "elapsed_s": 10.0, "outcomes": outs}

    raw = {
        "b_alone": [t("b", [o("200", 100 + i, 16, prompt=30) for i in range(100)])],  # p99 198.01 ms
        "a_flood_b": [t("a", [o("200", 900, 128, prompt=400) for _ in range(50)] + [o("429", None, 0, "1")] * 30
                        + [o("503")]),
                      t("b", [o("200", 120 + i, 16, prompt=30) for i in range(100)])],  # p99 218.01 ms
        "bands": [t("high", [o("200", 100, 64, prompt=160)] * 99 + [o("200", 600, 64, prompt=160)]),
                  t("mid", [o("200", 800, 64, prompt=160)] * 30 + [o("200", 1200, 64, prompt=160)] * 10),
                  t("low", [o("200", 900, 64, prompt=160)] * 10 + [o("429", None, 0, "2")] * 39 + [o("429")])],
        "share": [t("w2", [o("200", 300, 50, prompt=100)] * 43), t("w1", [o("200", 300, 50, prompt=100)] * 20)],
    }
    cfg = fb.FairnessConfig(admin_token="bt_admin", duration_s=10.0, a_concurrency=8)
    return report._clean({
        "benchmark": "fairness", "config": fb.config_dict(cfg),
        "tenants": {role: {"name": f"bench-fairness-abc123-{role}", "policy": policy}
                    for role, policy in fb.roles(cfg).items()},
        **fb.summarize(cfg, raw), "cleanup": {"deleted": {}, "errors": []}})


def _committed(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DOCS / name).read_text())
    return data


BUILDERS = {"serve": _serve, "gateway": _gateway, "handoff": _handoff, "pd": _pd, "fairness": _fairness,
            "path": lambda: _committed("bench-path.json"), "recovery": lambda: _committed("bench-recovery.json"),
            "chaos-default-topology": lambda: json.loads((Path(__file__).parent / "data" / "chaos-result.json")
                                                         .read_text())}


def _render(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    report.write_json(tmp_path / docreport.json_name(name), {**data, "provenance": PROV})
    return docreport.render_block(name, tmp_path)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_benchmark_without_provenance_is_refused(tmp_path: Path, name: str) -> None:
    data = BUILDERS[name]()
    data.pop("provenance", None)
    report.write_json(tmp_path / docreport.json_name(name), {**data, "provenance": PROV})
    assert "From [`" in docreport.render_block(name, tmp_path)
    (tmp_path / docreport.json_name(name)).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="provenance"):
        docreport.render_block(name, tmp_path)


def test_serve_a_row_per_rate_with_goodput_against_the_slo(tmp_path: Path) -> None:
    text = _render(tmp_path, "serve", _serve())
    assert "| 2 | 10/0 | 2.00 | 8 | 12.5 | 12.5 | 1.74 | 1.74 | 1.740 | 1.740 | 17.7 | 2.00 req/s (100%) |" in text
    assert "| inf | 10/2 | 2.00 | 8 | 150.0 |" in text and "| 2.00 req/s (83%) |" in text  # failures are misses
    assert "ttft <= 200 ms, tpot <= 20 ms" in text and "commit `0123456`" in text


def test_gateway_latency_added_over_direct_throughput_and_targets(tmp_path: Path) -> None:
    text = _render(tmp_path, "gateway", _gateway())
    assert "Upstream: the zero-latency stub (each token its own write, 1 ms apart)." in text
    assert "| direct | 8/0 | 10.00 | 10.00 | 1.000 | 1.000 |  |  |  |  |  |" in text
    assert "| baton | 8/0 | 12.80 | 12.80 | 1.000 | 1.000 | +2.8 | +3.8 | +0.020 | +0.030 | 2.50 ms |" in text
    assert "baton / LiteLLM: added TTFT p50 0.09," in text
    assert "| baton | 100/100 | 25 | 519 | 123 MB | 150.0 | 199.0 |" in text
    assert "| baton: added TTFT p50 | <= 0.5 ms | +2.80 ms | **no** |" in text
    assert "| baton: added TTFT p99 | <= 1.5 ms | +3.80 ms | **no** |" in text
    assert "| baton: added ITL p50 | <= 0.05 ms | +0.020 ms | yes |" in text
    assert "| baton / LiteLLM, added TTFT p50 | <= 0.05 | 0.09 | **no** |" in text
    assert "| baton: requests per gateway CPU-second | >= 2,000 | 519 | **no** |" in text
    assert "| baton | 1,000 | 1.200 ms | 1.820 ms | 0.0200 ms |" in text  # the per-token phase
    assert "| baton: CPU per relayed token | <= 0.02 ms | 0.0200 ms | yes |" in text
    assert "| baton: gateway RSS | <= 200 MB | 123 MB | yes |" in text
    assert "| baton-2w | 100/100 | 40 | 500 | 300 MB |" in text  # the throughput phase's 2-worker gateway
    assert "| baton: req/s of 2 worker processes / one | >= 1.8 | 1.60 | **no** |" in text


def test_handoff_efficiency_judged_from_the_target_length(tmp_path: Path) -> None:
    text = _render(tmp_path, "handoff", _handoff())
    assert "| tiny | 256 | 0.26 | 0.265 | 0.021 | 0.08 | 1.0 | 0 |  |  |" in text  # below 2,048 tokens: not judged
    assert "| tiny | 2,048 | 2.10 | 0.518 | 0.166 | 0.32 | 4.0 | 0 | >= 0.5 | **no** |" in text
    assert "| bench | 3,584 | 117.44 | 9.000 | 9.280 | 1.03 | 13.0 | 0 | >= 0.5 | yes |" in text
    assert "memcpy 12.66 GB/s best" in text and "met in 1 of 2 rows" in text


def test_pd_arms_by_rate_and_the_planners_prediction(tmp_path: Path) -> None:
    text = _render(tmp_path, "pd", _pd())
    assert ("| aggregated | 1 | 8/0 | 82.0 | 82.0 | 82.0 | 20.00 | 20.00 | 21.00 | 82.0 | 707.1 | 0.80 req/s | "
            "100% |  |") in text  # an aggregated run reads no KV
    assert "| pd | 1 | 8/2 | 1,591.0 |" in text and "| 80% | 1,200 (1, 0) |" in text
    assert "| 2 | aggregated | 4.09 | 1,279.0 | 20.50 | yes | **yes** |" in text
    assert "| 2 | pd 1:1 | 2.04 | 2,000.0 | 8.00 | **no** |  |" in text
    assert "prefill 2,461 tokens/s, decode step 7.8 ms" in text and "ttft <= 2000 ms" in text


def test_path_from_the_committed_result_its_name_picks_the_renderer(tmp_path: Path) -> None:
    text = docreport.render_block("path", DOCS)
    assert "| 1 | baton-pd | 80/0 | 49.72 | 86.31 | +35.92 | 2.42 | 14.25 | 1.14 |" in text
    assert "| baton-pd | 1,264 | 0.48 |" in text and "| remote prefill call | 17.68 | 21.59 | 26.28 | 23.27 |" in text
    assert "| **all processes** | 219.25 | 245.75 | 274.12 | 274.25 | 339.50 | 392.00 | 369.50 |" in text
    assert "| `baton_pd_added_ttft_p50_ms` | 35.92 | 15 | **no** |" in text
    assert "| `pd_saturation_vs_engine` | 0.48 | 0.5 | **no** |" in text
    assert text.startswith(docreport.render("path", _committed("bench-path.json")))  # as `bench path --from-json`
    # A result that does not name its benchmark is rendered by its file's name.
    unnamed = {k: v for k, v in _committed("bench-path.json").items() if k != "benchmark"}
    (tmp_path / "bench-path.json").write_text(json.dumps(unnamed))
    assert docreport.render_block("path", tmp_path) == text


def test_recovery_from_the_committed_result(tmp_path: Path) -> None:
    text = docreport.render_block("recovery", DOCS)
    assert ("| 1p1d | tier | 174.9 ms (221.8, 128.0) | 174.7 ms | 52.4 ms | 3.41 (4.52) | <= 1.5 | **no** | "
            "10.55 (19.89) | **no** | aggregated_fallback, 2 of 2 | yes, 2 of 2 | yes |") in text
    assert "(139-596 tokens had arrived)" in text
    # the stall arm: its target from the trials' own ITL p99 and fresh TTFT, no replacement to time
    assert ("| 1p1d | stall | 327.2 ms (275.9, 378.5) | 327.8 ms | 53.3 ms | 6.14 (7.08) | <= 1.42 | **no** | "
            "n/a (n/a) | n/a |") in text
    assert "the stall arm SIGSTOPs the decode replica instead (SIGCONT 5 s later)" in text
    # a kill that landed on the idle replica is not a recovery: said, and left out of the gap figures
    d = _committed("bench-recovery.json")
    missed = next(t for t in d["trials"] if t["topology"] == "1p2d" and t["arm"] == "chat")
    missed["resumed_after"] = None
    d["summary"]["1p2d"]["chat"]["kills_that_hit"] = 1
    assert "| 1p2d | chat | 226.6 ms (339.2), 1 of 2 kills missed the stream (not counted) |" in docreport.render(
        "recovery", d)


def test_a_chaos_run_its_invariants_and_recovery(tmp_path: Path) -> None:
    # a real `baton chaos run --json` result (the default topology's strict drill), as a fixture
    result = json.loads((Path(__file__).parent / "data" / "chaos-result.json").read_text())
    text = _render(tmp_path, "chaos-default-topology", result)
    assert "| 3,710 | 3,709 | 0 | 1 | 0 | 0 / 0 / 0 | 0 | 10 / 10 / 9 | local_prefill | **no** |" in text
    assert "| `every_fault_matched_to_a_step` | **no** |" in text and "| `no_lost_requests` | yes |" in text
    assert "| kill_decode | 3 | 0.35 s / 3.44 s | 81.7 s / 92.8 s |" in text
    assert "From [`chaos-default-topology.json`](chaos-default-topology.json)" in text
    text = _render(tmp_path, "chaos", {**result, "benchmark": "chaos"})  # the name needs only the chaos- prefix
    assert "| 3,710 | 3,709 |" in text


def test_fairness_says_where_a_fault_fell() -> None:
    assert "Fault:" not in docreport.render("fairness", _fairness())
    fault = {"at_s": 25.0, "app": "tiny-llama-pd", "killed": True, "detail": "SIGKILL [1, 2]: all gone"}
    text = docreport.render("fairness", {**_fairness(), "fault": fault})
    line = ("Fault: a decode replica of `tiny-llama-pd` SIGKILLed 25 s into the phase "
            "(killed: SIGKILL [1, 2]: all gone).")
    assert line in text and text.index("`a_flood_b`") < text.index(line) < text.index("`bands`")


def test_fairness_a_table_per_phase_then_the_targets() -> None:
    text = docreport.render("fairness", _fairness())
    head = ("| tenant | priority | weight | sheddable | sent | completed | 200 | 429 | 503 | 5xx | timeouts | "
            "other errors | Retry-After on every 429 | TTFT p50 | TTFT p90 | TTFT p99 | tokens/s |")
    assert text.count(head) == 4  # one table per phase
    order = ["`b_alone`: B alone", "`a_flood_b`: A keeps 8 streams", "`bands`: 1 (high) / 4 (mid) / 12 (low) streams",
             "`share`: two tenants of weights 2 and 1", "Against the targets"]
    assert [text.index(s) for s in order] == sorted(text.index(s) for s in order)
    assert "| b | 50 | 1 | no | 100 | 100 | 100 | 0 | 0 | 0 | 0 | 0 | no 429 | 149.5 | 189.1 | 198.0 | 160.0 |" in text
    assert "| a | 50 | 1 | no | 81 | 50 | 50 | 30 | 1 | 0 | 0 | 0 | yes | 900.0 | 900.0 | 900.0 | 640.0 |" in text
    assert "| low | 10 | 1 | yes | 50 | 10 | 10 | 40 | 0 | 0 | 0 | 0 | **no** (1 without) | 900.0 |" in text
    assert "| high | 90 | 500 ms | 0.990 | 0.990 | 67% |" in text  # the bands' attainment and token shares
    assert "| low | 10 | 1000 ms | 1.000 | 0.200 | 7% |" in text
    assert "| w2 | 50 | 2 | no | 43 | 43 | 43 | 0 |" in text and "| w1 | 50 | 1 | no | 20 | 20 | 20 | 0 |" in text
    assert ("prompt + 2 x completion, from each stream's usage report): w2 (weight 2) 8,600, w1 (weight 1) 4,000; "
            "ratio 2.15 against the weights' 2 (error 7.5%).") in text
    assert "| B's TTFT p99 beside A's flood / alone | <= 1.5 | 218.0 ms / 198.0 ms = 1.10 | yes |" in text
    assert "| A refused with 429 only: its 503 / 5xx / client timeouts | 0 / 0 / 0 | 1 / 0 / 0 | **no** |" in text
    assert "| every 429 with Retry-After | all | 69 of 70 | **no** |" in text
    assert ("| top band (high, priority 90): completed requests with TTFT <= 500 ms | >= 0.99 | 0.990 | yes |"
            in text)
    assert ("| share: weight-2 tenant's tokens / weight-1 tenant's (prompt + 2 x completion) | within 10% of 2 | "
            "2.15 (error 7.5%) | yes |") in text
    opened = _fairness()
    opened["config"]["a_rate"] = 30.0  # A as an open loop
    assert "`a_flood_b`: A sends a 300-word request (max_tokens 128) 30 times a second, open loop" in (
        docreport.render("fairness", opened))


def test_fairness_targets_for_the_summary_leave_out_what_did_not_run(tmp_path: Path) -> None:
    rows = docreport.TARGETS["fairness"](_fairness())
    assert [r[3] for r in rows] == ["yes", "**no**", "**no**", "yes", "yes"]
    assert all(r[0].startswith("flow control: ") for r in rows)
    assert rows[-1][1:] == ["within 10% of 2", "2.15 (error 7.5%)", "yes"]
    # only the share phase ran: its row and Retry-After's; the section's table says n/a for the others
    cfg = fb.FairnessConfig(phases=("share",))
    outs = [dataclasses.asdict(fb.Outcome(kind="200", ttft_s=0.3, completion_tokens=50, prompt_tokens=100,
                                          usage=True))]
    only = report._clean({"benchmark": "fairness", "config": fb.config_dict(cfg),
                          "tenants": {r: {"name": r, "policy": p} for r, p in fb.roles(cfg).items()},
                          **fb.summarize(cfg, {"share": [{"tenant": "w2", "elapsed_s": 1.0, "outcomes": outs * 3},
                                                         {"tenant": "w1", "elapsed_s": 1.0, "outcomes": outs * 2}]})})
    rows = docreport.TARGETS["fairness"](only)
    assert [r[2:] for r in rows] == [["0 of 0", "yes"], ["1.50 (error 25.0%)", "**no**"]]
    text = docreport.render("fairness", only)
    assert "| B's TTFT p99 beside A's flood / alone | <= 1.5 | n/a | n/a |" in text
    assert "| A refused with 429 only: its 503 / 5xx / client timeouts | 0 / 0 / 0 | n/a | n/a |" in text
    assert "| top band: completed requests | >= 0.99 | n/a | n/a |" in text
    # in the summary, beside the other results, once its JSON exists
    assert "fairness" in docreport.SUMMARY
    assert "flow control" not in docreport.render_block("summary", tmp_path)  # no JSON: no rows, no error
    report.write_json(tmp_path / "bench-fairness.json", {**_fairness(), "provenance": PROV})
    out = docreport.render_block("summary", tmp_path)
    assert out.count("| flow control: ") == 5 and "[`bench-fairness.json`](bench-fairness.json), 2026-12-03 |" in out
    assert "3 of 5 targets met" in out
    assert "baton bench x" in docreport.render_block("fairness", tmp_path)  # its block: tables and provenance


def test_a_result_of_an_unknown_benchmark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no renderer"):
        _render(tmp_path, "ingest", {"benchmark": "nonesuch"})


def test_the_summary_has_every_results_targets_and_says_how_many_are_met(tmp_path: Path) -> None:
    for name in ("ingest", "revoke", "recovery"):
        shutil.copy(DOCS / f"bench-{name}.json", tmp_path / f"bench-{name}.json")
    (tmp_path / "bench-gateway-zero.json").write_text(json.dumps({**_gateway(), "provenance": PROV}))
    ingest = json.loads((tmp_path / "bench-ingest.json").read_text())
    ingest.update(records_per_s=12_345.0, met=False)
    (tmp_path / "bench-ingest.json").write_text(json.dumps(ingest))
    out = docreport.render_block("summary", tmp_path)
    row = "| usage records into Postgres, across a Postgres outage (0 lost) | >= 20,000/s | 12,345/s, 0 lost | **no**"
    assert row in out
    assert "key revocation seen by every gateway process" in out and "bench-revoke.json" in out
    # per topology and arm: the gap, and (a kill's arms) the first request after the replacement
    assert out.count("recovery, 1p") == 14
    assert "gateway (zero-latency upstream), baton: added TTFT p50" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| figure")]
    met = sum("| yes |" in r for r in rows)
    assert f"{met} of {len(rows)} targets met" in out
    del ingest["provenance"]  # a result that cannot say where it came from stays out of the summary too
    (tmp_path / "bench-ingest.json").write_text(json.dumps(ingest))
    with pytest.raises(ValueError, match="provenance"):
        docreport.render_block("summary", tmp_path)


def test_in_front_of_an_engine_only_the_cpu_figures_are_judged(tmp_path: Path) -> None:
    """The engine's own TTFT varies by more than a proxy adds: added latency is shown, not judged."""
    data = _gateway()
    data["config"]["upstream"] = "engine"
    text = _render(tmp_path, "gateway", data)
    assert "| baton | 8/0 | 12.80 | 12.80 |" in text  # the round's table with the added latency stays
    assert "added TTFT p50 | <=" not in text and "| baton: CPU per relayed token | <= 0.02 ms |" in text
