"""The chaos drill's verdict cannot pass by luck: a failed request, a kill that no recovery step answered,
a victim that was idle or unverified, a failed stream's missing tail each fail their invariant; and the
injector hits the replica its engine metrics show busy (after sending the long prompt before a prefill
fault)."""

from __future__ import annotations

import asyncio
import json

import pytest

from baton.bench.chaos import drill
from baton.bench.chaos.attribution import fault_checks
from baton.bench.chaos.drill import DrillConfig, Injector, LoadDriver, invariants, make_prompts
from baton.bench.chaos.faults import FaultRecord, Replica
from baton.bench.chaos.ledger import Baseline, Ledger, RequestRecord
from baton.bench.chaos.stack import Endpoint
from baton.bench.chaos.victims import EngineLoad

IDS = [11, 12, 13, 14]
BASE = Baseline(text="abcd", token_ids=IDS)


def events(ids: list[int], *, complete: bool = True, error: bool = False) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    for i, t in enumerate(ids):
        last = complete and i == len(ids) - 1
        out.append((None, json.dumps({"choices": [{"index": 0, "text": "abcd"[IDS.index(t)], "token_ids": [t],
                                                    "finish_reason": "length" if last else None}]})))
    if error:
        out.append(("error", json.dumps({"error": {"message": "The model failed to answer.", "type": "x"}})))
    if complete or error:
        out.append((None, "[DONE]"))
    return out


def request(seq: int, sent: float, ended: float, evs: list[tuple[str | None, str]], **kw) -> RequestRecord:
    return RequestRecord(seq=seq, prompt=0, expected_tokens=4, http_status=200, request_id=f"req-{seq}",
                         events=evs, t_send=sent, t_end=ended, **kw)


def verdict(records: list[RequestRecord], faults: list[FaultRecord], steps: dict, cfg: DrillConfig) -> dict:
    """The drill's result fields and invariants from synthetic requests, faults and request-record steps."""
    ledger = Ledger([BASE])
    for r in records:
        ledger.add(r)
    summary, verdicts = ledger.check()
    result = {**summary.to_dict(), **fault_checks(faults, records, verdicts, steps),
              "usage_records_ok": True, "record_states_ok": True, "faults_not_fired": 0,
              "faults_not_recovered": 0, "pools_healthy_at_end": {"prefill": True, "decode": True}}
    result["invariants"] = invariants(result, cfg)
    return result


def kill(kind: str = "kill_decode", t: float = 10.0, busy: bool | str = True) -> FaultRecord:
    return FaultRecord(kind=kind, at_s=t, t_mono=t, fired=True, victim_busy=busy)  # type: ignore[arg-type]


def resume(at_s: float, outcome: str = "recovered") -> dict:
    return {"step": "decode_resume", "at_ms": at_s * 1000, "duration_ms": 200, "outcome": outcome, "detail": ""}


def test_a_kill_answered_by_a_resume_passes():
    recs = [request(1, 8.0, 12.0, events(IDS)), request(2, 11.0, 13.0, events(IDS))]
    out = verdict(recs, [kill()], {"req-1": [resume(2.4)]}, DrillConfig())
    assert all(out["invariants"].values()), out["invariants"]


def test_a_kill_that_no_request_answered_fails_the_drill():
    recs = [request(1, 8.0, 12.0, events(IDS)), request(2, 11.0, 13.0, events(IDS))]
    out = verdict(recs, [kill()], {"req-1": [], "req-2": []}, DrillConfig())
    assert out["faults_unmatched"] == 1
    assert out["invariants"]["every_fault_matched_to_a_step"] is False
    # the step of another request, one not in flight at the kill, does not rescue it
    out = verdict(recs, [kill()], {"req-2": [resume(0.5)]}, DrillConfig())
    assert out["invariants"]["every_fault_matched_to_a_step"] is False


@pytest.mark.parametrize("busy", [False, "unknown"])
def test_a_victim_not_seen_busy_fails_the_drill_unless_a_step_answered_its_death(busy):
    recs = [request(1, 8.0, 12.0, events(IDS))]
    out = verdict(recs, [kill(busy=busy)], {}, DrillConfig())
    assert out["victims_not_busy"] == 1 and out["invariants"]["victims_were_busy"] is False
    out = verdict(recs, [kill(busy=busy)], {"req-1": [resume(2.4)]}, DrillConfig())
    assert out["victims_not_busy"] == 0 and out["invariants"]["victims_were_busy"] is True


