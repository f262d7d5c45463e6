"""``baton bench batch``: the Batch API on a running Baton (``scripts/up``), measured from outside.

Through public surfaces only: the admin API makes the benchmark's tenants (the model granted, rate limits
far above the load) and keys; the tenants' ``/v1/files`` and ``/v1/batches`` carry the batches, their
``/v1/chat/completions`` the interactive load (streamed, timed at the client as in ``baton bench
fairness``: TTFT = sending to the first chunk with content text). Phases, in order:

- ``alone``: tenant I sends a short streamed request every ``interval_s`` for ``window_s`` (open loop);
- ``beside``: tenant T creates a batch of ``lines`` short chat requests; I's same load runs while it does;
  then the batch is waited for (``completed``, its output's ``custom_id``s equal to the input's);
- ``saturation``: tenant S keeps ``saturation_concurrency`` requests shaped like the batch's lines in flight
  for ``saturation_s`` (what the pool serves: completed requests per second);
- ``batch_alone``: a batch of ``alone_lines`` lines with nothing else running (6 s after the last interactive
  request, past the 5 s in which the gateway counts it as recent): lines per second from its creation to
  its end, as the client polled it;
- ``kill`` (with ``kills``): a second gateway process (``baton gateway run --port ...``, the stack's env) runs
  lines beside the first; a batch of ``kill_lines`` lines is created and the second gateway is SIGKILLed
  ``kills`` times (restarted after each): its lines' leases run out and the first gateway takes them over.
  Lines lost (input ids in neither file), duplicated (an id twice in the files) and usage rows of the batch
  (``GET /admin/v1/usage``) against its completed lines; with ``db_url``, how many lines ran more than once
  (``batch_lines.attempt``: the kills hit lines in flight, or the phase proves nothing).

Derived, with targets: ``ttft_p99_ratio`` = I's TTFT p99 beside the batch / alone (<= 1.10); the batch
finished within its window; ``slack_use`` = batch_alone's lines per second / saturation's requests per
second (>= 0.8); the kill's lines lost and duplicated (0 and 0), usage rows = completed lines.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from baton.bench import report
from baton.bench.fairness import (
    GENEROUS_LIMITS,
    AdminApi,
    Driver,
    Made,
    _phase_in_processes,
    _ticker,
    chat_body,
    cleanup,
    make_prompt,
    summarize_tenant,
)
from baton.bench.fairness import Outcome as StreamOutcome

TARGET_TTFT_P99_RATIO = 1.10
#: Longer than the flow control's ``recent_s`` (5 s): after it, no interactive request counts as recent.
BATCH_QUIET_S = 6.0
TARGET_SLACK_USE = 0.8
NAME_PREFIX = "bench-batch"
PHASES = ("alone", "beside", "saturation", "batch_alone", "kill")
ProgressFactory = Callable[[str, int], Callable[[Any], None]]


@dataclass
class BatchBenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    admin_token: str = field(default="", repr=False)
    model: str = "tiny-llama"
    phases: tuple[str, ...] = PHASES
    lines: int = 1000
    alone_lines: int = 1000
    kill_lines: int = 1000
    line_words: int = 20
    line_max_tokens: int = 32
    interval_s: float = 0.5
    window_s: float = 60.0
    saturation_concurrency: int = 8
    saturation_s: float = 30.0
    kills: int = 2
    kill_every_s: float = 4.0
    second_port: int = 8012
    env_file: str = "var/baton.env"
    db_url: str = ""
    batch_timeout_s: float = 1800.0
    seed: int = 0


def line_file(cfg: BatchBenchConfig, n: int, tag: str) -> tuple[bytes, list[str]]:
    """A batch file of ``n`` short chat requests (each prompt its own text) and its custom ids."""
    rng = random.Random(f"{cfg.seed}-{tag}")
    ids, out = [], bytearray()
    for i in range(n):
        cid = f"{tag}-{i}"
        body = chat_body(cfg.model, make_prompt(rng, cfg.line_words, cid), cfg.line_max_tokens)
        body.pop("stream", None)
        body.pop("stream_options", None)
        out += orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"
        ids.append(cid)
    return bytes(out), ids


async def start_batch(http: Any, key: str, content: bytes) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {key}"}
    r = await http.post("/v1/files", headers=auth, files={"file": ("lines.jsonl", content)}, data={"purpose": "batch"})
    r.raise_for_status()
    r = await http.post("/v1/batches", headers=auth, json={"input_file_id": r.json()["id"],
                                                             "endpoint": "/v1/chat/completions",
                                                             "completion_window": "24h"})
    r.raise_for_status()
    batch: dict[str, Any] = r.json()
    batch["_created_pc"] = time.perf_counter()
    return batch


async def wait_batch(http: Any, key: str, batch: Mapping[str, Any], timeout_s: float,
                     tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + timeout_s
    while True:
        r = await http.get(f"/v1/batches/{batch['id']}", headers=auth)
        r.raise_for_status()
        now: dict[str, Any] = r.json()
        if now["status"] in ("completed", "failed", "expired", "cancelled"):
            now["_ended_pc"] = time.perf_counter()
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch['id']} still {now['status']} after {timeout_s:g} s")
        tick()
        await asyncio.sleep(0.25)


async def file_ids(http: Any, key: str, file_id: str | None) -> list[str]:
    if not file_id:
        return []
    r = await http.get(f"/v1/files/{file_id}/content", headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return [orjson.loads(x)["custom_id"] for x in r.content.splitlines() if x.strip()]


def lines_check(ids: list[str], out: list[str], err: list[str]) -> dict[str, Any]:
    seen = out + err
    return {"input": len(ids), "output": len(out), "errors": len(err), "lost": len(set(ids) - set(seen)),
            "duplicated": len(seen) - len(set(seen)), "ids_equal": sorted(set(seen)) == sorted(ids)}


def _interactive(cfg: BatchBenchConfig, phase: str, key: str) -> Driver:
    return Driver(tenant="i", phase=phase, api_key=key, url=cfg.base_url.rstrip("/") + "/v1/chat/completions",
                  model=cfg.model, prompt_words=20, max_tokens=16, window_s=cfg.window_s, interval_s=cfg.interval_s,
                  seed=cfg.seed)


async def _load(ds: list[Driver], span_s: float, tick: Callable[[], None], *,
                until: asyncio.Future[float] | None = None) -> dict[str, Any]:
    """One tenant's load in a process of its own, summarized; with ``until`` (a future of a unix time, e.g. a
    batch's end), only the requests sent before it count."""
    started: list[float] = []
    (result,) = await _phase_in_processes(ds, span_s, tick, started=started)
    if "error" in result:
        raise RuntimeError(f"{ds[0].phase}: the load failed:\n{result['error']}")
    outcomes = [StreamOutcome(**o) for o in result["outcomes"]]
    summary: dict[str, Any] = {}
    if until is not None:
        end = await until
        kept = [o for o in outcomes if started[0] + o.start_s <= end]
        summary["counted_while_the_batch_ran"] = f"{len(kept)} of {len(outcomes)} requests"
        outcomes = kept
    return {**summarize_tenant(outcomes, result["elapsed_s"]), **summary}


