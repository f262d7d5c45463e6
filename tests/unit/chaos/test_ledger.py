"""The chaos ledger sees every kind of broken stream: duplicated, missing and wrong tokens, a truncated
200, two final states, a lost request; and passes clean completed, failed and cancelled ones."""

from __future__ import annotations

import json

import pytest

from baton.bench.chaos.ledger import Baseline, Ledger, RequestRecord, align, judge, parse_sse

BASE_IDS = [11, 12, 13, 14, 15, 16]
PIECES = ["a", "b", "c", "d", "e", "f"]
BASE = Baseline(text="".join(PIECES), token_ids=BASE_IDS)


def chunk(text: str | None = None, tid: int | None = None, finish: str | None = None, **extra) -> str:
    choice = {"index": 0, "text": text or "", "finish_reason": finish}
    if tid is not None:
        choice["logprobs"] = {"tokens": [f"token_id:{tid}"], "token_logprobs": [-0.1]}
    return json.dumps({"choices": [choice], **extra})


def stream(ids: list[int], *, done: bool = True, finish: bool = True, usage: int | None = None,
           error: bool = False, ids_in_stream: bool = True) -> list[tuple[str | None, str]]:
    events: list[tuple[str | None, str]] = []
    for i, tid in enumerate(ids):
        last = finish and i == len(ids) - 1
        events.append((None, chunk(PIECES[BASE_IDS.index(tid)] if tid in BASE_IDS else "z",
                                   tid if ids_in_stream else None, "length" if last else None)))
    if usage is not None:
        events.append((None, json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": usage}})))
    if error:
        events.append(("error", json.dumps({"error": {"message": "The model failed to answer.", "type": "x"}})))
    if done:
        events.append((None, "[DONE]"))
    return events


def rec(events, **kw) -> RequestRecord:
    fields = {"seq": 0, "prompt": 0, "expected_tokens": 6, "http_status": 200, "request_id": "req-1", **kw}
    return RequestRecord(events=events, **fields)


def test_a_clean_stream_completes_with_nothing_wrong():
    v = judge(rec(stream(BASE_IDS, usage=6)), BASE)
    assert v.state == "completed" and v.finals == 1
    assert (v.duplicated, v.missing, v.mismatched) == (0, 0, 0)
    assert v.text_ok and v.usage_ok and v.token_unit == "token"


def test_a_duplicated_token_is_detected():
    ids = [11, 12, 13, 13, 14, 15, 16]
    v = judge(rec(stream(ids, usage=7)), BASE)
    assert v.duplicated == 1 and v.missing == 0
    assert not v.text_ok and not v.usage_ok


def test_a_resumed_stream_that_repeats_a_span_is_detected():
    ids = [11, 12, 13, 14, 13, 14, 15, 16]
    v = judge(rec(stream(ids, usage=8)), BASE)
    assert v.duplicated == 2 and v.missing == 0


def test_a_missing_token_is_detected():
    v = judge(rec(stream([11, 12, 14, 15, 16], usage=5)), BASE)
    assert v.missing == 1 and v.duplicated == 0 and not v.text_ok


def test_a_wrong_token_is_a_mismatch():
    v = judge(rec(stream([11, 12, 99, 14, 15, 16], usage=6)), BASE)
    assert v.mismatched == 1 and not v.text_ok


def test_a_truncated_200_is_detected():
    v = judge(rec(stream(BASE_IDS[:3], done=False, finish=False)), BASE)
    assert v.state == "truncated_200"
    # also when the transport broke rather than ending cleanly
    v = judge(rec(stream(BASE_IDS[:3], done=False, finish=False), ending="transport_error",
                  transport_error="RemoteProtocolError"), BASE)
    assert v.state == "truncated_200"


def test_two_final_states_are_detected():
    events = stream(BASE_IDS, done=False) + stream([], error=True, finish=False)
    v = judge(rec(events), BASE)
    assert v.finals == 2
    events = [*stream(BASE_IDS, done=False), (None, chunk("g", 17, "length")), (None, "[DONE]")]
    assert judge(rec(events), BASE).finals > 1
    events = [*stream(BASE_IDS), (None, chunk("g", 17))]
    assert judge(rec(events), BASE).finals > 1


def test_a_mid_stream_error_event_is_a_readable_failure_that_owes_its_tail():
    v = judge(rec(stream(BASE_IDS[:3], finish=False, error=True)), BASE)
    assert v.state == "failed" and v.finals == 1 and v.error
    assert v.text_ok and (v.duplicated, v.mismatched) == (0, 0)
    # the three tokens the client never got are missing, not forgiven as a prefix
    assert v.missing == v.missing_tail == 3


def test_a_failed_stream_with_a_wrong_prefix_is_detected():
    v = judge(rec(stream([11, 13], finish=False, error=True)), BASE)
    assert v.missing == 4 and v.missing_tail == 3  # the gap (12) and the untransmitted tail (14, 15, 16)


def test_a_failure_before_the_stream_owes_the_whole_answer():
    body = json.dumps({"error": {"message": "The model is not reachable right now.", "type": "x"}})
    v = judge(rec([], http_status=503, error_body=body), BASE)
    assert v.state == "failed" and v.missing == v.missing_tail == 6
    v = judge(rec([], http_status=None, ending="no_response"), BASE)
    assert v.state == "lost" and v.missing == v.missing_tail == 6


def test_a_cut_or_timed_out_stream_owes_its_tail_too():
    v = judge(rec(stream(BASE_IDS[:4], done=False, finish=False), ending="transport_error"), BASE)
    assert v.state == "truncated_200" and v.missing_tail == 2
    v = judge(rec(stream(BASE_IDS[:1], done=False, finish=False), ending="timeout"), BASE)
    assert v.state == "lost" and v.missing_tail == 5


def test_a_client_cancel_is_cancelled_and_its_prefix_checked():
    v = judge(rec(stream(BASE_IDS[:2], done=False, finish=False), ending="client_cancel", cancel_after=2), BASE)
    assert v.state == "cancelled" and v.text_ok and v.finals == 1
    assert v.missing == v.missing_tail == 0  # the client asked for no more
    v = judge(rec(stream([11, 13], done=False, finish=False), ending="client_cancel", cancel_after=2), BASE)
    assert v.missing == 1 and v.missing_tail == 0  # a gap inside the prefix still counts


def test_http_errors_must_be_readable():
    body = json.dumps({"error": {"message": "The model is not reachable right now.", "type": "x"}})
    assert judge(rec([], http_status=503, error_body=body, request_id=None), BASE).state == "failed"
    assert judge(rec([], http_status=502, error_body="<html>bad gateway</html>", request_id=None), BASE).state == "lost"
    assert judge(rec([], http_status=None, ending="no_response", transport_error="ConnectError"), BASE).state == "lost"
    assert judge(rec(stream(BASE_IDS[:2], done=False, finish=False), ending="timeout"), BASE).state == "lost"


def test_token_ids_from_return_token_ids():
    events = [(None, json.dumps({"choices": [{"index": 0, "text": p, "token_ids": [t],
                                              "finish_reason": "length" if t == 16 else None}]}))
              for p, t in zip(PIECES, BASE_IDS, strict=True)] + [(None, "[DONE]")]
    v = judge(rec(events), BASE)
    assert v.state == "completed" and v.token_unit == "token" and v.received == 6 and v.text_ok
    events.insert(3, events[2])
    assert judge(rec(events), BASE).duplicated == 1


def test_without_token_ids_the_text_is_aligned_by_character():
    v = judge(rec(stream(BASE_IDS, ids_in_stream=False)), BASE)
    assert v.token_unit == "char" and v.text_ok and v.duplicated == 0
    v = judge(rec(stream([11, 12, 13, 13, 14, 15, 16], ids_in_stream=False)), BASE)
    assert v.duplicated == 1 and not v.text_ok


def test_the_summary_counts_each_violation_and_flags_the_run():
    ledger = Ledger([BASE])
    ledger.add(rec(stream(BASE_IDS, usage=6), seq=0))
    ledger.add(rec(stream([11, 12, 12, 13, 14, 15, 16], usage=7), seq=1))
    ledger.add(rec(stream([11, 12, 14, 15, 16], usage=5), seq=2))
    ledger.add(rec(stream(BASE_IDS[:3], done=False, finish=False), seq=3))
    ledger.add(rec(stream(BASE_IDS, done=False) + stream([], error=True, finish=False), seq=4))
    ledger.add(rec(stream(BASE_IDS[:2], done=False, finish=False), seq=5, ending="client_cancel"))
    summary, _ = ledger.check()
    assert summary.sent == 6 and summary.accepted == 6
    assert summary.completed == 3 and summary.cancelled == 1 and summary.failed == 1
    # seq 2 misses one token; the truncated seq 3 never sent its last three
    assert summary.duplicated_tokens == 1 and summary.missing_tokens == 4 and summary.missing_tail_tokens == 3
    assert summary.truncated_200s == 1 and summary.multiple_finals == 1
    assert not summary.ok
    clean = Ledger([BASE])
    clean.add(rec(stream(BASE_IDS, usage=6)))
    assert clean.check()[0].ok


def test_parse_sse_keeps_event_names_and_the_unfinished_rest():
    raw = b'data: {"a":1}\n\nevent: error\ndata: {"error":{"message":"x"}}\n\ndata: [DONE]\n\ndata: {"b"'
    events, rest = parse_sse(raw)
    assert events == [(None, '{"a":1}'), ("error", '{"error":{"message":"x"}}'), (None, "[DONE]")]
    assert rest == 'data: {"b"'


@pytest.mark.parametrize(("expected", "received", "partial", "out"), [
    ([1, 2, 3], [1, 2, 3], False, (0, 0, 0)),
    ([1, 2, 3], [1, 2], True, (0, 0, 0)),
    ([1, 2, 3], [1, 2], False, (0, 1, 0)),
    ([1, 2, 3], [1, 1, 2, 3], False, (1, 0, 0)),
    ([1, 2, 3, 4], [1, 3], True, (0, 1, 0)),
])
def test_align(expected, received, partial, out):
    assert align(expected, received, partial=partial) == out


def test_the_chaos_cli_is_mounted():
    from typer.testing import CliRunner

    from baton.cli.main import app

    out = CliRunner().invoke(app, ["chaos", "run", "--help"])
    assert out.exit_code == 0 and "--kills" in out.output


def test_the_fault_plan_is_seeded_and_puts_the_forced_kills_first():
    from baton.bench.chaos.drill import DrillConfig

    cfg = DrillConfig(kills=6, stalls=2, drops=2, tier_downs=1, seed=3)
    plan = cfg.plan()
    assert plan == DrillConfig(kills=6, stalls=2, drops=2, tier_downs=1, seed=3).plan()
    assert plan[:2] == ["kill_decode", "kill_prefill"]
    assert sorted(plan) == sorted(["kill_decode"] * 3 + ["kill_prefill"] * 3 + ["stop_decode", "stop_prefill"]
                                  + ["drop"] * 2 + ["tier_down"])
