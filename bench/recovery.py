"""``baton bench recovery``: decode-failure recovery on the real stack, time from the kill to the next token.

Each topology is a P/D deployment of the tiny model on its own Ray head, behind a ``baton gateway run``
process (:class:`baton.bench.chaos.stack.ChaosStack`: Postgres, Redis, a dedicated ``redis-server`` as
the LMCache tier), the gateway routing to the decode pool with the prefill pool as its fallback, as a
deployed route does:

- ``1p1d``: one prefill and one decode replica, the default of ``scripts/up``: when the decode replica
  dies there is no other, and the stream goes on on the prefill engine (aggregated fallback);
- ``1p2d``: two decode replicas: the other one, or the prefill engine, whichever answers first.

A trial streams a greedy generation (``ignore_eos``) of a new prompt through the gateway with vLLM's
token ids; once ``kill_after`` tokens reached the client, the decode replica serving it (found from the
engines' own gauges, :mod:`baton.bench.chaos.victims`) and its engine get SIGKILL. Measured at the
client, where the user is:

- the **largest gap** the client saw around the fault: from the last token that reached it before the
  kill to the next one (tokens already on their way when the replica died arrive in between, so the
  gap is the longest wait between two tokens from the kill on);
- the time from the kill to the first token the gateway's continuation produced (token number ``n + 1``
  where the request record's ``decode_resume`` step says it resumed after ``n``), and the gateway's own
  figure for the gap (the record's ``client_gap_ms``), which must agree with the client's;
- the **first request after the replacement**: once Serve calls the decode pool whole and healthy again,
  the next request's TTFT (a replacement engine that has not met its peers yet makes this one pay).

Each next to a fresh request's TTFT for a new prompt of the same length (undisturbed, before the kill),
in the same run, and the ratios. The resumed text is compared with an undisturbed greedy run of the
same prompt afterwards; the request record's steps say which rung served.

Arms: ``tier`` (the LMCache Redis tier as deployed), ``no_tier`` (the tier flushed right before the
kill, so no engine can load the prompt's KV from it), both on ``/v1/completions`` with a prompt of token
ids, and ``chat`` (the tier as deployed, on ``/v1/chat/completions`` with a text prompt of the same
length: the relay re-frames the continuation, a ``/completions`` stream, as chat chunks). Each trial
waits for Ray to bring the pool back to full strength before the next one.

``stall``: the same stream on ``/v1/completions``, its decode replica and engine SIGSTOPped instead of
killed (SIGCONT ``stall_s`` later): a replica that stops without dying, whose sockets stay open, so only
the gateway's token-gap watchdog can notice it. Its target is the largest gap at the client within 3x the
undisturbed stream's ITL p99 plus a fresh TTFT (shown as a ratio to the fresh TTFT like the others); no
replica is replaced, so it has no first request after a replacement.
"""

from __future__ import annotations

import itertools
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
ARMS = ("tier", "no_tier", "chat", "stall")
#: Ratio targets (largest client gap, or first request after the replacement, over a fresh TTFT); the stall
#: arm's comes from each trial's own figures (:data:`STALL_ITL_MULTIPLE`)
TARGETS = {"tier": 1.5, "no_tier": 3.0, "chat": 1.5}
#: A stalled decode replica's stream resumes within this many times its undisturbed ITL p99, plus a fresh TTFT.
STALL_ITL_MULTIPLE = 3.0
REPLACEMENT_TARGET = 1.5
RESUMED_AFTER = re.compile(r"resumed after (\d+) tokens")


