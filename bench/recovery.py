"""``baton bench recovery``: decode-failure recovery on the real stack, time from the kill to the next token.

Each topology is a P/D deployment of the tiny model on its own Ray head, behind a ``baton gateway run``
process (:class:`baton.bench.chaos.stack.ChaosStack`: Postgres, Redis, a dedicated ``redis-server`` as
the LMCache tier), the gateway routing to the decode pool with the prefill pool as its fallback, as a
deployed route does:

- ``1p1d``: one prefill and one decode replica, the default of ``scripts/up``: when the decode replica
  dies there is no other, and the stream goes on on the prefill engine (aggregated fallback);
- ``1p2d``: two decode replicas: the other one, or the prefill engine, whichever answers first.

A trial streams a greedy completion (``ignore_eos``) of a new prompt through the gateway with vLLM's
token ids; once ``kill_after`` tokens reached the client, the decode replica serving it (found from the
engines' own gauges, :mod:`baton.bench.chaos.victims`) and its engine get SIGKILL. Measured at the
client: the time from the kill to the first token the gateway's continuation produced (token number
``n + 1`` where the request record's ``decode_resume`` step says it resumed after ``n``; tokens already
on their way are not counted as recovered). Next to it, in the same run, a fresh request's TTFT for a
new prompt of the same length (undisturbed, before the kill), and the ratio. The resumed text is
compared with an undisturbed greedy run of the same prompt afterwards; the request record's steps say
which rung served.

Arms: ``tier`` (the LMCache Redis tier as deployed) and ``no_tier`` (the tier flushed right before the
kill, so no engine can load the prompt's KV from it). Each trial waits for Ray to bring the pool back
to full strength before the next one.
"""

from __future__ import annotations

import json
import random
import re
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from baton.core.contracts import STEP_AGGREGATED_FALLBACK, STEP_DECODE_RESUME

Log = Callable[[str], None]
TOPOLOGIES = {"1p1d": (1, 1), "1p2d": (1, 2)}
RESUMED_AFTER = re.compile(r"resumed after (\d+) tokens")


@dataclass
class RecoveryConfig:
    topologies: tuple[str, ...] = ("1p1d", "1p2d")
    arms: tuple[str, ...] = ("tier", "no_tier")
    repeats: int = 2
    prompt_len: int = 1024
    max_tokens: int = 1000
    """Long enough that the stream still runs when the engines' gauges (exported every second) show
    which decode replica serves it."""
    kill_after: int = 40
    seed: int = 0
    state_dir: str = "var/bench-recovery"
    replace_timeout_s: float = 600.0


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    request_id: str | None = None
    status: int | None = None
    t_send: float = 0.0
    token_times: list[float] = field(default_factory=list)  # one per token (chunks carry their ids)
    ids: list[int] = field(default_factory=list)
    text: str = ""
    error: str | None = None
    finished: bool = False
    kill_pc: float | None = None

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_times[0] - self.t_send) * 1000 if self.token_times else None


