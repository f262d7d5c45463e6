"""The chaos drill: baseline, steady streaming load through the gateway, seeded faults, the verdict.

1. Baseline: every prompt once, alone (greedy, ``ignore_eos``, fixed ``max_tokens``), then once more
   all at once; a prompt whose two answers differ is dropped from the load (its greedy output is not a
   reliable reference) and reported. The long prompt (``long_prompt_words``) is one of them.
2. Load: ``concurrency`` streams at all times, prompts drawn from the stable set (seeded).
3. Faults, one after another at seeded random gaps, each only when its pool is at full strength
   and streams are in flight: SIGKILL of a prefill or decode replica (engine core and replica
   process), SIGSTOP (+SIGCONT after ``stall_s``), the LMCache Redis tier down (and back up after
   ``tier_down_s``), and dropped client connections. A replica fault hits a replica whose engine reports
   a request at that moment (:mod:`.victims`); a decode fault also waits for a client stream early in
   its answer, and before a prefill fault the long prompt, if any, is sent and the fault waits for a
   prefill engine to report it. Each fault is checked to have fired; kills are checked to have been
   replaced by Ray. Gauges and clients lag on a loaded machine, so a victim may be idle when it dies:
   once the requests open at a replica fault have ended, their request records are read, and a fault no
   step answered is marked ``missed`` and fired again (``miss_retries``), its last try judged below.
   A client drop whose answer had reached the client in full first is tried on another stream.
4. The ledger (:mod:`.ledger`) judges every request; Postgres is checked for one usage record and one
   request record (with the matching status) per accepted request; recovery steps are read from the
   request records and each replica fault must be answered by a step of its kind in a request that was
   in flight at it (:mod:`.attribution`).

Invariants (``result["invariants"]``, all must hold for ``ok``): no lost request, no truncated 200, one
final state each, no failed request (with ``allow_failures``: only those whose record shows the ladder
ran out), no duplicated, missing (a failed stream's untransmitted tail included) or wrong token, text
equal to the baseline, usage counted once, one usage and one matching request record per request, every
fault fired and recovered, every replica fault matched to a recovery step (those found missed apart),
every replica fault's victim busy (by its gauges, or by the steps its death caused), and with
``require_prefill_rungs`` both prefill rungs seen.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import httpx

from baton.bench.chaos.attribution import PREFILL_RUNGS, REPLICA_FAULTS, attribute_steps, fault_checks
from baton.bench.chaos.faults import (
    FaultRecord,
    Pool,
    Replica,
    ReplicaFinder,
    continue_replica,
    kill_replica,
    stop_replica,
)
from baton.bench.chaos.ledger import Baseline, Ledger, RequestRecord, parse_sse, read_stream
from baton.bench.chaos.stack import Endpoint
from baton.bench.chaos.victims import EngineLoadSource, RayMetricsAgent, VictimChoice, wait_for_busy_victim
from baton.dataplane.render import PREFILL_APP_SUFFIX

Log = Callable[[str], None]
Progress = Callable[[str, float, float], None]
"""``progress(description, done, total)``."""

FAULT_KINDS = ("kill_decode", "kill_prefill", "stop_decode", "stop_prefill", "tier_down", "drop")
LONG_PROMPT_TRIES = 20  # long prompts sent one after another while waiting for a busy prefill
"""Most long-prompt requests sent before one prefill fault (each one whose prefill ended unseen is replaced)."""


@dataclass
class DrillConfig:
    kills: int = 4
    stalls: int = 1
    tier_downs: int = 1
    drops: int = 2
    seed: int = 0
    duration_s: float = 0.0
    """Least time the load runs (it also runs until every fault has fired and recovered)."""
    concurrency: int = 4
    prompts: int = 8
    prompt_words: int = 220
    max_tokens: int = 48
    gap_s: tuple[float, float] = (4.0, 15.0)
    stall_s: float = 6.0
    tier_down_s: float = 20.0
    replace_timeout_s: float = 420.0
    request_timeout_s: float = 180.0
    tail_s: float = 8.0
    token_ids: bool = True
    tier_down_whole_run: bool = False
    overlap: bool = False
    """Fire a replica fault while its pool is still below full strength (a replacement still starting), as long
    as another replica process of the pool exists; without it each replica fault waits for the pool to be
    whole and healthy again (on a 2-core machine a replacement engine takes minutes)."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Merged into every request body."""
    first_kills: tuple[str, ...] = ("kill_decode", "kill_prefill")
    """Faults forced to the front of the seeded order (the CI drill wants one of each early)."""
    allow_failures: bool = False
    """Let a request fail (with a readable error) where the recovery ladder ran out: its request record
    shows a recovery step that failed. Off (the default): no request may fail; a client drop is no failure."""
    require_prefill_rungs: bool = False
    """Require both prefill rungs (``prefill_retry``, ``local_prefill``) in the request records (the 20-kill
    run of the default topology shows both)."""
    long_prompt_words: int = 0
    """Above 0: a prompt of this many words (baselined like the others, judged like the load) is sent right
    before each prefill fault, again when one got its first token unseen (at most ``LONG_PROMPT_TRIES``), and
    the fault fires only while one waits for its first token and a prefill engine reports a request. Its
    engine must see it: a prompt longer than one engine step (``StackConfig.max_num_batched_tokens``)."""
    victim_wait_s: float = 30.0
    """How long a replica fault waits for a replica of its pool whose engine reports a request."""
    step_slack_s: float = 2.0
    """Clock slack when matching a recovery step's time (request start + ``at_ms``) to a fault's."""
    miss_retries: int = 2
    """A replica fault that hit nothing (judged in the run from the request records of the requests open at
    it: no recovery step it calls for) is fired again, at most this many more times per planned fault."""

    def plan(self) -> list[str]:
        rng = random.Random(self.seed)
        kinds = [("kill_decode" if i % 2 == 0 else "kill_prefill") for i in range(self.kills)]
        kinds += [("stop_decode" if i % 2 == 0 else "stop_prefill") for i in range(self.stalls)]
        kinds += ["drop"] * self.drops
        if not self.tier_down_whole_run:
            kinds += ["tier_down"] * self.tier_downs
        rng.shuffle(kinds)
        front = []
        for k in self.first_kills:
            if k in kinds:
                kinds.remove(k)
                front.append(k)
        return _interleave_pools(front + kinds)


