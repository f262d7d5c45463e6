"""Which recovery step answers which fault: the drill's proof that the ladder met each injected fault,
rather than the fault missing every request.

Inputs: the faults (:class:`~.faults.FaultRecord`, ``t_mono`` on the client's monotonic clock), the
client's requests (:class:`~.ledger.RequestRecord`, ``t_send``/``t_end`` on the same clock) and each
request's ``recovery_steps`` from its request record in Postgres (``{step, at_ms, duration_ms, outcome,
detail}``; ``at_ms`` counts from the request's start at the gateway, or for the data plane's steps at
the decode server: both after the client sent it), keyed by the client's ``x-request-id``.

Rules (pure functions, no I/O):

- In flight at a fault: sent before it and ended after it.
- A step's time on the client's clock is ``t_send + at_ms``. It is never later than the truth (the server
  starts the request after the client sent it), so a step may answer a fault when that time is no earlier
  than the fault less ``slack_s`` and no later than ``window_s`` after it.
- Kind: a decode fault is answered by a decode-side step (a name starting with ``decode_``, or
  ``aggregated_fallback``); a prefill fault by a prefill rung (``prefill_retry``, ``local_prefill``), or by
  ``kv_recompute`` (the prefill replica died after its prefill, before the decode engine pulled the KV:
  the decode engine recomputed the prompt).
- One step answers one fault at most: the latest fault of its kind, at or before the step (with the
  slack), at which the request was in flight. Two faults never share a step.
- Kills and stalls of replicas need a step (``needs_step``): a prefill whose replica died after it had
  finished affected nothing, and is not a match. A tier that is down is skipped silently by design: such
  a fault only reports the requests in flight. Drops are the ledger's (``cancelled``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from baton.bench.chaos.faults import FaultRecord
from baton.bench.chaos.ledger import RequestRecord, Verdict
from baton.core.contracts import PREFILL_STEPS, STEP_AGGREGATED_FALLBACK, STEP_KV_RECOMPUTE

PREFILL_RUNGS = PREFILL_STEPS
KV_RECOMPUTE = STEP_KV_RECOMPUTE
REPLICA_FAULTS = ("kill_decode", "kill_prefill", "stop_decode", "stop_prefill")
Steps = Mapping[str, Sequence[Mapping[str, Any]]]
"""Recovery steps by the client's request id."""


def is_decode_step(name: str) -> bool:
    return name.startswith("decode_") or name == STEP_AGGREGATED_FALLBACK


def answers(fault_kind: str, step_name: str) -> bool:
    """Whether a step of this name is the recovery a fault of this kind calls for."""
    if fault_kind.endswith("_decode"):
        return is_decode_step(step_name)
    if fault_kind.endswith("_prefill"):
        return step_name in (*PREFILL_RUNGS, KV_RECOMPUTE)
    return False


def in_flight(rec: RequestRecord, t: float) -> bool:
    return rec.t_send < t < rec.t_end


def _at_s(step: Mapping[str, Any]) -> float | None:
    at = step.get("at_ms")
    return float(at) / 1000 if isinstance(at, int | float) and not isinstance(at, bool) else None


def attribute_steps(faults: Sequence[FaultRecord], records: Iterable[RequestRecord], steps: Steps, *,
                    slack_s: float = 2.0, window_s: float = 120.0) -> None:
    """Fills each fault's ``requests_in_flight``, ``needs_step`` and ``matched_steps`` (see the rules)."""
    recs = [r for r in records if r.request_id]
    fired = sorted((f for f in faults if f.fired and f.kind != "drop"), key=lambda f: f.t_mono)
    for f in fired:
        f.needs_step = f.kind in REPLICA_FAULTS
        f.requests_in_flight = [str(r.request_id) for r in recs if in_flight(r, f.t_mono)]
        f.matched_steps = []
        f.in_flight_steps = {}
    targets = [f for f in fired if f.needs_step]
    for r in recs:
        for st in steps.get(str(r.request_id), ()):
            name, at = str(st.get("step", "")), _at_s(st)
            if at is None:
                continue
            t = r.t_send + at
            for f in targets:
                if in_flight(r, f.t_mono):
                    f.in_flight_steps.setdefault(str(r.request_id), []).append(
                        {"step": name, "outcome": st.get("outcome"), "source": st.get("source"),
                         "after_fault_s": round(t - f.t_mono, 3)})
            cands = [f for f in targets if answers(f.kind, name) and in_flight(r, f.t_mono)
                     and f.t_mono - slack_s <= t <= f.t_mono + window_s]
            if not cands:
                continue
            f = max(cands, key=lambda c: c.t_mono)
            f.matched_steps.append({"request_id": r.request_id, "step": name, "outcome": st.get("outcome"),
                                    "after_fault_s": round(t - f.t_mono, 3),
                                    "detail": str(st.get("detail", ""))[:160]})


def unmatched(faults: Iterable[FaultRecord]) -> list[FaultRecord]:
    """Fired faults that needed a recovery step and got none (a fault the drill found missed in the run, and
    fired again, is counted apart: ``faults_missed``)."""
    return [f for f in faults if f.fired and f.needs_step and not f.matched_steps and not f.missed]


def prefill_rungs_seen(steps: Steps) -> list[str]:
    """Which prefill rungs appear in any request record."""
    names = {str(st.get("step")) for sts in steps.values() for st in sts}
    return [r for r in PREFILL_RUNGS if r in names]


def ladder_ran_out(request_ids: Iterable[str | None], steps: Steps) -> list[str]:
    """Of these (failed) requests, those whose record shows the ladder tried and failed: a step with outcome
    ``failed``. A failure without one never met the ladder."""
    return [rid for rid in request_ids
            if rid is not None and any(st.get("outcome") == "failed" for st in steps.get(rid, ()))]


def fault_checks(faults: Sequence[FaultRecord], records: Sequence[RequestRecord], verdicts: Sequence[Verdict],
                 steps: Steps, *, slack_s: float = 2.0) -> dict[str, Any]:
    """Attributes the steps to the faults and returns the drill result's fields about them:
    ``faults_unmatched``, ``faults_missed``, ``victims_busy`` (count by value), ``victims_not_busy`` (of the
    faults that hit: neither busy by the gauges nor answered by a step), ``failed_ladder_ran_out``
    and ``prefill_rungs_seen``."""
    attribute_steps(faults, records, steps, slack_s=slack_s)
    replica = [f for f in faults if f.fired and f.kind in REPLICA_FAULTS]
    hits = [f for f in replica if not f.missed]
    failed = [r.request_id for r, v in zip(records, verdicts, strict=True) if v.state == "failed"]
    return {
        "faults_unmatched": len(unmatched(faults)),
        "faults_missed": sum(1 for f in replica if f.missed),
        "victims_busy": dict(Counter(str(f.victim_busy).lower() for f in replica)),
        # a victim is shown busy by its engine's gauges, or by the recovery steps its death caused
        "victims_not_busy": sum(1 for f in hits if f.victim_busy is not True and not f.matched_steps),
        "failed_ladder_ran_out": len(ladder_ran_out(failed, steps)),
        "prefill_rungs_seen": prefill_rungs_seen(steps),
    }