@dataclass
class RecoveryConfig:
    topologies: tuple[str, ...] = ("1p1d", "1p2d")
    arms: tuple[str, ...] = ARMS
    repeats: int = 2
    prompt_len: int = 1024
    max_tokens: int = 1000
    """Long enough that the stream still runs when the engines' gauges (exported every second) show
    which decode replica serves it."""
    kill_after: int = 40
    stall_s: float = 5.0
    """How long the stall arm's replica stays stopped (SIGCONT then)."""
    stall_itl_multiple: float = STALL_ITL_MULTIPLE
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

    def largest_gap_ms(self, since: float) -> float | None:
        """The longest wait between two tokens at the client from the last token before ``since`` (the
        kill) on; None when no token came before it or none after."""
        before = [t for t in self.token_times if t <= since]
        after = [t for t in self.token_times if t > since]
        if not before or not after:
            return None
        times = [before[-1], *after]
        return max(b - a for a, b in itertools.pairwise(times)) * 1000


def stream(client: httpx.Client, ep: Any, prompt: list[int] | str, max_tokens: int, *,
           on_token: Callable[[Stream], None] | None = None) -> Stream:
    """A streamed greedy generation through the gateway of ``ep`` (an :class:`~.chaos.stack.Endpoint`), with
    per-token ids and arrival times: ``/v1/completions`` for a prompt of token ids, ``/v1/chat/completions``
    (one user message) for a text."""
    chat = isinstance(prompt, str)
    body: dict[str, Any] = {"model": ep.model, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    s = Stream(t_send=time.perf_counter())
    pieces: list[str] = []
    url = f"{ep.gateway_url}/v1/{'chat/completions' if chat else 'completions'}"
    with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {ep.api_key}"}) as r:
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
                pieces.append(((c.get("delta") or {}).get("content") if chat else c.get("text")) or "")
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


def _ratio(value: float | None, fresh: float | None) -> float | None:
    return value / fresh if value is not None and fresh else None


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
    from baton.bench.chaos.victims import RayMetricsAgent
    from baton.bench.datasets import HFTokenizer, exact_prompt

    rng = random.Random(cfg.seed)
    trials: list[dict[str, Any]] = []
    tok = HFTokenizer(ep.model_dir) if "chat" in cfg.arms and ep.model_dir is not None else None
    with httpx.Client(timeout=300, trust_env=False) as client:
        injector = Injector(ep, DrillConfig(replace_timeout_s=cfg.replace_timeout_s), None, 0.0, log)  # type: ignore[arg-type]
        loads = RayMetricsAgent([ep.metrics_url] if ep.metrics_url else (), ep.dashboard_url)

        def prompt(arm: str) -> list[int] | str:
            if arm == "chat":
                if tok is None:
                    raise RuntimeError("the chat arm needs the model's tokenizer (Endpoint.model_dir)")
                # the chat template adds a few tokens around the message
                return exact_prompt(tok, rng, cfg.prompt_len - 16)[0]
            return [rng.randrange(10, 1000) for _ in range(cfg.prompt_len)]

        def whole() -> None:
            if not asyncio.run(injector.wait_healthy("decode", cfg.replace_timeout_s)):
                raise RuntimeError("the decode pool did not come back to full strength")

        warm = stream(client, ep, prompt("tier"), 8)
        if warm.status != 200:
            raise RuntimeError(f"the stack does not answer: {warm.status} {warm.error}")
        try:
            for rep in range(cfg.repeats):
                for arm in cfg.arms:
                    whole()
                    stream(client, ep, prompt(arm), 8)  # the arm's endpoint once before the figure
                    fresh = stream(client, ep, prompt(arm), 8)
                    trial: dict[str, Any] = {"topology": name, "arm": arm, "repeat": rep,
                                             "fresh_ttft_ms": fresh.ttft_ms, "fresh_status": fresh.status}
                    trial.update(_kill_trial(client, ep, injector, loads, rng, cfg=cfg, arm=arm, p=prompt(arm),
                                              fresh=fresh))
                    # the first request once Serve calls the pool whole again: a replacement engine that has
                    # not met its peers makes this one pay (a stalled replica is not replaced)
                    whole()
                    first = stream(client, ep, prompt(arm), 8) if arm != "stall" else Stream()
                    trial.update(after_replacement_ttft_ms=first.ttft_ms, after_replacement_status=first.status,
                                 after_replacement_ratio=_ratio(first.ttft_ms, fresh.ttft_ms))
                    log(f"{name} {arm} #{rep}: largest client gap {_fmt(trial['client_gap_ms'])} ms (target "
                        f"{_fmt(trial.get('stall_bound_ms'))} ms), gateway "
                        f"{_fmt(trial['record_gap_ms'])}, fault -> next token {_fmt(trial['recovery_ms'])} ms, fresh "
                        f"TTFT {_fmt(fresh.ttft_ms)} ms, first after the replacement {_fmt(first.ttft_ms)} ms, rung "
                        f"{trial['rung']}, equal {trial['equal_undisturbed']}, victim busy "
                        f"{trial['victim'].get('busy')}")
                    trials.append(trial)
                    if advance:
                        advance()
        finally:
            injector.close()
    return trials


def _kill_trial(client: httpx.Client, ep: Any, injector: Any, loads: Any, rng: random.Random, *,
                cfg: RecoveryConfig, arm: str, p: list[int] | str, fresh: Stream) -> dict[str, Any]:
    """One stream whose decode replica is SIGKILLed (the stall arm: SIGSTOPped, SIGCONT ``stall_s`` later) after
    ``kill_after`` tokens, what the client saw of it, the request record's steps, and whether its text equals
    an undisturbed run of the same prompt."""
    import asyncio

    from baton.bench.chaos.faults import gone, signal_tree, stopped
    from baton.bench.chaos.victims import wait_for_busy_victim

    victim: dict[str, Any] = {}
    killer: list[threading.Thread] = []

    def kill(s: Stream) -> None:
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
        if arm == "stall":
            reached = signal_tree(tree, signal.SIGSTOP)
            s.kill_pc = time.perf_counter()
            try:
                deadline = time.monotonic() + 5
                while not stopped(choice.replica.pid) and time.monotonic() < deadline:
                    time.sleep(0.01)
                fired = choice.replica.pid in reached and stopped(choice.replica.pid)
                victim.update(fired=fired, busy=choice.busy, choice=choice.evidence,
                              evidence=f"SIGSTOP {reached}: {'stopped' if fired else 'not seen stopped'}")
                time.sleep(max(0.0, cfg.stall_s - (time.perf_counter() - s.kill_pc)))
            finally:
                went_on = signal_tree(tuple(reached), signal.SIGCONT)
                victim["evidence"] = f"{victim.get('evidence', '')}; SIGCONT {went_on}"
            return
        reached = signal_tree(tree, signal.SIGKILL)  # the kill's moment: the signal, not the teardown
        s.kill_pc = time.perf_counter()
        deadline = time.monotonic() + 10
        while not all(gone(pid) for pid in reached) and time.monotonic() < deadline:
            time.sleep(0.05)
        fired = bool(reached) and choice.replica.pid in reached and all(gone(pid) for pid in reached)
        evidence = f"SIGKILL {reached}: {'all gone' if fired else 'not all gone'}"
        victim.update(fired=fired, evidence=evidence, busy=choice.busy, choice=choice.evidence)

    def on_token(s: Stream) -> None:
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
    gap_ms = k.largest_gap_ms(k.kill_pc) if k.kill_pc is not None else None
    if arm == "stall":  # the undisturbed run on the decode pool, the stalled replica going again
        asyncio.run(injector.wait_healthy("decode", cfg.replace_timeout_s))
    ref = stream(client, ep, p, cfg.max_tokens)
    gaps = sorted(b - a for a, b in itertools.pairwise(ref.token_times))
    itl_p99_ms = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000 if gaps else None
    bound_ms = (cfg.stall_itl_multiple * itl_p99_ms + fresh.ttft_ms
                if arm == "stall" and itl_p99_ms is not None and fresh.ttft_ms is not None else None)
    resume = next((st for st in steps if st.get("step") == STEP_DECODE_RESUME), None)
    kill_at_ms = (k.kill_pc - k.t_send) * 1000 if k.kill_pc is not None else None
    return dict(
        # where the time goes: kill -> the gateway sees the stream break -> the continuation answers (the
        # gateway's clock starts within a millisecond or two of the client's)
        kill_at_ms=kill_at_ms,
        break_seen_after_kill_ms=(float(resume["at_ms"]) - kill_at_ms
                                  if resume is not None and kill_at_ms is not None else None),
        continuation_open_ms=float(resume["duration_ms"]) if resume is not None else None,
        record_gap_ms=resume.get("client_gap_ms") if resume is not None else None,
        victim=victim, status=k.status, finished=k.finished, error=k.error,
        tokens=len(k.ids), resumed_after=n, recovery_ms=recovery_ms, client_gap_ms=gap_ms,
        ratio=_ratio(gap_ms, fresh.ttft_ms), undisturbed_itl_p99_ms=itl_p99_ms, stall_bound_ms=bound_ms,
        equal_undisturbed=bool(ref.ids) and k.ids == ref.ids and k.text == ref.text,
        record_status=rec.get("status"),
        steps=[{kk: st.get(kk) for kk in ("step", "outcome", "duration_ms", "detail", "client_gap_ms")}
               for st in steps],
        rung=STEP_AGGREGATED_FALLBACK if any(st.get("step") == STEP_AGGREGATED_FALLBACK
                                             and st.get("outcome") == "recovered" for st in steps)
        else "decode_pool" if n is not None else None)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per topology and arm: medians, worst, and whether every trial recovered the exact text. The ratio
    targets hold for the median trial; the worst is shown beside it. The gap figures count only the kills
    that hit the stream (its record has a ``decode_resume``): the engines' gauges that name the busy
    replica are up to a second old, so with two decode replicas a kill can land on the idle one, and that
    stream's gap says nothing of recovery (``kills_that_hit`` says how many did)."""
    out: dict[str, Any] = {}
    for t in trials:
        out.setdefault(t["topology"], {}).setdefault(t["arm"], []).append(t)
    result: dict[str, Any] = {}
    for topo, arms in out.items():
        result[topo] = {}
        for arm, ts in arms.items():
            def col(key: str, ts: list[dict[str, Any]] = ts) -> list[float]:
                return [t[key] for t in ts if t.get(key) is not None]

            hit = [t for t in ts if t.get("resumed_after") is not None]
            gaps, ratios = col("client_gap_ms", hit), col("ratio", hit)
            after = col("after_replacement_ratio")
            bounds, fresh = col("stall_bound_ms"), col("fresh_ttft_ms")
            target = (round(statistics.median(bounds) / statistics.median(fresh), 2) if bounds and fresh
                      else TARGETS.get(arm, 1.5))
            result[topo][arm] = {
                "trials": len(ts),
                "kills_that_hit": len(hit),
                "client_gap_ms_median": _median(gaps),
                "client_gap_ms_max": round(max(gaps), 1) if gaps else None,
                "record_gap_ms_median": _median(col("record_gap_ms")),
                "recovery_ms_median": _median(col("recovery_ms")),
                "fresh_ttft_ms_median": _median(col("fresh_ttft_ms")),
                "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
                "ratio_max": round(max(ratios), 2) if ratios else None,
                "target_ratio": target,
                "stall_bound_ms_median": _median(bounds),
                "undisturbed_itl_p99_ms_median": _median(col("undisturbed_itl_p99_ms")),
                "after_replacement_ttft_ms_median": _median(col("after_replacement_ttft_ms")),
                "after_replacement_ratio_median": round(statistics.median(after), 2) if after else None,
                "after_replacement_ratio_max": round(max(after), 2) if after else None,
                "after_replacement_target": REPLACEMENT_TARGET,
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


__all__ = ["ARMS", "RecoveryConfig", "run_recovery", "run_trials", "summarise"]