def _rate(batch: Mapping[str, Any], started: Mapping[str, Any]) -> dict[str, Any]:
    seconds = batch["_ended_pc"] - started["_created_pc"]
    done = batch["request_counts"]["completed"]
    return {"status": batch["status"], "seconds": seconds, "completed": done,
            "failed": batch["request_counts"]["failed"], "lines_per_s": done / seconds if seconds > 0 else math.nan,
            "within_window": batch["status"] == "completed" and seconds < 24 * 3600}


class SecondGateway:
    """``baton gateway run --port`` with the stack's environment: started, SIGKILLed, started again."""

    def __init__(self, cfg: BatchBenchConfig) -> None:
        self.port = cfg.second_port
        # the stack's settings file, found by the gateway itself (as every `baton` command finds it)
        self.env = {**os.environ, "BATON_STATE_DIR": str(Path(cfg.env_file).resolve().parent)}
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(Path(sys.executable).with_name("baton")), "gateway", "run", "--port",
                                 str(self.port)], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    async def start(self) -> None:
        import httpx

        self.proc = await asyncio.to_thread(self._spawn)
        async with httpx.AsyncClient(timeout=2) as http:
            for _ in range(240):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the second gateway exited with {self.proc.returncode}")
                try:
                    if (await http.get(f"http://127.0.0.1:{self.port}/healthz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        raise TimeoutError("the second gateway did not start in 60 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def _attempts(db_url: str, batch_id: str) -> dict[str, int] | None:
    if not db_url:
        return None
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT count(*) FILTER (WHERE attempt > 1), coalesce(max(attempt), 0) "
                                    "FROM batch_lines WHERE batch_id = :b"), {"b": batch_id}).one()
    finally:
        engine.dispose()
    return {"lines_run_again": int(row[0]), "max_attempt": int(row[1])}