def test_a_failed_request_fails_the_drill_even_with_a_readable_error():
    failed = request(1, 8.0, 12.0, events(IDS[:2], complete=False, error=True))
    out = verdict([failed], [], {"req-1": [resume(2.4, "failed")]}, DrillConfig())
    assert out["failed"] == 1
    assert out["invariants"]["no_failed_requests"] is False
    # its untransmitted tail is missing too
    assert out["missing_tokens"] == out["missing_tail_tokens"] == 2
    assert out["invariants"]["no_missing_tokens"] is False


def test_allowed_failures_are_only_those_where_the_ladder_ran_out():
    failed = request(1, 8.0, 12.0, events(IDS[:2], complete=False, error=True))
    allow = DrillConfig(allow_failures=True)
    out = verdict([failed], [], {"req-1": [resume(2.4, "failed")]}, allow)
    assert out["failed_ladder_ran_out"] == 1
    assert out["invariants"]["no_failed_requests"] and out["invariants"]["no_missing_tokens"]
    # a failure whose record shows no failed step never met the ladder
    out = verdict([failed], [], {"req-1": [resume(2.4, "recovered")]}, allow)
    assert out["invariants"]["no_failed_requests"] is False
    # a token missing inside the prefix is still missing
    gap = request(1, 8.0, 12.0, events([11, 13], complete=False, error=True))
    out = verdict([gap], [], {"req-1": [resume(2.4, "failed")]}, allow)
    assert out["invariants"]["no_failed_requests"] and out["invariants"]["no_missing_tokens"] is False


def test_a_client_drop_is_neither_a_failure_nor_missing_tokens():
    drop = request(1, 8.0, 12.0, events(IDS[:2], complete=False), ending="client_cancel", cancel_after=2)
    out = verdict([drop], [], {}, DrillConfig())
    assert out["cancelled"] == 1 and out["missing_tokens"] == 0
    assert out["invariants"]["no_failed_requests"] and out["invariants"]["no_missing_tokens"]


def test_both_prefill_rungs_are_required_only_when_asked():
    recs = [request(1, 9.9, 12.0, events(IDS)), request(2, 19.9, 23.0, events(IDS))]
    faults = [kill("kill_prefill", 10.0), kill("kill_prefill", 20.0)]
    rungs = {"req-1": [{"step": "prefill_retry", "at_ms": 300, "outcome": "recovered"}],
             "req-2": [{"step": "prefill_retry", "at_ms": 250, "outcome": "recovered"}]}
    out = verdict(recs, faults, rungs, DrillConfig())
    assert out["prefill_rungs_seen"] == ["prefill_retry"] and "prefill_rungs_seen" not in out["invariants"]
    assert all(out["invariants"].values())
    faults = [kill("kill_prefill", 10.0), kill("kill_prefill", 20.0)]
    out = verdict(recs, faults, rungs, DrillConfig(require_prefill_rungs=True))
    assert out["invariants"]["prefill_rungs_seen"] is False
    rungs["req-2"] = [{"step": "local_prefill", "at_ms": 900, "outcome": "recovered"}]
    faults = [kill("kill_prefill", 10.0), kill("kill_prefill", 20.0)]
    out = verdict(recs, faults, rungs, DrillConfig(require_prefill_rungs=True))
    assert out["invariants"]["prefill_rungs_seen"] is True and all(out["invariants"].values())


def test_the_long_prompt_is_one_more_prompt_at_the_end():
    short = make_prompts(3, 10, seed=1)
    both = make_prompts(3, 10, seed=1, long_words=200)
    assert both[:3] == short and len(both) == 4 and len(both[3].split()) > 200


# -- the injector, on fakes ---------------------------------------------------------------------------

class FakeFinder:
    method = "fake"

    def __init__(self, reps: list[Replica]) -> None:
        self.reps = reps

    def pool(self, pool: str) -> list[Replica]:
        return [r for r in self.reps if r.pool == pool]


class FakeMetrics:
    def __init__(self, *answers: dict[str, EngineLoad] | None, log: list[str] | None = None) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.log = log if log is not None else []

    def loads(self) -> dict[str, EngineLoad] | None:
        self.calls += 1
        self.log.append("metrics")
        return self.answers[min(self.calls, len(self.answers)) - 1]


