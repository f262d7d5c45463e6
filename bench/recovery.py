"""``baton bench recovery``: decode-failure recovery time, with and without an LMCache tier hit.

Two vLLM servers (A and B, the tiny model, both with Baton's LMCache connector on a dedicated
``redis-server`` used only as their tier) stand for two replicas of one deployment; the bench routes
each call to the first live one, as Ray Serve's router does. A streamed completion (greedy) runs
through the gateway's own resume logic (:class:`baton.api.gateway.resume.ResumingRelay`); after
``kill_after`` tokens reached the client the serving engine gets SIGKILL (its whole process group), the
relay resumes on the other engine with prompt + tokens sent, and the bench measures the time from the
kill to the next token at the client. Arms:

- ``tier``: the prompt's KV is in the Redis tier (A stored it while prefilling), so B loads the
  prefix instead of computing it;
- ``no_tier``: the tier is flushed at the kill, so B re-prefills.

Next to each: a fresh request's TTFT for a new prompt of the same length on the surviving engine,
the ratio (target <= 1.5 with a tier hit), B's prompt tokens loaded from the tier, and whether the
resumed text equals an undisturbed greedy run of the same prompt. The killed engine is restarted
between trials. Also exposes :func:`relay_stream`, used by the e2e test on the real P/D stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from baton.api.gateway.metering import Outcome
from baton.api.gateway.resume import ResumePolicy, ResumingRelay

Log = Callable[[str], None]
BY_SOURCE = "vllm:prompt_tokens_by_source_total"


@dataclass
class RelayRun:
    """One stream relayed through the gateway's resume logic, as the client saw it."""

    text: str
    events: list[dict[str, Any]]
    raw: bytes
    outcome: Outcome
    start_pc: float
    token_times: list[float] = field(default_factory=list)  # perf_counter of each token-bearing send
    kill_pc: float | None = None

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_times[0] - self.start_pc) * 1000 if self.token_times else None

    @property
    def recovery_ms(self) -> float | None:
        """Kill -> the next token at the client."""
        if self.kill_pc is None:
            return None
        after = [t for t in self.token_times if t > self.kill_pc]
        return (after[0] - self.kill_pc) * 1000 if after else None


def _texts(body: bytes, chat: bool) -> list[str]:
    out = []
    for ev in body.split(b"\n\n"):
        if not ev.startswith(b"data: {"):
            continue
        obj = orjson.loads(ev[6:])
        for c in obj.get("choices") or []:
            piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
            if piece:
                out.append(piece)
    return out


async def relay_stream(pick: Callable[[], str], endpoint: str, payload: dict[str, Any], *,
                       policy: ResumePolicy | None = None, kill_after: int | None = None,
                       kill: Callable[[], None] | None = None, timeout_s: float = 300.0,
                       headers: dict[str, str] | None = None) -> RelayRun:
    """Streams ``payload`` from the upstream ``pick()`` returns (called per attempt) through
    :class:`ResumingRelay`; after ``kill_after`` token-bearing events calls ``kill()``."""
    policy = policy or ResumePolicy(attempts=20, budget_s=120, backoff_s=0.2)
    chat = endpoint == "chat/completions"
    body_obj = {**payload, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    body = orjson.dumps(body_obj)
    start = time.perf_counter()
    outcome = Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model=str(payload["model"]),
                      endpoint=endpoint, stream=True, started=time.time(), start_pc=start)
    hdrs = {"content-type": "application/json", "accept": "text/event-stream", **(headers or {})}
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0), trust_env=False) as client:

        async def opener(ep: str, content: bytes) -> httpx.Response:
            req = client.build_request("POST", f"{pick()}/{ep}", content=content, headers=hdrs)
            return await client.send(req, stream=True)

        deadline = time.monotonic() + policy.budget_s
        tries = [0]
        from baton.api.gateway.resume import open_with_retry

        first, why = await open_with_retry(opener, endpoint, body, policy=policy, deadline=deadline, tries=tries)
        if first is None:
            raise RuntimeError(f"upstream did not answer: {why}")
        tries[0] = 0
        done: list[Outcome] = []
        run = RelayRun(text="", events=[], raw=b"", outcome=outcome, start_pc=start)
        pieces: list[str] = []
        chunks: list[bytes] = []

        async def receive() -> MutableMapping[str, Any]:
            await asyncio.Event().wait()
            return {}

        async def send(message: MutableMapping[str, Any]) -> None:
            data = message.get("body") or b""
            chunks.append(data)
            got = _texts(data, chat)
            if got:
                run.token_times.append(time.perf_counter())
                pieces.extend(got)
                if kill is not None and kill_after is not None and run.kill_pc is None and len(pieces) >= kill_after:
                    run.kill_pc = time.perf_counter()
                    kill()

        relay = ResumingRelay(first, outcome, strip_usage=False, headers=[], done=done.append, opener=opener,
                              endpoint=endpoint, payload=body_obj, original_body=body, client_ids=False,
                              policy=policy, deadline=deadline, tries=tries)
        await relay({"type": "http"}, receive, send)
        await asyncio.sleep(0.05)
    run.raw = b"".join(chunks)
    run.text = "".join(pieces)
    run.events = [orjson.loads(ev[6:]) for ev in run.raw.split(b"\n\n") if ev.startswith(b"data: {")]
    return run