def _pool_key(kind: str) -> str | None:
    return kind.rsplit("_", 1)[1] if kind.startswith(("kill_", "stop_")) else None


def _interleave_pools(kinds: list[str]) -> list[str]:
    """Reorders so that two replica faults on the same pool do not follow each other where avoidable:
    while one pool's replacement starts, the next fault hits the other pool."""
    rest = list(kinds)
    out: list[str] = []
    last: str | None = None
    while rest:
        pick = next((k for k in rest if _pool_key(k) is None or _pool_key(k) != last), rest[0])
        rest.remove(pick)
        out.append(pick)
        if _pool_key(pick) is not None:
            last = _pool_key(pick)
    return out


WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
    "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
    "whiskey", "xray", "yankee", "zulu", "river", "stone", "cloud", "light", "paper", "window", "garden",
    "silver", "market", "engine", "signal", "harbor", "planet", "forest", "winter", "summer", "orange",
    "yellow",
)


def make_prompts(n: int, words: int, seed: int, *, long_words: int = 0) -> list[str]:
    """``n`` prompts of ``words`` words; with ``long_words`` one more of that many at the end."""
    rng = random.Random(seed * 7919 + 17)
    out = [f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]
    if long_words > 0:
        out.append(f"Request {n} (long): " + " ".join(rng.choice(WORDS) for _ in range(long_words)))
    return out


@dataclass
class InFlight:
    rec: RequestRecord
    chunks: int = 0