def _injector(monkeypatch, reps, metrics, *, long_prompt=None, wait_s=2.0):  # type: ignore[no-untyped-def]
    ep = Endpoint(gateway_url="http://127.0.0.1:9", api_key="k", model="m", app="chaos-t",
                  pools={"prefill": 1, "decode": 2})
    cfg = DrillConfig(victim_wait_s=wait_s, replace_timeout_s=0.05)
    drv = LoadDriver(ep, cfg, ["p0", "p1"])
    inj = Injector(ep, cfg, drv, 0.0, lambda _m: None, metrics=metrics, long_prompt=long_prompt)
    inj.finder = FakeFinder(reps)  # type: ignore[assignment]
    killed: list[int] = []

    def fake_kill(rep: Replica, **_kw) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
        killed.append(rep.pid)
        return True, f"SIGKILL [{rep.pid}]: all gone"

    monkeypatch.setattr(drill, "kill_replica", fake_kill)
    return inj, drv, killed


async def _fire(inj: Injector, drv: LoadDriver, kind: str, pool: str) -> FaultRecord:
    try:
        return await inj._fire(kind, pool)  # type: ignore[arg-type]
    finally:
        for task in inj.background:  # the replacement watch: not under test
            task.cancel()
        await asyncio.gather(*inj.background, return_exceptions=True)
        await drv.close()


def test_the_injector_kills_the_replica_its_metrics_show_busy(monkeypatch):
    idle, busy = (Replica("decode", "Decode:m", 100, children=(101,), replica_id="r-idle"),
                  Replica("decode", "Decode:m", 200, children=(201,), replica_id="r-busy"))
    metrics = FakeMetrics({"r-idle": EngineLoad(0, 0), "r-busy": EngineLoad(0, 0)},
                          {"r-idle": EngineLoad(0, 0), "r-busy": EngineLoad(2, 0)})
    inj, drv, killed = _injector(monkeypatch, [idle, busy], metrics)
    drv.in_flight[1] = drill.InFlight(RequestRecord(seq=1, prompt=0, expected_tokens=48), chunks=3)
    f = asyncio.run(_fire(inj, drv, "kill_decode", "decode"))
    assert killed == [200] and f.fired and f.target.endswith("pid 200")
    assert f.victim_busy is True and f.victim_load == {"running": 2, "waiting": 0}
    assert "running requests on victim: 2 from metrics" in f.evidence


def test_a_decode_kill_waits_for_a_stream_early_in_its_answer(monkeypatch):
    """The engine's gauges say busy, but the only stream at the client is near its end (the engine may have
    generated all of it): no kill on that evidence; once a stream is early in its answer, the kill."""
    busy = Replica("decode", "Decode:m", 200, children=(201,), replica_id="r-busy")
    metrics = FakeMetrics(*[{"r-busy": EngineLoad(2, 0)}] * 50)
    inj, drv, killed = _injector(monkeypatch, [busy], metrics, wait_s=5.0)
    late = drill.InFlight(RequestRecord(seq=1, prompt=0, expected_tokens=48), chunks=40)
    drv.in_flight[1] = late

    async def go() -> FaultRecord:
        task = asyncio.create_task(_fire(inj, drv, "kill_decode", "decode"))
        await asyncio.sleep(0.6)
        assert killed == []
        drv.in_flight[2] = drill.InFlight(RequestRecord(seq=2, prompt=1, expected_tokens=48), chunks=2)
        return await task

    f = asyncio.run(go())
    assert killed == [200] and f.victim_busy is True


def test_the_injector_records_an_unverified_victim(monkeypatch):
    rep = Replica("decode", "Decode:m", 100, children=(101,), replica_id="r1")
    inj, drv, killed = _injector(monkeypatch, [rep], FakeMetrics(None), wait_s=0.3)
    f = asyncio.run(_fire(inj, drv, "kill_decode", "decode"))
    assert killed == [100] and f.victim_busy == "unknown" and "victim_busy: unknown" in f.evidence


def _fake_long_sends(monkeypatch, drv, order, sent=None):  # type: ignore[no-untyped-def]
    sent = [] if sent is None else sent

    def send_extra(idx: int) -> RequestRecord:
        rec = RequestRecord(seq=100 + len(sent), prompt=idx, expected_tokens=4, t_send=1.0)
        sent.append(rec)
        order.append(f"send {idx}")
        return rec

    monkeypatch.setattr(drv, "send_extra", send_extra)
    return sent