# -- the bench -----------------------------------------------------------------------------------

@dataclass
class RecoveryConfig:
    prompt_len: int = 1024
    max_tokens: int = 48
    kill_after: int = 8
    repeats: int = 2
    arms: tuple[str, ...] = ("tier", "no_tier")
    seed: int = 0
    state_dir: str = "var"
    kv_cache_gib: int = 1


def _free_port() -> int:
    from baton.bench.procs import free_port

    return free_port()


def start_redis(port: int, state_dir: str) -> subprocess.Popen[bytes]:
    """A dedicated redis-server used only as the LMCache tier (never the main Redis)."""
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", state_dir], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    import redis

    while True:
        try:
            redis.Redis(port=port).ping()
            return proc
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)


def lmcache_kv_config(redis_url: str) -> str:
    from baton.dataplane.render import kv_transfer_config
    from baton.dataplane.spec import DeploymentSpec

    spec = DeploymentSpec(name="bench-recovery", model={"path": "/m", "served_name": "tiny"},
                          kv={"connector": "none", "lmcache": {"chunk_size": 256, "local_cpu_gib": 0.25,
                                                               "redis_url": redis_url}})
    return json.dumps(kv_transfer_config(spec, "aggregated"))


def warm_up(url: str) -> None:
    """One short request, so that no trial pays an engine's first-request costs."""
    httpx.post(f"{url}/completions", json={"model": "tiny", "prompt": [11, 12, 13], "max_tokens": 2}, timeout=120)


