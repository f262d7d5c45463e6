"""``baton chaos ...``: fault injection on the real stack, with a ledger of every request.

``baton chaos run`` brings up (or, with ``--attach``, uses) a P/D deployment of the tiny model behind a
Baton gateway, drives steady streaming load, kills and stalls prefill and decode replicas, takes the
LMCache Redis tier down and drops client connections at seeded random times, then checks the ledger's
invariants. Heavy: run it under the machine-wide lock (``flock /tmp/baton-heavy.lock baton chaos run``).

Strict by default: no request may fail, every replica fault must hit a replica whose engine reports a
request and be answered by a recovery step in a request that was in flight (``--allow-failures`` lets a
request fail where its record shows the ladder ran out; ``--require-prefill-rungs`` also wants both
prefill rungs, ``prefill_retry`` and ``local_prefill``, in the request records).
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Chaos drills: kill/stall replicas, take KV tiers down, drop clients; check the ledger.",
                  no_args_is_help=True)


@app.command()
def run(  # noqa: PLR0917 - typer options
    kills: Annotated[int, typer.Option("--kills", min=0, help="SIGKILLs of prefill and decode replicas.")] = 20,
    stalls: Annotated[int | None, typer.Option("--stalls", min=0, help="SIGSTOP stalls (default kills/5).")] = None,
    tier_downs: Annotated[int, typer.Option("--tier-downs", min=0, help="LMCache Redis tier outages.")] = 1,
    drops: Annotated[int | None, typer.Option("--drops", min=0, help="Dropped clients (default kills/4).")] = None,
    duration: Annotated[float, typer.Option("--duration", min=0, help="Least seconds of load.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prompts, the fault order, times and targets.")] = 0,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Streams in flight at all times.")] = 4,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=2, help="Tokens per answer (ignore_eos).")] = 48,
    gap_min: Annotated[float, typer.Option("--gap-min", help="Least seconds between faults.")] = 4.0,
    gap_max: Annotated[float, typer.Option("--gap-max", help="Most seconds between faults.")] = 15.0,
    overlap: Annotated[bool, typer.Option(
        "--overlap", help="Fire replica faults while a pool's replacement is still starting.")] = False,
    tier_down_whole_run: Annotated[bool, typer.Option(
        "--tier-down-whole-run", help="Keep the LMCache Redis tier down for the whole run.")] = False,
    stall_s: Annotated[float, typer.Option(
        "--stall-s", min=0.1, help="Seconds a SIGSTOP lasts (a stall shorter than the gateway's stream_stall_s or "
        "the prefill timeout meets no recovery step, and fails every_fault_matched_to_a_step).")] = 6.0,
    allow_failures: Annotated[bool, typer.Option(
        "--allow-failures", help="Let a request fail with a readable error where its record shows the recovery "
        "ladder ran out (default: no request may fail).")] = False,
    require_prefill_rungs: Annotated[bool, typer.Option(
        "--require-prefill-rungs", help="Require both prefill rungs (prefill_retry, local_prefill) in the "
        "request records.")] = False,
    long_prompt_words: Annotated[int, typer.Option(
        "--long-prompt-words", min=0, help="Send a prompt of this many words before each prefill fault and fire "
        "once a prefill engine reports it (0: off).")] = 0,
    victim_wait: Annotated[float, typer.Option(
        "--victim-wait", min=0, help="Seconds a replica fault waits for a replica whose engine reports a "
        "request.")] = 30.0,
    prefill: Annotated[int, typer.Option("--prefill", min=1, help="Prefill replicas.")] = 2,
    step_tokens: Annotated[int | None, typer.Option(
        "--max-num-batched-tokens", min=16, help="Tokens per engine step of the started stack (below the prompt "
        "length a prefill spans several steps and its engine's gauges show it; default vLLM's).")] = None,
    decode: Annotated[int, typer.Option("--decode", min=1, help="Decode replicas.")] = 2,
    attach: Annotated[bool, typer.Option(
        "--attach", help="Use a running gateway and P/D app instead of starting one.")] = False,
    gateway_url: Annotated[str | None, typer.Option("--gateway-url", help="--attach: the gateway's base URL.")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="BATON_CHAOS_API_KEY", help="--attach: a tenant key.")] = None,
    model: Annotated[str, typer.Option("--model", help="--attach: the model name.")] = "tiny-chaos",
    serve_app: Annotated[str | None, typer.Option("--app", help="--attach: the Serve application name.")] = None,
    dashboard_url: Annotated[str | None, typer.Option(
        "--dashboard-url", help="--attach: the Ray dashboard URL.")] = None,
    metrics_url: Annotated[str | None, typer.Option(
        "--metrics-url", help="--attach: Ray's metrics agent, http://host:port/metrics (default: found from the "
        "dashboard).")] = None,
    state_dir: Annotated[Path, typer.Option("--state-dir", help="Logs and the tiny model.")] = Path("var/chaos"),
    fresh_db: Annotated[bool, typer.Option(
        "--fresh-db/--configured-db",
        help="Record into a new migrated database dropped afterwards, or into the configured one.")] = True,
    keep_db: Annotated[bool, typer.Option("--keep-db", help="Keep the fresh database for inspection.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the ledger summary as JSON on stdout.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the full result JSON here.")] = None,
) -> None:
    """Run a chaos drill and check that no request is lost, cut or given a wrong token."""
    from rich.console import Console

    from baton.bench.chaos.drill import DrillConfig
    from baton.bench.chaos.stack import fresh_database
    from baton.core.db import Database
    from baton.core.settings import load_settings

    err = Console(stderr=True)
    cfg = DrillConfig(kills=kills, stalls=kills // 5 if stalls is None else stalls, tier_downs=tier_downs,
                      drops=kills // 4 if drops is None else drops, seed=seed, duration_s=duration,
                      concurrency=concurrency, max_tokens=max_tokens, gap_s=(gap_min, max(gap_min, gap_max)),
                      tier_down_whole_run=tier_down_whole_run, overlap=overlap, stall_s=stall_s,
                      allow_failures=allow_failures, require_prefill_rungs=require_prefill_rungs,
                      long_prompt_words=long_prompt_words, victim_wait_s=victim_wait)

    def log(msg: str) -> None:
        err.print(f"[dim]chaos[/dim] {msg}")

    from baton.bench.report import provenance

    started = provenance()
    settings = load_settings()
    with contextlib.ExitStack() as stack:
        if fresh_db:
            settings = stack.enter_context(fresh_database(settings, keep=keep_db, log=log))
        db = Database.for_services(settings)
        stack.callback(db.dispose)
        result = _run(cfg, settings, db, err, attach=attach, gateway_url=gateway_url, api_key=api_key,
                      model=model, serve_app=serve_app, dashboard_url=dashboard_url, metrics_url=metrics_url,
                      prefill=prefill,
                      decode=decode, state_dir=state_dir, tier=tier_downs > 0 or tier_down_whole_run,
                      step_tokens=step_tokens)
    result["provenance"] = provenance(started)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str))
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        keys = ("sent", "accepted", "completed", "failed", "failed_ladder_ran_out", "cancelled", "lost",
                "truncated_200s", "duplicated_tokens", "missing_tokens", "missing_tail_tokens", "text_mismatches",
                "faults_fired", "faults_unmatched", "victims_busy", "prefill_rungs_seen", "usage_records_ok")
        for k in keys:
            err.print(f"{k:>21}: {result.get(k)}")
        for f in result["faults"]:
            if f.get("needs_step") and not f.get("matched_steps"):
                err.print(f"  [red]unmatched[/] {f['kind']} at {f['at_s']} s on {f['target']}: "
                          f"{len(f.get('requests_in_flight') or ())} requests in flight, victim busy "
                          f"{f.get('victim_busy')}")
    for name, ok in result["invariants"].items():
        err.print(f"  [{'green' if ok else 'red'}]{'ok  ' if ok else 'FAIL'}[/] {name}")
    if not result["ok"]:
        raise typer.Exit(1)


def _run(cfg: Any, settings: Any, db: Any, err: Any, *, attach: bool, gateway_url: str | None, api_key: str | None,
         model: str, serve_app: str | None, dashboard_url: str | None, metrics_url: str | None, prefill: int,
         decode: int, state_dir: Path, tier: bool, step_tokens: int | None) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from baton.bench.chaos.drill import run_drill
    from baton.bench.chaos.stack import ChaosStack, Endpoint, StackConfig

    result: dict[str, Any]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def progress(desc: str, done: float, total: float) -> None:
            if desc not in tasks:
                tasks[desc] = bar.add_task(desc, total=None if math.isnan(total) else total)
            bar.update(tasks[desc], completed=done, total=None if math.isnan(total) else total)

        def log_bar(msg: str) -> None:
            bar.console.print(f"[dim]chaos[/dim] {msg}")

        if attach:
            if not (gateway_url and api_key and serve_app):
                raise typer.BadParameter("--attach needs --gateway-url, --api-key and --app")
            ep = Endpoint(gateway_url=gateway_url, api_key=api_key, model=model, app=serve_app,
                          dashboard_url=dashboard_url, db=db, pools={"prefill": prefill, "decode": decode},
                          metrics_url=metrics_url)
            result = run_drill(ep, cfg, log=log_bar, progress=progress)
        else:
            scfg = StackConfig(state_dir=state_dir, prefill=prefill, decode=decode, redis_tier=tier,
                               app=f"chaos-{uuid.uuid4().hex[:6]}", max_num_batched_tokens=step_tokens)
            with ChaosStack(scfg, settings, db, log=log_bar) as ep:
                result = run_drill(ep, cfg, log=log_bar, progress=progress)
    return result