def test_before_a_prefill_fault_the_long_prompt_is_sent_and_the_fault_waits_for_it(monkeypatch):
    order: list[str] = []
    rep = Replica("prefill", "Prefill:m", 300, children=(301,), replica_id="p1")
    metrics = FakeMetrics({"p1": EngineLoad(0, 0)}, {"p1": EngineLoad(0, 0)}, {"p1": EngineLoad(1, 0)}, log=order)
    inj, drv, killed = _injector(monkeypatch, [rep], metrics, long_prompt=1)
    sent = _fake_long_sends(monkeypatch, drv, order)
    f = asyncio.run(_fire(inj, drv, "kill_prefill", "prefill"))
    # a fresh variant of the long prompt (index 2, after the load's): no prefix of it is cached anywhere
    assert order[0] == "send 2" and order[1:] == ["metrics"] * 3 and len(sent) == 1
    assert drv.prompts[2] == "Variant 1. p1" and drv.load_prompts == 2
    assert killed == [300] and f.victim_busy is True
    assert "long prompt seq 100 waiting for its first token" in f.evidence


def test_a_busy_prefill_after_the_long_prompt_got_its_first_token_is_not_taken(monkeypatch):
    order: list[str] = []
    rep = Replica("prefill", "Prefill:m", 300, children=(301,), replica_id="p1")
    sent: list[RequestRecord] = []

    class PrefillDoneFirst(FakeMetrics):
        def loads(self):  # type: ignore[no-untyped-def]
            if self.calls == 0:
                sent[0].token_times.append(2.0)  # the first long prompt's prefill ended unseen
            return super().loads()

    inj, drv, killed = _injector(monkeypatch, [rep], PrefillDoneFirst({"p1": EngineLoad(1, 0)}, log=order),
                                 long_prompt=1)
    _fake_long_sends(monkeypatch, drv, order, sent)
    f = asyncio.run(_fire(inj, drv, "kill_prefill", "prefill"))
    assert len(sent) == 2 and f.victim_busy is True and killed == [300]
    assert [r.prompt for r in sent] == [2, 3] and drv.prompts[2:] == ["Variant 1. p1", "Variant 2. p1"]
    assert "long prompt seq 101 waiting for its first token" in f.evidence


def test_the_cli_sets_the_new_drill_options():
    import typer

    from baton.cli.main import app

    chaos = typer.main.get_command(app).commands["chaos"]  # type: ignore[attr-defined]
    opts = {o for p in chaos.commands["run"].params for o in p.opts}
    assert {"--allow-failures", "--require-prefill-rungs", "--long-prompt-words", "--victim-wait", "--stall-s",
            "--metrics-url"} <= opts


def test_a_kill_that_hit_nothing_is_fired_again_at_most_miss_retries_times(monkeypatch):
    """The in-run check says the first decode kill hit nothing: it is marked missed and fired again; a kind
    that keeps missing is fired ``miss_retries`` more times, its last try left for the final attribution."""
    inj, drv, _ = _injector(monkeypatch, [], FakeMetrics(None))
    inj.cfg.gap_s = (0.0, 0.0)
    inj.ep.db = object()  # the in-run check reads the records (faked below)
    fired: list[str] = []

    async def fire(kind, pool):  # type: ignore[no-untyped-def]
        fired.append(kind)
        f = inj._new(kind, pool or "")
        f.fired = True
        return f

    misses = {"kill_decode": [True, False], "kill_prefill": [True, True, True, True]}

    async def missed(f):  # type: ignore[no-untyped-def]
        return misses[f.kind].pop(0)

    async def ready(*_a, **_k) -> bool:
        return True

    async def streams(*_a, **_k) -> int:
        return 1

    monkeypatch.setattr(inj, "_fire", fire)
    monkeypatch.setattr(inj, "_missed", missed)
    monkeypatch.setattr(inj, "wait_ready", ready)
    monkeypatch.setattr(inj, "wait_streams", streams)
    monkeypatch.setattr(inj, "wait_healthy", ready)
    asyncio.run(inj.run(["kill_decode", "kill_prefill"], None))
    asyncio.run(drv.close())
    assert fired == ["kill_decode", "kill_decode", "kill_prefill", "kill_prefill", "kill_prefill"]
    assert [f.missed for f in inj.faults] == [True, False, True, True, False]
