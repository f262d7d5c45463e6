"""Chaos drills on the real stack: a P/D deployment of the tiny model (1 prefill + 1 decode replica,
LMCache tiers with a dedicated Redis as the remote tier) on the session stack's Ray head, behind a real
Baton gateway on Postgres and Redis (the session's fault stack, :func:`tests.shared_stack.fault_stack`,
shared with tests/e2e/test_recovery.py). The harness and its ledger are :mod:`baton.bench.chaos`.

Engine steps of 512 tokens: a prompt (~800 tokens; the long one ~1,800) is prefilled in several steps, so
the prefill engine's gauges show it running and the injector can kill a prefill replica in the middle of
a prefill (the victim is chosen from the engines' metrics, and each kill must be answered by a recovery
step in a request that was in flight at it).

About five minutes on a 2-core machine, past the shared stack's start. Run by hand under the machine-wide
lock:

    flock /tmp/baton-heavy.lock .venv/bin/python -m pytest -m chaos tests/chaos -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def endpoint(fault_stack):  # type: ignore[no-untyped-def]
    """The session's fault stack (:func:`tests.shared_stack.fault_stack`): the default topology (scripts/up),
    one replica per pool, so a decode kill always hits the streams in flight (with two, the engines' gauges
    lag a second behind 48-token answers) and serving goes on on the prefill engine (aggregated fallback)."""
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    return fault_stack


def _show(result: dict) -> None:
    print(json.dumps({k: v for k, v in result.items() if k not in ("config", "faults")}, indent=1, default=str))
    for f in result["faults"]:
        print("fault", json.dumps(f, default=str))


def test_redis_tier_down_for_the_whole_run_costs_no_request(endpoint) -> None:
    from baton.bench.chaos.drill import DrillConfig, run_drill

    cfg = DrillConfig(kills=0, stalls=0, tier_downs=0, drops=0, duration_s=20, tier_down_whole_run=True,
                      prompts=4, concurrency=3, max_tokens=32, seed=1)
    result = run_drill(endpoint, cfg)
    _show(result)
    assert result["tier_down_whole_run"]["fired"]
    assert result["sent"] > 0
    assert result["failed"] == 0 and result["lost"] == 0 and result["truncated_200s"] == 0
    assert result["completed"] == result["sent"]
    assert result["text_mismatches"] == 0
    assert result["usage_records_ok"]
    assert result["invariants"]["no_failed_requests"] and result["invariants"]["no_missing_tokens"]


def test_baton_chaos_run_attached_to_a_running_stack_writes_a_result_the_report_renders(  # type: ignore[no-untyped-def]
        endpoint, settings, tmp_path) -> None:
    """The command as a user runs it (``baton chaos run --attach``), at a tiny size: load without faults."""
    from baton.bench import docreport

    out = tmp_path / "chaos.json"
    env = {**os.environ, "BATON_DB__URL": settings.db.url, "BATON_DB__APP_ROLE": settings.db.app_role,
           "BATON_DB__APP_URL": settings.db.app_url or "", "BATON_REDIS__URL": settings.redis.url,
           "BATON_CHAOS_API_KEY": endpoint.api_key}
    cmd = [sys.executable, "-m", "baton.cli.main", "chaos", "run", "--attach", "--configured-db",
           "--gateway-url", endpoint.gateway_url, "--model", endpoint.model, "--app", endpoint.app,
           "--prefill", "1", "--decode", "1", "--kills", "0", "--stalls", "0", "--tier-downs", "0", "--drops", "0",
           "--duration", "5", "--concurrency", "2", "--max-tokens", "16", "--out", str(out)]
    if endpoint.dashboard_url:
        cmd += ["--dashboard-url", endpoint.dashboard_url]
    if endpoint.metrics_url:
        cmd += ["--metrics-url", endpoint.metrics_url]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["benchmark"] == "chaos" and result["provenance"]["commit"]
    assert result["provenance"]["command"][1:3] == ["chaos", "run"]
    assert result["sent"] > 0 and result["completed"] == result["sent"]
    assert result["lost"] == result["failed"] == result["text_mismatches"] == 0
    assert result["usage_records_ok"]
    assert f"| {result['sent']:,} | {result['completed']:,} |" in docreport.render("chaos", result)


def test_decode_and_prefill_kills_lose_no_request_and_no_token(endpoint) -> None:
    _strict_drill(endpoint)


#: ``BATON_CHAOS_REPEAT=5``: the strict drill this many times in a row on one stack (a flakiness check:
#: ``flock /tmp/baton-heavy.lock env BATON_CHAOS_REPEAT=5 .venv/bin/python -m pytest -m chaos -s
#: tests/chaos/test_chaos_drill.py -k kills``, with another process taking a core)
REPEAT = int(os.environ.get("BATON_CHAOS_REPEAT", "1") or 1)

if REPEAT > 1:
    @pytest.mark.parametrize("run", range(2, REPEAT + 1))
    def test_decode_and_prefill_kills_again(endpoint, run: int) -> None:  # type: ignore[no-untyped-def]
        _strict_drill(endpoint)


def _strict_drill(endpoint) -> None:  # type: ignore[no-untyped-def]
    from baton.bench.chaos.drill import DrillConfig, run_drill

    # 500 words: ~1,800 tokens of the tiny model's tokenizer (max_model_len 2,048 with the 48 answered)
    cfg = DrillConfig(kills=2, stalls=0, tier_downs=0, drops=1, prompts=4, concurrency=3, max_tokens=48,
                      victim_wait_s=60, gap_s=(2.0, 5.0), seed=2, first_kills=("kill_decode", "kill_prefill"),
                      long_prompt_words=500)
    result = run_drill(endpoint, cfg)
    _show(result)
    # every fault really happened: the decode kill with streams in flight (mid-stream). A kill that hit
    # nothing (no request open at it needed recovery, by their records: on a loaded machine the victim can
    # be idle by the time it dies) is fired again, twice at most; one kill of each pool must hit.
    hits = [f for f in result["faults"] if f["fired"] and not f["missed"]]
    assert [f["kind"] for f in hits if f["kind"].startswith("kill_")].count("kill_decode") == 1
    assert [f["kind"] for f in hits if f["kind"].startswith("kill_")].count("kill_prefill") == 1
    assert result["faults_not_fired"] == 0 and result["faults_not_recovered"] == 0, [
        (f["kind"], f["evidence"], f.get("recovered")) for f in result["faults"]]
    assert result["baseline"]["long_prompt"]
    decode_kill = next(f for f in hits if f["kind"] == "kill_decode")
    prefill_kill = next(f for f in hits if f["kind"] == "kill_prefill")
    assert decode_kill["streams_in_flight"] > 0
    # each victim was serving a request (by its engine's own metrics, or by the steps below), and the ladder
    # answered each kill in a request that was in flight at it: the decode kill with a decode-side step, the
    # prefill kill with a rung
    for f in (decode_kill, prefill_kill):
        assert f["victim_busy"] is True or f["matched_steps"], f
        assert f["requests_in_flight"] and f["matched_steps"], f
    assert result["faults_unmatched"] == 0 and result["victims_not_busy"] == 0
    assert all(s["step"].startswith("decode_") or s["step"] == "aggregated_fallback"
               for s in decode_kill["matched_steps"])
    assert {s["step"] for s in prefill_kill["matched_steps"]} <= {"prefill_retry", "local_prefill", "kv_recompute"}
    assert result["prefill_rungs_seen"]
    # the ledger's invariants: no request failed, none lost or cut, no token lost (a failed stream's
    # untransmitted tail included; only the dropped client's stream is a prefix), duplicated or wrong
    # each failure names its counts and the errors the clients saw (a CI log keeps only the assertion)
    why = {k: result[k] for k in ("failed", "failed_before_stream", "cancelled", "lost", "truncated_200s",
                                  "multiple_finals", "errors") if k in result}
    why["recovery_steps"] = result.get("postgres", {}).get("recovery_steps")
    assert result["failed"] == 0 and result["cancelled"] == 1, why
    assert result["lost"] == 0, why
    assert result["truncated_200s"] == 0, why
    assert result["multiple_finals"] == 0, why
    assert result["duplicated_tokens"] == 0 and result["missing_tokens"] == 0 and result["mismatched_tokens"] == 0, why
    assert result["text_mismatches"] == 0, why
    assert result["usage_records_ok"] and result["record_states_ok"]
    for name in ("no_failed_requests", "every_fault_matched_to_a_step", "victims_were_busy"):
        assert result["invariants"][name], name
    assert result["ok"], result["invariants"]



def test_a_recovery_trial_of_baton_bench_recovery_on_this_stack(endpoint) -> None:  # type: ignore[no-untyped-def]
    """One trial of each fault of ``baton bench recovery`` (its own code, on this module's stack of the default
    topology): the decode replica serving a stream is killed mid-stream, or stopped (SIGSTOP, SIGCONT 5 s
    later), and the stream resumes with the same text. A stopped replica's sockets stay open: the stream
    resumes only if the gateway's watchdog, relative to the stream's pace, breaks it (its ceiling,
    ``token_stall_s``, is longer than the stall: waited out, the stream would go on after SIGCONT with no
    resume at all)."""
    from baton.bench.recovery import RecoveryConfig, run_trials, summarise

    cfg = RecoveryConfig(topologies=("1p1d",), arms=("tier", "stall"), repeats=1, prompt_len=512, max_tokens=1000,
                         kill_after=40, stall_s=5.0)
    trials = run_trials(endpoint, "1p1d", cfg, log=print)
    assert [t["arm"] for t in trials] == ["tier", "stall"]
    for trial in trials:
        assert trial["victim"].get("fired") and trial["victim"].get("busy"), trial["victim"]
        assert trial["recovery_ms"] is not None and trial["resumed_after"] is not None, trial
        assert trial["equal_undisturbed"] and trial["record_status"] == "completed", trial
    assert "ReadTimeout" in next(s["detail"] for s in trials[1]["steps"] if s["step"] == "decode_resume")
    for arm in ("tier", "stall"):
        summary = summarise(trials)["1p1d"][arm]
        assert summary["all_recovered"] and summary["all_equal_undisturbed"] and summary["ratio_median"] > 0
