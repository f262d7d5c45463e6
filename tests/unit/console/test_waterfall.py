"""The request page's waterfall: drawn from the decode server's measured phases where the record has them,
derived from the record's timings where it does not; each span says which."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from baton.api.console.queries import waterfall
from baton.core import contracts as c
from baton.core import models as m


def _record(**kw: Any) -> m.RequestRecord:
    start = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
    fields: dict[str, Any] = {
        "id": uuid.uuid4(), "tenant_id": uuid.uuid4(), "model": "tiny", "endpoint": "chat/completions",
        "stream": True, "status": m.RequestStatus.COMPLETED, "http_status": 200, "prompt_tokens": 300,
        "completion_tokens": 11, "ttft_ms": 60.0, "tpot_ms": 4.0, "e2e_ms": 100.0, "kv_bytes": 131072,
        "handoff_ms": 2.5, "recovery_steps": [], "phases": None, "started_at": start,
        "finished_at": start + dt.timedelta(milliseconds=100),
    }
    fields.update(kw)
    return m.RequestRecord(**fields)


def _names(spans: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["name"], s["kind"]) for s in spans]


def test_without_phases_the_waterfall_is_derived_from_the_record() -> None:
    spans = waterfall(_record(recovery_steps=[c.RecoveryStep(c.STEP_DECODE_RESUME, 70.0, 5.0, "recovered",
                                                             "resumed after 3 tokens").to_json()]))
    assert _names(spans) == [("prefill", "prefill"), ("KV handoff", "kv_handoff"), ("decode", "decode"),
                             ("recovery: decode_resume", "recovery")]
    prefill, handoff, decode, resume = spans
    assert (prefill["start_ms"], prefill["duration_ms"]) == (0.0, 57.5)  # TTFT less the handoff: assumed
    assert (handoff["start_ms"], handoff["duration_ms"]) == (57.5, 2.5)
    assert (decode["start_ms"], decode["duration_ms"]) == (60.0, 40.0)
    assert (resume["start_ms"], resume["duration_ms"]) == (70.0, 5.0) and "resumed after 3 tokens" in resume["detail"]
    assert {s["source"] for s in spans} == {"record"}


def test_no_first_token_and_no_phases_is_one_span_for_the_request() -> None:
    spans = waterfall(_record(ttft_ms=None, tpot_ms=None, status=m.RequestStatus.FAILED, http_status=503))
    assert _names(spans) == [("request", "request")] and spans[0]["source"] == "record"
    assert "no first token (failed)" in spans[0]["detail"]


def test_measured_phases_are_drawn_as_measured() -> None:
    # The decode server received the request 4 ms after the gateway started it; its first prefill call
    # failed, the retry answered, then the decode engine pulled the KV and made its first token.
    fact = c.PhasesFact(1_800_000_000.0, (
        c.Phase(c.PHASE_REMOTE_PREFILL, 0.5, 10.0, "failed", attempt=1, detail="prefill failed: ActorDiedError"),
        c.Phase(c.PHASE_REMOTE_PREFILL, 11.0, 30.0, attempt=2),
        c.Phase(c.PHASE_KV_HANDOFF, 41.5, 9.0),
    ))
    phases = [p.to_json() for p in fact.on_request_axis(fact.received_unix - 0.004)]
    steps = [c.RecoveryStep(c.STEP_PREFILL_RETRY, 15.0, 30.0, "recovered", "attempt 2", "dataplane").to_json()]
    spans = waterfall(_record(phases=phases, recovery_steps=steps))
    assert _names(spans) == [("to the decode server", "dispatch"), ("prefill", "prefill"),
                             ("prefill (attempt 2)", "prefill"), ("KV handoff", "kv_handoff"),
                             ("decode", "decode"), ("recovery: prefill_retry", "recovery")]
    dispatch, failed, prefill, handoff, decode, _ = spans
    assert (dispatch["start_ms"], dispatch["duration_ms"]) == (0.0, 4.5)
    assert failed["detail"] == "failed: prefill failed: ActorDiedError"
    assert (prefill["start_ms"], prefill["duration_ms"]) == (15.0, 30.0)  # not TTFT less the handoff (57.5)
    assert (handoff["start_ms"], handoff["duration_ms"]) == (45.5, 9.0)
    assert "131072 bytes" in handoff["detail"] and "transfer 2.50 ms" in handoff["detail"]  # NIXL's own time
    # decode from the first token the decode server saw, to the end the gateway saw
    assert (decode["start_ms"], decode["duration_ms"]) == (54.5, 45.5)
    assert {s["source"] for s in spans} == {"spans"}


def test_a_local_prefill_is_the_first_token_and_a_failed_ladder_has_none() -> None:
    local = [c.Phase(c.PHASE_REMOTE_PREFILL, 1.0, 10.0, "failed", attempt=1, detail="no answer").to_json(),
             c.Phase(c.PHASE_LOCAL_PREFILL, 12.0, 40.0, detail="after: no answer").to_json()]
    spans = waterfall(_record(phases=local, handoff_ms=None, kv_bytes=None))
    assert _names(spans) == [("to the decode server", "dispatch"), ("prefill", "prefill"),
                             ("local prefill", "prefill"), ("decode", "decode")]
    assert spans[-1]["start_ms"] == 52.0
    gave_up = [c.Phase(c.PHASE_REMOTE_PREFILL, 0.0, 10.0, "failed", attempt=i).to_json() for i in (1, 2)]
    spans = waterfall(_record(phases=gave_up, ttft_ms=None, tpot_ms=None, status=m.RequestStatus.FAILED))
    assert _names(spans) == [("prefill", "prefill"), ("prefill (attempt 2)", "prefill"), ("request", "request")]
    assert {s["source"] for s in spans} == {"spans"}


def test_unreadable_phases_fall_back_to_the_record() -> None:
    spans = waterfall(_record(phases=[{"phase": "teleport"}, "x"]))
    assert [s["kind"] for s in spans] == ["prefill", "kv_handoff", "decode"]
    assert {s["source"] for s in spans} == {"record"}