def stream(client: httpx.Client, ep: Any, prompt: list[int], max_tokens: int, *,
           on_token: Callable[[Stream], None] | None = None) -> Stream:
    """A streamed greedy completion through the gateway of ``ep`` (an :class:`~.chaos.stack.Endpoint`), with
    per-token ids and arrival times."""
    body = {"model": ep.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    s = Stream(t_send=time.perf_counter())
    pieces: list[str] = []
    with client.stream("POST", f"{ep.gateway_url}/v1/completions", json=body,
                       headers={"Authorization": f"Bearer {ep.api_key}"}) as r:
        s.status, s.request_id = r.status_code, r.headers.get("x-request-id")
        if r.status_code != 200:
            s.error = r.read().decode("utf-8", "replace")[:500]
            return s
        for line in r.iter_lines():
            if line.startswith("event: error"):
                s.error = "SSE error event"
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            for c in obj.get("choices") or ():
                ids = c.get("token_ids") or []
                now = time.perf_counter()
                s.ids.extend(ids)
                s.token_times.extend([now] * len(ids))
                pieces.append(c.get("text") or "")
                if c.get("finish_reason"):
                    s.finished = True
                if ids and on_token is not None:
                    on_token(s)
    s.text = "".join(pieces)
    return s


def _record(db: Any, request_id: str | None, wait_s: float = 20.0) -> dict[str, Any] | None:
    """The request record (status, steps) once the gateway wrote it."""
    from sqlalchemy import text

    if not request_id or not request_id.startswith("req-"):
        return None
    rid = uuid.UUID(request_id[4:])
    deadline = time.monotonic() + wait_s
    while True:
        with db.system() as uow:
            row = uow.session.execute(text("SELECT status, completion_tokens, recovery_steps FROM request_records "
                                           "WHERE id = :i"), {"i": rid}).first()
        if row is not None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if row is None:
        return None
    return {"status": str(getattr(row[0], "value", row[0])), "completion_tokens": row[1],
            "recovery_steps": list(row[2] or [])}


def _resumed_after(steps: list[dict[str, Any]]) -> int | None:
    for st in steps:
        if st.get("step") == STEP_DECODE_RESUME and st.get("outcome") == "recovered":
            m = RESUMED_AFTER.search(str(st.get("detail", "")))
            if m:
                return int(m.group(1))
    return None


def run_topology(name: str, cfg: RecoveryConfig, settings: Any, db: Any, *, log: Log,
                 advance: Callable[[], None] | None = None) -> dict[str, Any]:
    """Brings one topology up and runs every arm ``repeats`` times."""
    from baton.bench.chaos.stack import ChaosStack, StackConfig

    prefill, decode = TOPOLOGIES[name]
    scfg = StackConfig(state_dir=Path(cfg.state_dir) / name, prefill=prefill, decode=decode,
                       max_model_len=max(2048, cfg.prompt_len + cfg.max_tokens + 64))
    with ChaosStack(scfg, settings, db, log=log) as ep:
        trials = run_trials(ep, name, cfg, log=log, advance=advance)
    return {"topology": name, "prefill": prefill, "decode": decode, "trials": trials}


def run_trials(ep: Any, name: str, cfg: RecoveryConfig, *, log: Log,
               advance: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Every arm ``repeats`` times on a running P/D stack (a :class:`baton.bench.chaos.stack.Endpoint` whose
    database records the gateway's requests), the decode pool whole again before each kill."""
    import asyncio

    from baton.bench.chaos.drill import DrillConfig, Injector
    from baton.bench.chaos.faults import gone, signal_tree
    from baton.bench.chaos.victims import RayMetricsAgent, wait_for_busy_victim

    rng = random.Random(cfg.seed)
    trials: list[dict[str, Any]] = []
    with httpx.Client(timeout=300, trust_env=False) as client:
        injector = Injector(ep, DrillConfig(replace_timeout_s=cfg.replace_timeout_s), None, 0.0, log)  # type: ignore[arg-type]
        loads = RayMetricsAgent([ep.metrics_url] if ep.metrics_url else (), ep.dashboard_url)

        def prompt() -> list[int]:
            return [rng.randrange(10, 1000) for _ in range(cfg.prompt_len)]

        warm = stream(client, ep, prompt(), 8)
        if warm.status != 200:
            raise RuntimeError(f"the stack does not answer: {warm.status} {warm.error}")
        try:
            for rep in range(cfg.repeats):
                for arm in cfg.arms:
                    if not asyncio.run(injector.wait_healthy("decode", cfg.replace_timeout_s)):
                        raise RuntimeError("the decode pool did not come back to full strength")
                    stream(client, ep, prompt(), 8)  # a replacement engine's first request is a cold one
                    fresh = stream(client, ep, prompt(), 8)
                    trial: dict[str, Any] = {"topology": name, "arm": arm, "repeat": rep,
                                             "fresh_ttft_ms": fresh.ttft_ms, "fresh_status": fresh.status}
                    p = prompt()
                    victim: dict[str, Any] = {}
                    killer: list[threading.Thread] = []

                    def kill(s: Stream, victim: dict[str, Any] = victim, arm: str = arm) -> None:
                        """In its own thread: the client keeps reading (and timing) the stream meanwhile."""
                        if arm == "no_tier" and ep.redis_tier is not None:
                            import redis

                            redis.Redis.from_url(ep.redis_tier.url).flushall()
                        choice = asyncio.run(wait_for_busy_victim(
                            "decode", lambda: asyncio.to_thread(injector.finder.pool, "decode"), loads, rng,
                            timeout_s=3.0, poll_s=0.1))
                        if choice is None:
                            victim["evidence"] = "no decode replica found"
                            return
                        victim["tokens_at_kill"] = len(s.ids)
                        tree = choice.replica.tree
                        reached = signal_tree(tree, signal.SIGKILL)  # the kill's moment: the signal, not the teardown
                        s.kill_pc = time.perf_counter()
                        deadline = time.monotonic() + 10
                        while not all(gone(pid) for pid in reached) and time.monotonic() < deadline:
                            time.sleep(0.05)
                        fired = bool(reached) and choice.replica.pid in reached and all(gone(pid) for pid in reached)
                        evidence = f"SIGKILL {reached}: {'all gone' if fired else 'not all gone'}"
                        victim.update(fired=fired, evidence=evidence, busy=choice.busy, choice=choice.evidence)

                    def on_token(s: Stream, kill: Callable[[Stream], None] = kill,
                                 killer: list[threading.Thread] = killer) -> None:
                        if not killer and len(s.ids) >= cfg.kill_after:
                            killer.append(threading.Thread(target=kill, args=(s,), daemon=True))
                            killer[0].start()

                    k = stream(client, ep, p, cfg.max_tokens, on_token=on_token)
                    for t in killer:
                        t.join()
                    rec = _record(ep.db, k.request_id) or {}
                    steps = rec.get("recovery_steps", [])
                    n = _resumed_after(steps)
                    recovery_ms = None
                    if k.kill_pc is not None and n is not None and len(k.token_times) > n:
                        # the continuation's first token (number n + 1); it was made after the kill
                        recovery_ms = (k.token_times[n] - k.kill_pc) * 1000
                    ref = stream(client, ep, p, cfg.max_tokens)
                    resume = next((st for st in steps if st.get("step") == STEP_DECODE_RESUME), None)
                    kill_at_ms = (k.kill_pc - k.t_send) * 1000 if k.kill_pc is not None else None
                    trial.update(
                        # where the time goes: kill -> the gateway sees the stream break -> the continuation
                        # answers (the gateway's clock starts within a millisecond or two of the client's)
                        kill_at_ms=kill_at_ms,
                        break_seen_after_kill_ms=(float(resume["at_ms"]) - kill_at_ms
                                                  if resume is not None and kill_at_ms is not None else None),
                        continuation_open_ms=float(resume["duration_ms"]) if resume is not None else None,
                        victim=victim, status=k.status, finished=k.finished, error=k.error,
                        tokens=len(k.ids), resumed_after=n, recovery_ms=recovery_ms,
                        ratio=recovery_ms / fresh.ttft_ms if recovery_ms is not None and fresh.ttft_ms else None,
                        equal_undisturbed=bool(ref.ids) and k.ids == ref.ids, record_status=rec.get("status"),
                        steps=[{kk: st.get(kk) for kk in ("step", "outcome", "duration_ms", "detail")} for st in steps],
                        rung=STEP_AGGREGATED_FALLBACK if any(st.get("step") == STEP_AGGREGATED_FALLBACK
                                                          and st.get("outcome") == "recovered" for st in steps)
                        else "decode_pool" if n is not None else None)
                    log(f"{name} {arm} #{rep}: recovery {_fmt(recovery_ms)} ms, fresh TTFT {_fmt(fresh.ttft_ms)} ms, "
                        f"rung {trial['rung']}, equal {trial['equal_undisturbed']}, victim busy {victim.get('busy')}")
                    trials.append(trial)
                    if advance:
                        advance()
        finally:
            injector.close()
    return trials


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per topology and arm: medians, worst, and whether every trial recovered the exact text."""
    out: dict[str, Any] = {}
    for t in trials:
        out.setdefault(t["topology"], {}).setdefault(t["arm"], []).append(t)
    result: dict[str, Any] = {}
    for topo, arms in out.items():
        result[topo] = {}
        for arm, ts in arms.items():
            rec = [t["recovery_ms"] for t in ts if t["recovery_ms"] is not None]
            fresh = [t["fresh_ttft_ms"] for t in ts if t["fresh_ttft_ms"] is not None]
            ratios = [t["ratio"] for t in ts if t["ratio"] is not None]
            result[topo][arm] = {
                "trials": len(ts),
                "recovery_ms_median": round(statistics.median(rec), 1) if rec else None,
                "recovery_ms_max": round(max(rec), 1) if rec else None,
                "fresh_ttft_ms_median": round(statistics.median(fresh), 1) if fresh else None,
                "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
                "ratio_max": round(max(ratios), 2) if ratios else None,
                "target_ratio": 1.5 if arm == "tier" else 3.0,
                "all_recovered": all(t["recovery_ms"] is not None for t in ts),
                "all_completed": all(t["finished"] and t["record_status"] == "completed" for t in ts),
                "all_equal_undisturbed": all(t["equal_undisturbed"] for t in ts),
                "victims_busy": all(t["victim"].get("busy") is True for t in ts),
                "rungs": sorted({str(t["rung"]) for t in ts}),
            }
    return result


def run_recovery(cfg: RecoveryConfig, *, log: Log = print,
                 progress: Callable[[str, int], Callable[[Any], None]] | None = None) -> dict[str, Any]:
    import contextlib

    from baton.bench import report
    from baton.bench.chaos.stack import fresh_database
    from baton.core.db import Database
    from baton.core.settings import load_settings

    started = report.provenance()
    advance_fn = progress("recovery trials", len(cfg.topologies) * len(cfg.arms) * cfg.repeats) if progress else None
    trials: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        settings = stack.enter_context(fresh_database(load_settings(), log=log))
        db = Database.for_services(settings)
        stack.callback(db.dispose)
        for topo in cfg.topologies:
            part = run_topology(topo, cfg, settings, db, log=log,
                                advance=(lambda: advance_fn(1)) if advance_fn else None)
            trials.extend(part["trials"])
    return {"benchmark": "recovery", "config": asdict(cfg), "summary": summarise(trials), "trials": trials,
            "provenance": report.provenance(started)}


__all__ = ["RecoveryConfig", "run_recovery", "run_trials", "summarise"]