async def _usage_rows(api: AdminApi, tenant_id: str, batch_id: str) -> int:
    page = await api._call("GET", "/usage", params={"tenant_id": tenant_id, "batch_id": batch_id, "limit": 1})
    return int(page["count"])


async def run_async(cfg: BatchBenchConfig, *, log: Callable[[str], None] = print,
                    progress: ProgressFactory | None = None) -> dict[str, Any]:
    import httpx

    started = report.provenance()
    run_id = uuid.uuid4().hex[:6]
    made = Made()
    out: dict[str, Any] = {}
    admin = httpx.AsyncClient(base_url=cfg.base_url.rstrip("/") + "/admin/v1", timeout=30.0,
                              headers={"Authorization": f"Bearer {cfg.admin_token}"})
    http = httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), timeout=120.0)
    api = AdminApi(admin)
    try:
        model_id = await api.model_id(cfg.model)
        for role in ("i", "t", "s"):
            name = f"{NAME_PREFIX}-{run_id}-{role}"
            tenant = await api.create_tenant(name, f"baton bench batch: tenant {role}")
            made.tenants[role], made.tenant_names[role] = tenant, name
            await api.grant(tenant, model_id)
            await api.set_limits(tenant, GENEROUS_LIMITS)
            key_id, secret = await api.issue_key(tenant, f"{NAME_PREFIX}-{role}")
            made.keys[role], made.secrets[role] = (tenant, key_id), secret
        await asyncio.sleep(1.0)
        if "alone" in cfg.phases:
            log(f"alone: tenant I, a short stream every {cfg.interval_s:g} s for {cfg.window_s:g} s")
            out["alone"] = await _load([_interactive(cfg, "alone", made.secrets["i"])], cfg.window_s,
                                       _ticker(progress, "alone", math.ceil(cfg.window_s)))
            log(f"alone: TTFT p99 {out['alone']['ttft_ms'].get('p99')} ms")
        if "beside" in cfg.phases:
            content, ids = line_file(cfg, cfg.lines, f"beside-{run_id}")
            batch = await start_batch(http, made.secrets["t"], content)
            log(f"beside: batch {batch['id']} of {cfg.lines} lines; tenant I's same load beside it")
            waiting = asyncio.ensure_future(wait_batch(http, made.secrets["t"], batch, cfg.batch_timeout_s))
            batch_end: asyncio.Future[float] = asyncio.get_running_loop().create_future()

            def ended_now(_f: Any) -> None:
                if not batch_end.done():
                    batch_end.set_result(time.time())

            waiting.add_done_callback(ended_now)
            inter = await _load([_interactive(cfg, "beside", made.secrets["i"])], cfg.window_s,
                                _ticker(progress, "beside", math.ceil(cfg.window_s)), until=batch_end)
            ended = await waiting
            check = lines_check(ids, await file_ids(http, made.secrets["t"], ended.get("output_file_id")),
                                await file_ids(http, made.secrets["t"], ended.get("error_file_id")))
            out["beside"] = {"interactive": inter, "batch": {**_rate(ended, batch), **check}}
            log(f"beside: TTFT p99 {inter['ttft_ms'].get('p99')} ms; batch {ended['status']} in "
                f"{out['beside']['batch']['seconds']:.0f} s, lost {check['lost']}, duplicated {check['duplicated']}")
        if "saturation" in cfg.phases:
            d = Driver(tenant="s", phase="saturation", api_key=made.secrets["s"],
                       url=cfg.base_url.rstrip("/") + "/v1/chat/completions", model=cfg.model,
                       prompt_words=cfg.line_words, max_tokens=cfg.line_max_tokens, window_s=cfg.saturation_s,
                       concurrency=cfg.saturation_concurrency, seed=cfg.seed)
            log(f"saturation: {cfg.saturation_concurrency} requests in flight for {cfg.saturation_s:g} s")
            sat = await _load([d], cfg.saturation_s, _ticker(progress, "saturation", math.ceil(cfg.saturation_s)))
            sat["requests_per_s"] = sat["completed"] / sat["elapsed_s"] if sat["elapsed_s"] else math.nan
            out["saturation"] = sat
            log(f"saturation: {sat['requests_per_s']:.2f} requests/s")
        if "batch_alone" in cfg.phases:
            # the gateway holds lines to a quarter of the limit for 5 s after an interactive request: wait that
            # out, or the phase measures the saturation load's tail
            await asyncio.sleep(BATCH_QUIET_S)
            content, ids = line_file(cfg, cfg.alone_lines, f"alone-{run_id}")
            batch = await start_batch(http, made.secrets["t"], content)
            ended = await wait_batch(http, made.secrets["t"], batch, cfg.batch_timeout_s,
                                     _ticker(progress, "batch_alone", cfg.alone_lines))
            out["batch_alone"] = _rate(ended, batch)
            log(f"batch_alone: {out['batch_alone']['lines_per_s']:.2f} lines/s")
        if "kill" in cfg.phases and cfg.kills:
            out["kill"] = await _kill_phase(cfg, http=http, api=api, made=made, run_id=run_id, log=log)
    finally:
        cleaned = await cleanup(api, made)
        await admin.aclose()
        await http.aclose()
    return {"benchmark": "batch", "config": {k: v for k, v in asdict(cfg).items() if k != "admin_token"},
            "method": "tenants and keys made through /admin/v1 (limits far above the load), deleted afterwards; "
                      "batches through /v1/files and /v1/batches, polled every 0.25 s (a batch's time is from "
                      "its creation to the poll that saw it end); interactive load: streamed chat completions "
                      "timed at the client in a process of its own (TTFT = sending to the first chunk with content)",
            **out, "derived": derive(out), "cleanup": cleaned, "provenance": report.provenance(started)}