class LoadDriver:
    def __init__(self, ep: Endpoint, cfg: DrillConfig, prompts: list[str]) -> None:
        self.ep = ep
        self.cfg = cfg
        self.prompts = prompts
        self.in_flight: dict[int, InFlight] = {}
        self._seq = 0
        self.records: list[RequestRecord] = []
        self.load_prompts = len(prompts)
        """Workers draw from the first ``load_prompts`` prompts; any after them the injector sends itself."""
        self.extra: list[asyncio.Task[RequestRecord]] = []
        """Requests the injector sent (the long prompt): awaited before the ledger judges."""
        self.stop = asyncio.Event()
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(cfg.request_timeout_s, connect=10.0), trust_env=False,
                                        limits=httpx.Limits(max_connections=cfg.concurrency * 2 + 4))

    def body(self, prompt: str) -> dict[str, Any]:
        n = self.cfg.max_tokens
        body: dict[str, Any] = {"model": self.ep.model, "prompt": prompt, "max_tokens": n, "ignore_eos": True,
                                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        if self.cfg.token_ids:
            # vLLM's per-chunk token ids (not logprobs: a request with logprobs is not resumable)
            body["return_token_ids"] = True
        body.update(self.cfg.extra_body)
        return body

    def _record(self, prompt_idx: int) -> RequestRecord:
        self._seq += 1
        return RequestRecord(seq=self._seq, prompt=prompt_idx, expected_tokens=self.cfg.max_tokens)

    async def send(self, prompt_idx: int, rec: RequestRecord | None = None) -> RequestRecord:
        rec = rec or self._record(prompt_idx)
        fl = InFlight(rec)
        self.in_flight[rec.seq] = fl
        rec.t_send = time.monotonic()
        try:
            async with asyncio.timeout(self.cfg.request_timeout_s * 2):
                await self._stream(fl)
        except TimeoutError:
            rec.ending = "timeout"
        except httpx.TimeoutException as exc:
            rec.ending = "timeout"
            rec.transport_error = type(exc).__name__
        except httpx.HTTPError as exc:
            rec.ending = "no_response" if rec.http_status is None else "transport_error"
            rec.transport_error = type(exc).__name__
        finally:
            rec.t_end = time.monotonic()
            self.in_flight.pop(rec.seq, None)
            self.records.append(rec)
        return rec

    async def _stream(self, fl: InFlight) -> None:
        rec = fl.rec
        headers = {"Authorization": f"Bearer {self.ep.api_key}"}
        url = self.ep.gateway_url.rstrip("/") + "/v1/completions"
        async with self.client.stream("POST", url, json=self.body(self.prompts[rec.prompt]), headers=headers) as resp:
            rec.http_status = resp.status_code
            rec.request_id = resp.headers.get("x-request-id")
            if resp.status_code != 200:
                rec.error_body = (await resp.aread()).decode("utf-8", "replace")[:4000]
                return
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            buf = ""
            async for raw in resp.aiter_raw():
                events, buf = parse_sse(buf + decoder.decode(raw))
                now = time.monotonic()
                for ev in events:
                    rec.events.append(ev)
                    if _has_content(ev[1]):
                        fl.chunks += 1
                        rec.token_times.append(now)
                if rec.cancel_after is not None and fl.chunks >= rec.cancel_after:
                    rec.ending = "client_cancel"
                    return  # leaving the block closes the connection mid-stream
            events, _ = parse_sse(buf + decoder.decode(b"", final=True) + "\n\n")
            rec.events.extend(events)

    async def worker(self, wid: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + wid)
        while not self.stop.is_set():
            await self.send(rng.randrange(self.load_prompts))

    def add_prompt(self, text: str) -> int:
        """A prompt the injector sends itself (its baseline is taken after the load); returns its index."""
        self.prompts.append(text)
        return len(self.prompts) - 1

    def send_extra(self, prompt_idx: int) -> RequestRecord:
        """Sends one request besides the workers' (judged like theirs); its record fills in as it streams."""
        rec = self._record(prompt_idx)
        rec.t_send = time.monotonic()
        self.extra.append(asyncio.create_task(self.send(prompt_idx, rec)))
        return rec

    async def close(self) -> None:
        await self.client.aclose()


def _has_content(data: str) -> bool:
    if not data or data.startswith("[DONE]"):
        return False
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    return any((c.get("text") or c.get("token_ids") or (c.get("delta") or {}).get("content"))
               for c in (obj.get("choices") or ()) if isinstance(c, dict))


# -- baseline -----------------------------------------------------------------------------------------

async def record_baseline(drv: LoadDriver, n: int | Sequence[int], log: Log, *,
                          keep: list[RequestRecord] | None = None) -> tuple[list[Baseline | None], list[int]]:
    """Each prompt alone, then all together; returns baselines and the indexes of unstable prompts.
    ``n``: the first n prompts, or these indexes. The baseline's own records are dropped from the driver's;
    ``keep``: the records to leave there (None: none)."""
    idxs = list(range(n)) if isinstance(n, int) else list(n)
    kept = list(keep or ())
    first = [await drv.send(i) for i in idxs]
    second = await asyncio.gather(*(drv.send(i) for i in idxs))
    baselines: list[Baseline | None] = []
    unstable = []
    for i, a, b in zip(idxs, first, second, strict=True):
        sa, sb = read_stream(a.events), read_stream(b.events)
        ok_a = a.http_status == 200 and sa.done and not sa.errors
        if not ok_a:
            raise RuntimeError(f"baseline request for prompt {i} failed (HTTP {a.http_status}, "
                               f"{a.error_body or a.transport_error or sa.errors})")
        text_a, text_b = "".join(sa.texts), "".join(sb.texts)
        ids = sa.ids if (sa.ids and sa.ids_complete) else None
        if len(sa.ids if ids else sa.texts) == 0:
            raise RuntimeError(f"baseline for prompt {i} is empty")
        if text_a != text_b or (ids is not None and sb.ids != ids):
            unstable.append(i)
        baselines.append(Baseline(text=text_a, token_ids=ids))
    own = {id(r) for r in (*first, *second)}
    drv.records[:] = [r for r in kept if id(r) not in own]
    with_ids = bool(baselines and baselines[0] and baselines[0].token_ids)
    log(f"baseline: {len(idxs)} prompts, {len(unstable)} unstable, token ids {'yes' if with_ids else 'no'}")
    return baselines, unstable


# -- faults -------------------------------------------------------------------------------------------

class Injector:
    def __init__(self, ep: Endpoint, cfg: DrillConfig, drv: LoadDriver, t0: float, log: Log, *,
                 metrics: EngineLoadSource | None = None, long_prompt: int | None = None) -> None:
        self.ep = ep
        self.cfg = cfg
        self.drv = drv
        self.t0 = t0
        self.log = log
        self.long_prompt = long_prompt
        """Index (in the driver's prompts) of the long prompt sent before each prefill fault; None: off."""
        self.finder = ReplicaFinder(ep.app, ep.dashboard_url)
        self.rng = random.Random(cfg.seed + 1)
        self.faults: list[FaultRecord] = []
        self.background: list[asyncio.Task[None]] = []
        self.pools_healthy_at_end: dict[str, bool] = {}
        self.variants = 0  #: fresh long prompts sent (each a prompt of the driver's own, after the load's)
        self.serve = None
        token = None
        if ep.dashboard_url:
            from pathlib import Path

            from baton.control.ray_client import RayServeClient, read_token

            token = read_token(Path.home() / ".ray" / "auth_token")
            self.serve = RayServeClient(ep.dashboard_url, token=token)
        self.metrics: EngineLoadSource = metrics or RayMetricsAgent(
            [ep.metrics_url] if ep.metrics_url else (), ep.dashboard_url, token=token)

    def _healthy(self, pool: Pool) -> bool:
        """The pool has its full count of replicas and Serve calls the deployment healthy."""
        reps = self.finder.pool(pool)
        if len(reps) < self.ep.pools.get(pool, 1):
            return False
        if self.serve is not None:
            try:
                # a P/D deployment's prefill pool is an application of its own
                app = self.serve.status().apps.get(self.ep.app + PREFILL_APP_SUFFIX if pool == "prefill"
                                                   else self.ep.app)
            except Exception:
                return False
            if app is None:
                return False
            prefix = "Prefill:" if pool == "prefill" else "Decode:"
            deps = {k: v for k, v in app.deployments.items() if k.startswith(prefix)}
            return bool(deps) and all(v == "HEALTHY" for v in deps.values())
        return True

    async def wait_healthy(self, pool: Pool, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await asyncio.to_thread(self._healthy, pool):
                return True
            await asyncio.sleep(1)
        return False

    async def wait_ready(self, pool: Pool) -> bool:
        """Whether a replica fault on ``pool`` may fire now (see :attr:`DrillConfig.overlap`).

        Without overlap every pool must be whole, not only the victim's: while the decode pool is still
        being replaced, the prefill engine serves the decode side too (the aggregated fallback), and a
        prefill fault then is a double fault (with one replica each, nothing is left to serve)."""
        if not self.cfg.overlap:
            others: tuple[Pool, ...] = tuple(p for p in ("prefill", "decode") if p != pool and self.ep.pools.get(p))
            for p in (*others, pool):
                if not await self.wait_healthy(p, self.cfg.replace_timeout_s):
                    return False
            return True
        deadline = time.monotonic() + self.cfg.replace_timeout_s
        while time.monotonic() < deadline:
            if len(await asyncio.to_thread(self.finder.pool, pool)) >= 2:
                return True
            await asyncio.sleep(1)
        return False

    async def wait_streams(self, timeout_s: float = 60) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            n = sum(1 for f in self.drv.in_flight.values() if f.chunks > 0)
            if n:
                return n
            await asyncio.sleep(0.05)
        return 0

    async def _missed(self, f: FaultRecord, wait_s: float = 240.0, records_s: float = 30.0) -> bool:
        """Whether a replica fault hit nothing: once every request open at it has ended and has its request
        record, none shows a recovery step that answers it (:func:`attribute_steps`' rules)."""
        open_ = [fl.rec for fl in list(self.drv.in_flight.values()) if fl.rec.t_send < f.t_mono]
        open_ += [r for r in self.drv.records if r.t_send < f.t_mono < r.t_end]
        deadline = time.monotonic() + wait_s
        while any(r.seq in self.drv.in_flight for r in open_) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        ids = {rid: r for r in open_ if r.request_id and (rid := _rid(r.request_id)) is not None}
        if not ids:
            return True
        deadline = time.monotonic() + records_s
        while True:  # the gateway writes a record just after its request ends
            found = await asyncio.to_thread(read_recovery_steps, self.ep.db, list(ids))
            if len(found) == len(ids) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        steps = {str(ids[rid].request_id): sts for rid, sts in found.items()}
        probe = FaultRecord(kind=f.kind, at_s=f.at_s, t_mono=f.t_mono, fired=True)
        attribute_steps([probe], list(ids.values()), steps, slack_s=self.cfg.step_slack_s)
        if not probe.matched_steps:  # where the open requests were at the client: what the victim missed
            f.evidence += "; open at it: " + ", ".join(
                f"seq {r.seq} ({sum(1 for t in r.token_times if t < f.t_mono)} chunks before, "
                f"ended {r.t_end - f.t_mono:+.2f} s)" for r in ids.values())
        return not probe.matched_steps

    def _new(self, kind: str, target: str = "") -> FaultRecord:
        now = time.monotonic()
        f = FaultRecord(kind=kind, at_s=round(now - self.t0, 3), t_mono=now, target=target)
        self.faults.append(f)
        return f

    async def run(self, plan: list[str], progress: Progress | None) -> None:
        plan = list(plan)
        retries: list[int] = [0] * len(plan)
        i = -1
        while i + 1 < len(plan):
            i += 1
            kind = plan[i]
            await asyncio.sleep(self.rng.uniform(*self.cfg.gap_s))
            pool: Pool | None = ("decode" if kind.endswith("decode") else
                                 "prefill" if kind.endswith("prefill") else None)
            if pool is not None and not await self.wait_ready(pool):
                f = self._new(kind, pool)
                f.evidence = f"the {pool} pool never came back to full strength; fault skipped"
                self.log(f"fault {i + 1}/{len(plan)} {kind}: NOT FIRED ({f.evidence})")
                continue
            streams = await self.wait_streams()
            try:
                f = await self._fire(kind, pool)
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                f = self._new(kind)
                f.evidence = f"injection failed: {type(exc).__name__}: {exc}"
            f.streams_in_flight = streams
            self.log(f"fault {i + 1}/{len(plan)} {kind} at {f.at_s:.1f}s: {'fired' if f.fired else 'NOT FIRED'} "
                     f"({f.evidence})")
            if (f.fired and kind in REPLICA_FAULTS and self.ep.db is not None
                    and retries[i] < self.cfg.miss_retries and await self._missed(f)):
                f.missed = True
                plan.insert(i + 1, kind)
                retries.insert(i + 1, retries[i] + 1)
                self.log(f"fault {i + 1} {kind} hit nothing (no request open at it needed recovery): firing it again")
            if progress:
                progress("faults", i + 1, len(plan))
        if self.background:
            await asyncio.gather(*self.background)
        pools: tuple[Pool, ...] = ("prefill", "decode")
        for p in pools:  # every pool back at full strength before the load ends
            if self.ep.pools.get(p):
                self.pools_healthy_at_end[p] = await self.wait_healthy(p, self.cfg.replace_timeout_s)

    async def _fire(self, kind: str, pool: Pool | None) -> FaultRecord:
        if kind == "drop":
            return await self._drop()
        if kind == "tier_down":
            return await self._tier_down()
        assert pool is not None
        seen: list[Replica] = []

        async def replicas() -> list[Replica]:
            seen[:] = await asyncio.to_thread(self.finder.pool, pool)
            return list(seen)

        if pool == "prefill" and self.long_prompt is not None:
            choice = await self._victim_in_long_prefill(replicas)
        else:
            # a decode victim is killed while a client's stream is early in its answer, so that the engine
            # is surely still decoding it (its gauges lag a scrape behind, and a short answer can have been
            # generated in full while the last chunks are still on their way to a slow client)
            early = max(1, self.cfg.max_tokens // 3)
            accept = (lambda: any(0 < fl.chunks <= early for fl in self.drv.in_flight.values())) \
                if pool == "decode" else None
            choice = await wait_for_busy_victim(pool, replicas, self.metrics, self.rng,
                                                timeout_s=self.cfg.victim_wait_s, accept=accept)
        if choice is None:
            f = self._new(kind, pool)
            f.evidence = f"no {pool} replica found"
            return f
        rep = choice.replica
        if kind.startswith("kill"):
            f = self._new(kind, f"{rep.deployment} pid {rep.pid}")
            _victim(f, choice)
            f.pids = list(rep.tree)
            before = {r.pid for r in seen}
            f.fired, evidence = await asyncio.to_thread(kill_replica, rep)
            f.evidence = f"{evidence}; {choice.evidence}"
            if f.fired:
                self.background.append(asyncio.create_task(self._watch_replacement(f, rep, before)))
            return f
        f = self._new(kind, f"{rep.deployment} pid {rep.pid}")
        _victim(f, choice)
        f.fired, pids, evidence = await asyncio.to_thread(stop_replica, rep)
        f.evidence = f"{evidence}; {choice.evidence}"
        f.pids = list(pids)
        self.background.append(asyncio.create_task(self._resume(f, pids, rep)))
        return f

    def _fresh_long_prompt(self) -> int:
        """The long prompt behind a mark of its own: no prefix of it is cached anywhere (the
        baseline run put the plain one in the engines' prefix caches and LMCache), so its prefill really runs
        the engine steps the gauges can see, instead of one step that ends between two metrics exports."""
        base = self.drv.prompts[cast(int, self.long_prompt)]
        self.variants += 1
        return self.drv.add_prompt(f"Variant {self.variants}. {base}")

    async def _victim_in_long_prefill(self, replicas: Callable[[], Awaitable[list[Replica]]]) -> VictimChoice | None:
        """Keeps a long-prompt request waiting for its first token (a new one once the last got it, at most
        :data:`LONG_PROMPT_TRIES`) and accepts a busy prefill replica only while one waits: the fault then
        falls inside a long prompt's prefill (or its KV handoff), not after it."""
        longs: list[RequestRecord] = []

        def waiting() -> RequestRecord | None:
            return next((r for r in longs if not r.token_times and not r.t_end), None)

        async def keep() -> None:
            while len(longs) < LONG_PROMPT_TRIES:
                if waiting() is None:
                    longs.append(self.drv.send_extra(self._fresh_long_prompt()))
                await asyncio.sleep(0.05)

        keeper = asyncio.create_task(keep())
        await asyncio.sleep(0)  # the first long prompt goes out before the metrics are read
        try:
            choice = await wait_for_busy_victim("prefill", replicas, self.metrics, self.rng,
                                                timeout_s=self.cfg.victim_wait_s,
                                                accept=lambda: waiting() is not None)
        finally:
            keeper.cancel()
        w = waiting()
        if choice is not None:
            choice.evidence += (f"; long prompt seq {w.seq} waiting for its first token" if w else
                                f"; no long prompt waiting for its first token ({len(longs)} sent)")
        return choice

    async def _resume(self, f: FaultRecord, pids: tuple[int, ...], rep: Replica) -> None:
        await asyncio.sleep(self.cfg.stall_s)
        f.evidence += "; " + continue_replica(pids)
        pool: Pool = rep.pool
        start = time.monotonic()
        f.recovered = await self.wait_healthy(pool, self.cfg.replace_timeout_s)
        f.recovery_s = round(time.monotonic() - f.t_mono, 2)
        alive = {r.pid for r in self.finder.pool(pool)}
        f.evidence += "; replica kept" if rep.pid in alive else "; replica replaced by Ray"
        del start

    async def _watch_replacement(self, f: FaultRecord, rep: Replica, before: set[int]) -> None:
        """Recovered once Ray runs a new replica process in the pool (with ``overlap``) or, otherwise, once
        the pool is whole and Serve reports it healthy again."""
        deadline = time.monotonic() + self.cfg.replace_timeout_s
        while time.monotonic() < deadline:
            reps = await asyncio.to_thread(self.finder.pool, rep.pool)
            pids = {r.pid for r in reps}
            replaced = rep.pid not in pids and bool(pids - before) and len(reps) >= self.ep.pools.get(rep.pool, 1)
            if replaced and (self.cfg.overlap or await asyncio.to_thread(self._healthy, rep.pool)):
                f.recovered = True
                f.recovery_s = round(time.monotonic() - f.t_mono, 2)
                return
            await asyncio.sleep(1)
        f.recovered = False

    async def _drop(self, wait_s: float = 120.0, tries: int = 5) -> FaultRecord:
        """Marks a stream that is in its first half to be closed by the client after its next chunk; waits
        for such a stream (after a replica fault every stream may be waiting for its first token). On a busy
        machine the rest of a short answer can reach the client in the same read as the chunk it stops at:
        such a drop came after the answer (the gateway saw no cancel), and another stream is tried, up to
        ``tries`` in all. Whether the last one cut its stream is judged at the end, from its record."""
        deadline = time.monotonic() + wait_s
        f = self._new("drop")
        late: list[int] = []
        for _ in range(tries):
            cands: list[Any] = []
            while True:
                cands = [fl for fl in self.drv.in_flight.values()
                         if fl.chunks > 0 and fl.rec.cancel_after is None and fl.chunks <= self.cfg.max_tokens // 2]
                if cands or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            if not cands:
                break
            fl = self.rng.choice(cands)
            fl.rec.cancel_after = fl.chunks + 1
            f.target = f"request seq {fl.rec.seq}"
            f.pids = [fl.rec.seq]
            f.evidence = "pending (checked at the end)" + (f"; earlier tries answered in full first: seq {late}"
                                                           if late else "")
            f.fired = True  # confirmed or refuted at the end from the request's ending
            while fl.rec.seq in self.drv.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110 (no event per flight)
                await asyncio.sleep(0.05)
            got = read_stream(fl.rec.events)
            if not (got.done and got.finish_reasons):  # the ledger's rule for a drop that cut its stream
                return f
            late.append(fl.rec.seq)
        if not f.fired:
            f.evidence = f"no stream in its first half for {wait_s:g} s"
        return f

    async def _tier_down(self) -> FaultRecord:
        tier = self.ep.redis_tier
        f = self._new("tier_down", tier.url if tier else "")
        if tier is None:
            f.evidence = "no LMCache Redis tier owned by the harness"
            return f
        f.fired, f.evidence = await asyncio.to_thread(tier.down)

        async def back_up() -> None:
            await asyncio.sleep(self.cfg.tier_down_s)
            await asyncio.to_thread(tier.start)
            f.recovered = tier.up()
            f.recovery_s = round(time.monotonic() - f.t_mono, 2)
            f.evidence += "; restarted, answers PING" if f.recovered else "; restart failed"

        if f.fired:
            self.background.append(asyncio.create_task(back_up()))
        return f

    def close(self) -> None:
        if self.serve is not None:
            self.serve.close()


def _victim(f: FaultRecord, choice: VictimChoice) -> None:
    f.victim_busy = choice.busy
    if choice.load is not None:
        f.victim_load = {"running": choice.load.running, "waiting": choice.load.waiting}


# -- Postgres checks ----------------------------------------------------------------------------------

def _rid(header: str | None) -> uuid.UUID | None:
    if not header or not header.startswith("req-"):
        return None
    try:
        return uuid.UUID(header[4:])
    except ValueError:
        return None


def check_postgres(db: Any, expected: dict[uuid.UUID, tuple[str, int]], *, wait_s: float = 45.0) -> dict[str, Any]:
    """One request record (with the client's final state) and one usage record per accepted request."""
    from sqlalchemy import bindparam, text

    ids = list(expected)
    out: dict[str, Any] = {"checked": len(ids)}
    if not ids:
        return {**out, "usage_records_ok": True, "record_states_ok": True}
    q_rec = text("SELECT id, status, completion_tokens, recovery_steps FROM request_records WHERE id IN :ids"
                 ).bindparams(bindparam("ids", expanding=True))
    q_use = text("SELECT request_id, count(*), max(completion_tokens) FROM usage_records WHERE request_id IN :ids "
                 "GROUP BY request_id").bindparams(bindparam("ids", expanding=True))
    deadline = time.monotonic() + wait_s
    while True:
        with db.system() as uow:
            recs = {r[0]: r for r in uow.session.execute(q_rec, {"ids": ids})}
            uses = {r[0]: r for r in uow.session.execute(q_use, {"ids": ids})}
        if len(recs) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(1)
    missing_records = [str(i) for i in ids if i not in recs]
    state_mismatch = []
    missing_usage = []
    dup_usage = []
    usage_tokens = []
    drops_late: list[str] = []
    steps: list[dict[str, Any]] = []
    for rid, (state, expected_tokens) in expected.items():
        row = recs.get(rid)
        if row is not None:
            status = str(getattr(row[1], "value", row[1]))
            u0 = uses.get(rid)
            if state == "cancelled" and status == "completed" and u0 is not None and u0[2] == expected_tokens:
                # the client closed while the rest of a finished answer was still in its socket buffer:
                # the gateway had already delivered everything (a race of the drop, not a lost cancel)
                drops_late.append(f"req-{rid.hex}")
            elif status != state:
                state_mismatch.append({"request_id": f"req-{rid.hex}", "client": state, "record": status})
            for st in row[3] or ():
                if isinstance(st, dict):
                    steps.append(st)
        u = uses.get(rid)
        if u is None:
            missing_usage.append(f"req-{rid.hex}")
        else:
            if u[1] != 1:
                dup_usage.append(f"req-{rid.hex}")
            if state == "completed" and u[2] != expected_tokens:
                usage_tokens.append({"request_id": f"req-{rid.hex}", "usage": u[2], "expected": expected_tokens})
    out.update({
        "missing_request_records": len(missing_records), "record_state_mismatches": len(state_mismatch),
        "missing_usage_records": len(missing_usage), "duplicate_usage_records": len(dup_usage),
        "usage_token_mismatches": len(usage_tokens), "drops_after_the_answer_was_sent": drops_late,
        "examples": {"record_state": state_mismatch[:5], "missing_usage": missing_usage[:5],
                     "usage_tokens": usage_tokens[:5], "missing_records": missing_records[:5]},
    })
    out["usage_records_ok"] = not (missing_usage or dup_usage or usage_tokens)
    out["record_states_ok"] = not (missing_records or state_mismatch)
    out["recovery_steps"] = _steps_summary(steps)
    return out


def read_recovery_steps(db: Any, ids: list[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Each request record's ``recovery_steps`` (requests without a record are absent)."""
    from sqlalchemy import bindparam, text

    if not ids:
        return {}
    q = text("SELECT id, recovery_steps FROM request_records WHERE id IN :ids"
             ).bindparams(bindparam("ids", expanding=True))
    with db.system() as uow:
        rows = list(uow.session.execute(q, {"ids": ids}))
    return {r[0]: [st for st in (r[1] or ()) if isinstance(st, dict)] for r in rows}


def _steps_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for st in steps:
        by.setdefault(str(st.get("step")), []).append(st)
    out: dict[str, Any] = {}
    for name, items in sorted(by.items()):
        durs = [float(s["duration_ms"]) for s in items if isinstance(s.get("duration_ms"), int | float)]
        out[name] = {"count": len(items),
                     "recovered": sum(1 for s in items if s.get("outcome") == "recovered"),
                     "failed": sum(1 for s in items if s.get("outcome") == "failed"),
                     "duration_ms_p50": round(statistics.median(durs), 1) if durs else None,
                     "duration_ms_max": round(max(durs), 1) if durs else None}
    return out


# -- timings ------------------------------------------------------------------------------------------

def fault_to_next_token(faults: list[FaultRecord], records: list[RequestRecord]) -> dict[str, Any]:
    """Per fault kind: for every stream open at the fault (sent before it, not yet ended), the time from the
    fault to its next token at the client; the worst stream per fault, then p50/max over faults."""
    per_kind: dict[str, list[float]] = {}
    stuck: Counter[str] = Counter()
    for f in faults:
        if not f.fired or f.kind in ("drop",):
            continue
        worst = None
        for r in records:
            if r.t_send >= f.t_mono or r.t_end <= f.t_mono:
                continue
            nxt = next((t for t in r.token_times if t > f.t_mono), None)
            if nxt is None:
                stuck[f.kind] += 1
                continue
            gap = (nxt - f.t_mono) * 1000
            worst = gap if worst is None else max(worst, gap)
        if worst is not None:
            per_kind.setdefault(f.kind, []).append(worst)
    out: dict[str, Any] = {}
    for kind, xs in sorted(per_kind.items()):
        out[kind] = {"faults": len(xs), "worst_stream_ms_p50": round(statistics.median(xs), 1),
                     "worst_stream_ms_max": round(max(xs), 1)}
    if stuck:
        out["streams_without_a_token_after_the_fault"] = dict(stuck)
    return out


def _ttft_ms(records: list[RequestRecord]) -> float | None:
    xs = [(r.token_times[0] - r.t_send) * 1000 for r in records if r.token_times]
    return round(statistics.median(xs), 1) if xs else None


# -- the drill ----------------------------------------------------------------------------------------

def run_drill(ep: Endpoint, cfg: DrillConfig, *, log: Log = print, progress: Progress | None = None) -> dict[str, Any]:
    return asyncio.run(_drill(ep, cfg, log, progress))


async def _drill(ep: Endpoint, cfg: DrillConfig, log: Log, progress: Progress | None) -> dict[str, Any]:
    prompts = make_prompts(cfg.prompts, cfg.prompt_words, cfg.seed, long_words=cfg.long_prompt_words)
    drv = LoadDriver(ep, cfg, prompts)
    tier_whole = None
    try:
        if cfg.tier_down_whole_run and ep.redis_tier is not None:
            ok, ev = await asyncio.to_thread(ep.redis_tier.down)
            tier_whole = {"fired": ok, "evidence": ev}
            log(f"LMCache Redis tier down for the whole run: {ev}")
        baselines, unstable = await record_baseline(drv, len(prompts), log)
        stable = [i for i in range(cfg.prompts) if i not in unstable]
        if not stable:
            raise RuntimeError("no prompt has a stable greedy baseline")
        long_prompt: int | None = None
        if cfg.long_prompt_words > 0:
            if cfg.prompts in unstable:
                log("the long prompt's greedy answer is not stable: prefill faults fire without it")
            else:
                long_prompt = len(stable)
                stable.append(cfg.prompts)
        drv.prompts = [prompts[i] for i in stable]
        drv.load_prompts = len(stable) - (long_prompt is not None)
        base_for_load = [baselines[i] for i in stable]

        plan = cfg.plan()
        t0 = time.monotonic()
        injector = Injector(ep, cfg, drv, t0, log, long_prompt=long_prompt)
        workers = [asyncio.create_task(drv.worker(w)) for w in range(cfg.concurrency)]
        log(f"load: {cfg.concurrency} streams, {cfg.max_tokens} tokens each; faults planned: {dict(Counter(plan))}")
        ticker = asyncio.create_task(_tick(drv, t0, progress)) if progress else None
        try:
            await injector.run(plan, progress)
            remaining = cfg.duration_s - (time.monotonic() - t0)
            await asyncio.sleep(max(remaining, cfg.tail_s))
        finally:
            drv.stop.set()
            await asyncio.gather(*workers, *drv.extra, return_exceptions=True)
            if ticker:
                ticker.cancel()
            injector.close()
        load_s = time.monotonic() - t0

        fresh = list(range(len(base_for_load), len(drv.prompts)))
        if fresh:  # the injector's fresh long prompts: their baselines now, as the load's were taken before
            late, late_unstable = await record_baseline(drv, fresh, log, keep=drv.records)
            base_for_load += [None if i in late_unstable else b for i, b in zip(fresh, late, strict=True)]
        ledger = Ledger(base_for_load)
        for r in drv.records:
            ledger.add(r)
        summary, verdicts = ledger.check()

        # drops: confirmed only if the stream was really cut by the client before it finished
        by_seq = {v.seq: v for v in verdicts}
        for f in injector.faults:
            if f.kind == "drop" and f.fired:
                v = by_seq.get(f.pids[0]) if f.pids else None
                f.fired = v is not None and v.state == "cancelled"
                tries = f.evidence.partition("; earlier tries")[2]  # drops that came after the answer
                f.evidence = (f"client closed the stream; request ended {v.state if v else 'unknown'} at the client"
                              + (f"; earlier tries{tries}" if tries else ""))

        db_checks: dict[str, Any] = {"skipped": "no database"}
        steps: dict[str, list[dict[str, Any]]] = {}
        if ep.db is not None:
            expected: dict[uuid.UUID, tuple[str, int]] = {}
            for r, v in zip(drv.records, verdicts, strict=True):
                rid = _rid(r.request_id)
                if rid is not None and r.http_status == 200 and v.state in ("completed", "failed", "cancelled"):
                    expected[rid] = (v.state, r.expected_tokens)
            db_checks = await asyncio.to_thread(check_postgres, ep.db, expected)
            by_rid = {rid: r.request_id for r in drv.records if r.request_id and (rid := _rid(r.request_id))}
            for rid, sts in (await asyncio.to_thread(read_recovery_steps, ep.db, list(by_rid))).items():
                steps[str(by_rid[rid])] = sts
        checks = fault_checks(injector.faults, drv.records, verdicts, steps, slack_s=cfg.step_slack_s)
    finally:
        await drv.close()
        if tier_whole is not None and ep.redis_tier is not None:
            ep.redis_tier.start()

    fired = Counter(f.kind for f in injector.faults if f.fired)
    not_fired = [f.to_dict() for f in injector.faults if not f.fired]
    not_recovered = [f.to_dict() for f in injector.faults
                     if f.fired and f.kind != "drop" and f.recovered is False]
    result: dict[str, Any] = {
        "benchmark": "chaos",
        **{k: v for k, v in summary.to_dict().items() if k != "violations"},
        "faults_planned": dict(Counter(plan)),
        "faults_fired": dict(fired),
        "kills_fired": fired["kill_decode"] + fired["kill_prefill"],
        "kills_of_serving_replicas": sum(1 for f in injector.faults
                                         if f.fired and f.kind.startswith("kill_") and len(f.pids) > 1),
        "faults_not_fired": len(not_fired),
        "faults_not_recovered": len(not_recovered),
        **checks,
        "pools_healthy_at_end": injector.pools_healthy_at_end,
        "usage_records_ok": bool(db_checks.get("usage_records_ok", False)),
        "record_states_ok": bool(db_checks.get("record_states_ok", False)),
        "postgres": db_checks,
        "recovery": {
            "fault_to_next_token": fault_to_next_token(injector.faults, drv.records),
            "replacement_s": _replacement(injector.faults),
            "fresh_ttft_ms_p50": _ttft_ms(drv.records),
        },
        "baseline": {"prompts": len(prompts), "unstable": len(unstable), "long_prompt": long_prompt is not None,
                     "fresh_long_prompts": len(drv.prompts) - drv.load_prompts - (long_prompt is not None),
                     "fresh_long_prompts_unstable": sum(b is None for b in base_for_load[drv.load_prompts + 1:]),
                     "token_ids": bool(base_for_load and base_for_load[0] and base_for_load[0].token_ids)},
        "load": {"seconds": round(load_s, 1), "concurrency": cfg.concurrency, "max_tokens": cfg.max_tokens,
                 "requests_per_s": round(summary.sent / load_s, 3) if load_s else None},
        "replica_discovery": injector.finder.method,
        "faults": [f.to_dict() for f in injector.faults],
        "violations": summary.violations,
        "config": {k: v for k, v in asdict(cfg).items()},
    }
    if tier_whole is not None:
        result["tier_down_whole_run"] = tier_whole
    result["invariants"] = invariants(result, cfg)
    result["ok"] = all(result["invariants"].values())
    return result


def _replacement(faults: list[FaultRecord]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("kill_decode", "kill_prefill", "stop_decode", "stop_prefill", "tier_down"):
        xs = [f.recovery_s for f in faults if f.kind == kind and f.recovery_s is not None]
        if xs:
            out[kind] = {"count": len(xs), "p50": round(statistics.median(xs), 1), "max": round(max(xs), 1)}
    return out


def invariants(r: dict[str, Any], cfg: DrillConfig) -> dict[str, bool]:
    """The drill's verdict, one named check each (see the module docstring); ``ok`` is all of them."""
    if cfg.allow_failures:
        # a failure is allowed only where the ladder ran out; its untransmitted tail is that failure
        no_failed = r["failed"] == r["failed_ladder_ran_out"]
        missing = r["missing_tokens"] - r["missing_tail_tokens"]
    else:
        no_failed = r["failed"] == 0
        missing = r["missing_tokens"]
    inv = {
        "no_lost_requests": r["lost"] == 0,
        "no_truncated_200s": r["truncated_200s"] == 0,
        "no_failed_requests": no_failed,
        "one_final_state_each": r["multiple_finals"] == 0,
        "no_duplicated_tokens": r["duplicated_tokens"] == 0,
        "no_missing_tokens": missing == 0,
        "no_wrong_tokens": r["mismatched_tokens"] == 0,
        "greedy_text_equals_baseline": r["text_mismatches"] == 0,
        "stream_usage_counts_each_token_once": r["stream_usage_mismatches"] == 0,
        "one_usage_record_per_request": r["usage_records_ok"],
        "request_records_match": r["record_states_ok"],
        "every_fault_fired": r["faults_not_fired"] == 0,
        "every_fault_recovered": r["faults_not_recovered"] == 0 and all(r["pools_healthy_at_end"].values()),
        "every_fault_matched_to_a_step": r["faults_unmatched"] == 0,
        "victims_were_busy": r["victims_not_busy"] == 0,
    }
    if cfg.require_prefill_rungs:
        inv["prefill_rungs_seen"] = set(PREFILL_RUNGS) <= set(r["prefill_rungs_seen"])
    if cfg.tier_down_whole_run:
        inv["tier_down_whole_run_no_errors"] = (r["failed"] == 0 and r["lost"] == 0
                                                and bool(r.get("tier_down_whole_run", {}).get("fired")))
    return inv


async def _tick(drv: LoadDriver, t0: float, progress: Progress) -> None:
    while True:
        progress("requests", len(drv.records), math.nan)
        await asyncio.sleep(1)


__all__ = ["FAULT_KINDS", "DrillConfig", "run_drill"]
