"""Each replica fault of a chaos drill must be answered by a recovery step of its kind, in a request that was
in flight at it, at a time after it: a kill that touched no request, a step of the wrong kind, a step from
before the fault or one another fault already claimed is no match."""

from __future__ import annotations

from baton.bench.chaos.attribution import (
    answers,
    attribute_steps,
    fault_checks,
    ladder_ran_out,
    prefill_rungs_seen,
    unmatched,
)
from baton.bench.chaos.faults import FaultRecord
from baton.bench.chaos.ledger import RequestRecord, Verdict


def fault(kind: str, t: float, **kw) -> FaultRecord:
    return FaultRecord(kind=kind, at_s=t, t_mono=t, fired=True, **kw)


def request(rid: str, sent: float, ended: float) -> RequestRecord:
    return RequestRecord(seq=0, prompt=0, expected_tokens=8, http_status=200, request_id=rid, t_send=sent,
                         t_end=ended)


def step(name: str, at_s: float, outcome: str = "recovered", detail: str = "") -> dict:
    return {"step": name, "at_ms": at_s * 1000, "duration_ms": 300.0, "outcome": outcome, "detail": detail}


def test_a_decode_kill_is_matched_by_the_resume_of_a_request_in_flight():
    kill = fault("kill_decode", 10.0)
    recs = [request("req-a", 8.0, 15.0)]
    attribute_steps([kill], recs, {"req-a": [step("decode_resume", 2.6)]})  # 10.6 on the client's clock
    assert kill.needs_step and kill.requests_in_flight == ["req-a"]
    assert [m["step"] for m in kill.matched_steps] == ["decode_resume"]
    assert kill.matched_steps[0]["after_fault_s"] == 0.6
    assert unmatched([kill]) == []


def test_a_kill_that_no_request_answered_is_unmatched():
    kill = fault("kill_decode", 10.0)
    recs = [request("req-a", 8.0, 15.0), request("req-b", 9.0, 12.0)]
    attribute_steps([kill], recs, {"req-a": [], "req-b": []})
    assert kill.requests_in_flight == ["req-a", "req-b"] and kill.matched_steps == []
    assert unmatched([kill]) == [kill]


def test_a_step_of_the_wrong_kind_is_no_match():
    decode_kill, prefill_kill = fault("kill_decode", 10.0), fault("kill_prefill", 30.0)
    recs = [request("req-a", 8.0, 15.0), request("req-b", 29.5, 35.0)]
    attribute_steps([decode_kill, prefill_kill], recs,
                    {"req-a": [step("prefill_retry", 2.5)], "req-b": [step("decode_resume", 1.0)]})
    assert unmatched([decode_kill, prefill_kill]) == [decode_kill, prefill_kill]


def test_the_step_kinds_of_each_side():
    for name in ("decode_resume", "decode_retry", "aggregated_fallback"):
        assert answers("kill_decode", name) and answers("stop_decode", name) and not answers("kill_prefill", name)
    for name in ("prefill_retry", "local_prefill"):
        assert answers("kill_prefill", name) and answers("stop_prefill", name) and not answers("kill_decode", name)
    assert not answers("tier_down", "decode_resume")


def test_prefill_faults_are_matched_by_either_prefill_rung():
    first, second = fault("kill_prefill", 10.0), fault("stop_prefill", 40.0)
    recs = [request("req-a", 9.8, 14.0), request("req-b", 39.9, 60.0)]
    attribute_steps([first, second], recs, {"req-a": [step("prefill_retry", 0.4, "failed"),
                                                      step("local_prefill", 0.9)],
                                            "req-b": [step("prefill_retry", 10.2)]})
    assert [m["step"] for m in first.matched_steps] == ["prefill_retry", "local_prefill"]
    assert [m["step"] for m in second.matched_steps] == ["prefill_retry"]


def test_a_step_from_before_the_fault_is_no_match_beyond_the_clock_slack():
    kill = fault("kill_decode", 10.0)
    recs = [request("req-a", 0.0, 20.0)]
    attribute_steps([kill], recs, {"req-a": [step("decode_resume", 5.0)]})
    assert unmatched([kill]) == [kill]
    # within the slack (the gateway's clock starts the request a little after the client sent it) it is
    attribute_steps([kill], recs, {"req-a": [step("decode_resume", 9.0)]}, slack_s=2.0)
    assert unmatched([kill]) == []
    attribute_steps([kill], recs, {"req-a": [step("decode_resume", 9.0)]}, slack_s=0.5)
    assert unmatched([kill]) == [kill]