async def _kill_phase(cfg: BatchBenchConfig, *, http: Any, api: AdminApi, made: Made, run_id: str,
                      log: Callable[[str], None]) -> dict[str, Any]:
    second = SecondGateway(cfg)
    await second.start()
    kills: list[float] = []
    try:
        content, ids = line_file(cfg, cfg.kill_lines, f"kill-{run_id}")
        batch = await start_batch(http, made.secrets["t"], content)
        log(f"kill: batch {batch['id']} of {cfg.kill_lines} lines; a second gateway on :{cfg.second_port}, "
            f"SIGKILLed {cfg.kills} times")
        for _ in range(cfg.kills):
            await asyncio.sleep(cfg.kill_every_s)
            second.kill()
            kills.append(time.perf_counter() - batch["_created_pc"])
            log(f"kill: second gateway SIGKILLed at +{kills[-1]:.1f} s")
            await second.start()
        ended = await wait_batch(http, made.secrets["t"], batch, cfg.batch_timeout_s)
    finally:
        second.stop()
    check = lines_check(ids, await file_ids(http, made.secrets["t"], ended.get("output_file_id")),
                        await file_ids(http, made.secrets["t"], ended.get("error_file_id")))
    await asyncio.sleep(3.0)  # the meters' last flush
    usage = await _usage_rows(api, made.tenants["t"], batch["id"])
    attempts = await asyncio.to_thread(_attempts, cfg.db_url, batch["id"])
    log(f"kill: {ended['status']}; lost {check['lost']}, duplicated {check['duplicated']}, usage rows {usage} "
        f"for {ended['request_counts']['completed']} completed lines; {attempts}")
    return {"kills_at_s": kills, **_rate(ended, batch), **check, "usage_rows": usage,
            "usage_equals_completed": usage == ended["request_counts"]["completed"], "attempts": attempts}


def derive(out: Mapping[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    alone = out.get("alone", {}).get("ttft_ms", {}).get("p99")
    beside = out.get("beside", {}).get("interactive", {}).get("ttft_ms", {}).get("p99")
    if alone and beside:
        d["ttft_p99_ratio"] = beside / alone
        d["ttft_p99_ratio_met"] = d["ttft_p99_ratio"] <= TARGET_TTFT_P99_RATIO
    if "beside" in out:
        d["batch_within_window"] = out["beside"]["batch"]["within_window"]
    sat, alone_b = out.get("saturation", {}).get("requests_per_s"), out.get("batch_alone", {}).get("lines_per_s")
    if sat and alone_b:
        d["slack_use"] = alone_b / sat
        d["slack_use_met"] = d["slack_use"] >= TARGET_SLACK_USE
    if "kill" in out:
        k = out["kill"]
        d["kill_lost"], d["kill_duplicated"] = k["lost"], k["duplicated"]
        d["kill_met"] = k["lost"] == 0 and k["duplicated"] == 0 and k["usage_equals_completed"]
    d["targets"] = {"ttft_p99_ratio": TARGET_TTFT_P99_RATIO, "slack_use": TARGET_SLACK_USE}
    return d


def run(cfg: BatchBenchConfig, *, log: Callable[[str], None] = print,
        progress: ProgressFactory | None = None) -> dict[str, Any]:
    from baton.bench.client import run as run_loop

    result: dict[str, Any] = run_loop(run_async(cfg, log=log, progress=progress))
    return result