def _metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def run_recovery(cfg: RecoveryConfig, *, log: Log = print,
                 progress: Callable[[str, int], Callable[[Any], None]] | None = None) -> dict[str, Any]:
    from baton.bench.handoff import model_dir_for
    from baton.bench.procs import Proc, engine_command, engine_env, wait_engines

    model = model_dir_for("tiny", cfg.state_dir, cfg.seed)
    rport = _free_port()
    Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
    redis_proc = start_redis(rport, cfg.state_dir)
    redis_url = f"redis://127.0.0.1:{rport}"
    kv = lmcache_kv_config(redis_url)
    engines: dict[str, tuple[Proc, str]] = {}

    def start(name: str, port: int | None = None) -> tuple[Proc, str]:
        port = port or _free_port()
        proc = Proc(f"recovery-{name}", engine_command(model, port=port, served_name="tiny",
                                                       extra=["--kv-transfer-config", kv]),
                    env=engine_env(cfg.kv_cache_gib)).start()
        engines[name] = (proc, f"http://127.0.0.1:{port}/v1")
        return engines[name]

    def pick() -> str:
        for name in ("a", "b"):
            proc, url = engines[name]
            if proc.alive():
                return url
        return engines["a"][1]

    rng = random.Random(cfg.seed)

    def prompt() -> list[int]:
        return [rng.randrange(10, 1000) for _ in range(cfg.prompt_len)]

    trials: list[dict[str, Any]] = []
    try:
        log("starting two engines with the LMCache connector (Redis tier on a dedicated redis-server)")
        wait_engines([start("a"), start("b")], timeout_s=600)
        for name in ("a", "b"):
            warm_up(engines[name][1])
        advance = progress("recovery trials", len(cfg.arms) * cfg.repeats) if progress else None
        for rep in range(cfg.repeats):
            for arm in cfg.arms:
                serving = "a" if engines["a"][0].alive() else "b"
                survivor = "b" if serving == "a" else "a"
                proc, url = engines[serving]
                surl = engines[survivor][1]
                p = prompt()
                payload = {"model": "tiny", "prompt": p, "max_tokens": cfg.max_tokens, "temperature": 0}
                ext0 = _metric(surl, BY_SOURCE, source="external_kv_transfer")

                def kill(proc: Proc = proc, arm: str = arm) -> None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    # Reaped at once, so the router (pick) no longer sends to it: the figure is the
                    # resume itself, not a bench router's failed attempt on the dead engine.
                    with contextlib.suppress(Exception):
                        proc.popen.wait(5)  # type: ignore[union-attr]
                    if arm == "no_tier":
                        import redis

                        redis.Redis(port=rport).flushdb()

                time.sleep(1.0)  # let the prompt's chunks of the previous trial settle in the tier
                run = asyncio.run(relay_stream(pick, "completions", payload, kill_after=cfg.kill_after, kill=kill))
                with contextlib.suppress(Exception):
                    proc.popen.wait(10)  # type: ignore[union-attr]
                ext = _metric(surl, BY_SOURCE, source="external_kv_transfer") - ext0
                def at_survivor(surl: str = surl) -> str:
                    return surl

                fresh = asyncio.run(relay_stream(at_survivor, "completions", {**payload, "prompt": prompt()}))
                again = asyncio.run(relay_stream(at_survivor, "completions", payload))
                trial = {
                    "arm": arm, "repeat": rep, "killed": serving, "resumed_on": survivor,
                    "recovery_ms": run.recovery_ms, "fresh_ttft_ms": fresh.ttft_ms,
                    "ratio": (run.recovery_ms / fresh.ttft_ms) if run.recovery_ms and fresh.ttft_ms else None,
                    "tier_tokens_loaded": ext, "completed": run.outcome.status.value == "completed",
                    "text_equal_undisturbed": run.text == again.text, "tokens": run.outcome.completion_tokens,
                    "steps": run.outcome.recovery_steps,
                }
                trials.append(trial)
                log(f"{arm}: recovery {trial['recovery_ms']:.1f} ms, fresh TTFT {trial['fresh_ttft_ms']:.1f} ms, "
                    f"tier tokens {ext:.0f}, equal {trial['text_equal_undisturbed']}")
                if advance:
                    advance(None)
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                wait_engines([start(serving, port)], timeout_s=600)
                warm_up(engines[serving][1])
    finally:
        for proc, _ in engines.values():
            proc.stop()
        redis_proc.kill()
        redis_proc.wait(10)
    arms = {}
    for arm in cfg.arms:
        rows = [t for t in trials if t["arm"] == arm]
        rec = [t["recovery_ms"] for t in rows if t["recovery_ms"] is not None]
        ttft = [t["fresh_ttft_ms"] for t in rows if t["fresh_ttft_ms"] is not None]
        arms[arm] = {
            "recovery_ms_median": statistics.median(rec) if rec else None,
            "fresh_ttft_ms_median": statistics.median(ttft) if ttft else None,
            "ratio_median": statistics.median([t["ratio"] for t in rows if t["ratio"]]) if rows else None,
            "all_completed": all(t["completed"] for t in rows),
            "all_equal_undisturbed": all(t["text_equal_undisturbed"] for t in rows),
        }
    return {"bench": "recovery", "config": cfg.__dict__ | {"arms": list(cfg.arms)}, "target_ratio_with_tier": 1.5,
            "arms": arms, "trials": trials}