def test_a_request_not_in_flight_at_the_fault_cannot_answer_it():
    kill = fault("kill_decode", 10.0)
    before, after = request("req-a", 2.0, 9.0), request("req-b", 10.5, 14.0)
    attribute_steps([kill], [before, after], {"req-b": [step("decode_resume", 0.5)]})
    assert kill.requests_in_flight == [] and unmatched([kill]) == [kill]


def test_one_step_answers_one_fault_the_latest_before_it():
    first, second = fault("kill_decode", 10.0), fault("kill_decode", 20.0)
    recs = [request("req-a", 5.0, 30.0)]
    attribute_steps([first, second], recs, {"req-a": [step("decode_resume", 15.6)]})  # 20.6
    assert second.matched_steps and not first.matched_steps
    assert unmatched([first, second]) == [first]


def test_steps_without_a_time_are_ignored():
    kill = fault("kill_decode", 10.0)
    attribute_steps([kill], [request("req-a", 8.0, 15.0)], {"req-a": [{"step": "decode_resume"}]})
    assert unmatched([kill]) == [kill]


def test_tier_down_reports_requests_in_flight_but_needs_no_step_and_drops_are_left_to_the_ledger():
    tier, drop = fault("tier_down", 10.0), fault("drop", 11.0)
    attribute_steps([tier, drop], [request("req-a", 8.0, 15.0)], {})
    assert tier.requests_in_flight == ["req-a"] and not tier.needs_step
    assert not drop.needs_step and drop.requests_in_flight == []
    assert unmatched([tier, drop]) == []


def test_a_fault_that_did_not_fire_is_not_attributed():
    kill = FaultRecord(kind="kill_decode", at_s=10.0, t_mono=10.0, fired=False)
    attribute_steps([kill], [request("req-a", 8.0, 15.0)], {"req-a": [step("decode_resume", 2.5)]})
    assert kill.matched_steps == [] and not kill.needs_step


def test_prefill_rungs_seen_lists_those_in_any_record():
    assert prefill_rungs_seen({"a": [step("decode_resume", 1)], "b": [step("local_prefill", 1)]}) == ["local_prefill"]
    assert prefill_rungs_seen({"a": [step("local_prefill", 1), step("prefill_retry", 1)]}) == [
        "prefill_retry", "local_prefill"]
    assert prefill_rungs_seen({}) == []


def test_a_failure_counts_as_the_ladder_running_out_only_with_a_failed_step():
    steps = {"req-a": [step("prefill_retry", 1, "failed"), step("local_prefill", 2, "failed")],
             "req-b": [step("decode_resume", 1, "recovered")], "req-c": []}
    assert ladder_ran_out(["req-a", "req-b", "req-c", None, "req-d"], steps) == ["req-a"]


def test_fault_checks_counts_unmatched_faults_and_victims_that_were_not_busy():
    busy = fault("kill_decode", 10.0, victim_busy=True)
    idle = fault("kill_prefill", 20.0, victim_busy=False)
    blind = fault("stop_decode", 30.0, victim_busy="unknown")
    recs = [request("req-a", 8.0, 15.0), request("req-b", 19.0, 25.0), request("req-c", 29.0, 45.0)]
    verdicts = [Verdict(seq=0, request_id=r.request_id, state="completed") for r in recs]
    out = fault_checks([busy, idle, blind], recs, verdicts,
                       {"req-a": [step("decode_resume", 2.5)], "req-c": [step("decode_resume", 8.0)]})
    assert out["faults_unmatched"] == 1  # the prefill kill: its request had no prefill rung
    # the stop's victim was not seen busy by its gauges, but the step its stall caused shows it served
    assert out["victims_busy"] == {"true": 1, "false": 1, "unknown": 1} and out["victims_not_busy"] == 1
    assert out["prefill_rungs_seen"] == [] and out["failed_ladder_ran_out"] == 0 and out["faults_missed"] == 0


def test_a_fault_the_drill_found_missed_and_fired_again_is_counted_apart():
    missed = fault("kill_decode", 10.0, victim_busy=True)
    missed.missed = True
    again = fault("kill_decode", 20.0, victim_busy=True)
    recs = [request("req-a", 8.0, 15.0), request("req-b", 19.0, 25.0)]
    verdicts = [Verdict(seq=0, request_id=r.request_id, state="completed") for r in recs]
    out = fault_checks([missed, again], recs, verdicts, {"req-b": [step("decode_resume", 2.5)]})
    assert out["faults_unmatched"] == 0 and out["faults_missed"] == 1 and out["victims_not_busy"] == 0
    assert again.matched_steps and not missed.matched_steps
