"""``baton bench gateway``: the same load straight to the upstream, through Baton's gateway (auth,
limits, metering, tracing) and through LiteLLM's proxy, alternating in one run.

Arms take turns in small blocks (A B C, then B C A, ...) so that drift of a shared 2-core machine hits
every arm alike; every request has its own prompt (and the bench's engine runs without prefix caching)
so no arm profits from another's cache. The added latency of a proxy is its percentile minus the
direct arm's percentile (TTFT, ITL); its CPU cost is the proxy process's CPU time over the requests it
served, which is far less sensitive to noise than latency on a busy machine.

``--upstream zero`` replaces the engine by :mod:`baton.bench.stub` (answers at once), which isolates
the proxies' own latency and gives the gateway's throughput per CPU-second.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from baton.bench import client, report, stats
from baton.bench.datasets import HFTokenizer, SampleRequest, random_dataset
from baton.bench.procs import Proc, StartError, start_engine, start_floor, start_stub

ProgressFactory = Callable[[str, int], Callable[[stats.RequestResult], None]]
Log = Callable[[str], None]

ARMS = ("direct", "baton", "baton-notrace", "baton-noflow", "baton-httpx", "baton-redispy", "litellm")
#: The library arms: Baton with one hand-written part replaced by the library it stands for, each beside
#: the Baton arm it differs from in that part only (name -> (the hand-written arm, the settings that swap it)).
#: The OTLP span encoder had one too (``baton-otelsdk``, 2026-12-07): it lost, and spans are now exported by
#: OpenTelemetry's exporter.
LIBRARY_ARMS: dict[str, tuple[str, dict[str, str]]] = {
    "baton-httpx": ("baton-notrace", {"BATON_GATEWAY__UPSTREAM_CLIENT": "httpx"}),
    "baton-redispy": ("baton-notrace", {"BATON_GATEWAY__REDIS_CLIENT": "redis-py"}),
}


@dataclass
class GatewayConfig:
    upstream: str = "engine"
    """``engine`` (a bare vLLM server on ``model_dir``, or ``engine_url``) or ``zero`` (the stub)."""
    engine_url: str | None = None
    model_dir: str = "var/models/tiny-llama"
    """The model ``baton up`` builds (``baton model make-tiny``)."""
    model: str = "tiny"
    tracing: str = "both"
    """``on`` (Baton with tracing), ``off`` (without) or ``both`` (two Baton arms: the tracing cost)."""
    litellm: bool = True
    concurrency: list[int] = field(default_factory=lambda: [1])
    blocks: int = 8
    block_size: int = 8
    input_len: int = 128
    output_len: int = 32
    warmup: int = 5
    seed: int = 0
    db_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/baton_bench"
    throughput_requests: int = 0
    """Requests per arm of the throughput phase (0: only with ``--upstream zero``, 2000)."""
    throughput_concurrency: int = 32
    gateway_cpus: list[int] | None = None
    state_dir: str = "var"
    stub_token_gap_ms: float = 1.0
    """``--upstream zero``: the stub's pause between a stream's token writes (each token its own write)."""
    stub_batched: bool = False
    """``--upstream zero``: the stub writes each stream whole (no per-token figure then)."""
    scaling_workers: int = 2
    """The throughput phase also runs Baton (tracing on) with this many worker processes (0 or 1: not)."""
    token_requests: int = -1
    """Requests per arm and length of the per-token phase (-1: 1,000 with ``zero``, 96 with an engine; 0: none)."""
    flow_arm: bool = True
    """Also run Baton with flow control off (``baton-noflow``, tracing off): the cost of flow control when
    nothing queues is ``baton-notrace`` minus it."""
    library_arms: bool = False
    """Also run the library arms (:data:`LIBRARY_ARMS`: httpx for upstream calls, redis-py with hiredis for
    admission), each beside the Baton arm with its hand-written part."""

    def arms(self) -> list[str]:
        arms = ["direct"]
        if self.tracing in ("on", "both"):
            arms.append("baton")
        if self.tracing in ("off", "both"):
            arms.append("baton-notrace")
            if self.flow_arm:
                arms.append("baton-noflow")
        if self.library_arms:
            for name, (base, _) in LIBRARY_ARMS.items():
                if base in arms:
                    arms.append(name)
        if self.litellm:
            arms.append("litellm")
        return arms


@dataclass
class Arm:
    name: str
    target: client.Target
    proc: Proc | None = None
    results: list[stats.RequestResult] = field(default_factory=list)
    cpu_s: float = 0.0
    rss_max_mb: float = 0.0
    latency: bool = True
    """Takes part in the latency rounds (else only in the throughput phase)."""
    floor: bool = False
    """The bare byte relay (:mod:`baton.bench.floor`): the throughput and per-token phases' reference."""

    def cpu_now(self) -> float:
        return self.proc.cpu_seconds() if self.proc else 0.0

    def sample_rss(self) -> None:
        if self.proc:
            self.rss_max_mb = max(self.rss_max_mb, sum(self.proc.rss_mb().values()))


def run_gateway(cfg: GatewayConfig, *, progress: ProgressFactory | None = None, log: Log = print) -> dict[str, Any]:
    """Starts what the config asks for, runs the comparison, stops everything; returns the report."""
    started = report.provenance()
    out: dict[str, Any] = {"benchmark": "gateway", "config": asdict(cfg), "notes": []}
    with contextlib.ExitStack() as stack:
        arms = _start_arms(cfg, stack, out, log)
        tok = _tokenizer(cfg)
        rounds = []
        timed = [a for a in arms if a.latency]
        for conc in cfg.concurrency:
            log(f"concurrency {conc}: {cfg.blocks} blocks x {len(timed)} arms")
            rounds.append(_latency_round(cfg, timed, conc, tok, progress))
        out["rounds"] = rounds
        n_tp = cfg.throughput_requests or (2000 if cfg.upstream == "zero" else 0)
        if n_tp:
            log(f"throughput: {n_tp} requests per arm at concurrency {cfg.throughput_concurrency}")
            out["throughput"] = _throughput(cfg, arms, n_tp, progress)
        n_tok = cfg.token_requests if cfg.token_requests >= 0 else (1000 if cfg.upstream == "zero" else 96)
        if n_tok and cfg.output_len > 1:
            log(f"per token: {n_tok} requests per arm of 1 and of {cfg.output_len} output tokens")
            out["per_token"] = _per_token(cfg, arms, n_tok, progress)
        out["rss_mb"] = {a.name: a.rss_max_mb for a in arms if a.proc}
    out["headline"] = headline(out)
    out["provenance"] = report.provenance(started)
    return out


def _tokenizer(cfg: GatewayConfig) -> HFTokenizer | None:
    path = Path(cfg.model_dir) / "tokenizer.json"
    return HFTokenizer(cfg.model_dir) if path.exists() else None


def _start_arms(cfg: GatewayConfig, stack: contextlib.ExitStack, out: dict[str, Any], log: Log) -> list[Arm]:
    from baton.bench import arms as arms_mod

    want = cfg.arms()
    # A stub process: the zero upstream, and in any case the OTLP sink the gateway exports spans to.
    stub, stub_url = start_stub("stub", token_gap_ms=cfg.stub_token_gap_ms, batched=cfg.stub_batched)
    stack.callback(stub.stop)
    otlp = stub_url.removesuffix("/v1")
    if cfg.upstream == "zero":
        upstream = stub_url
    elif cfg.engine_url:
        upstream = cfg.engine_url.rstrip("/")
        upstream = upstream if upstream.endswith("/v1") else upstream + "/v1"
    else:
        log(f"starting a vLLM engine on {cfg.model_dir} (about a minute)")
        engine, upstream = start_engine("engine", cfg.model_dir, served_name=cfg.model,
                                        extra=["--no-enable-prefix-caching"])
        stack.callback(engine.stop)
    out["upstream_url"] = upstream
    result = [Arm("direct", client.Target(base_url=upstream, model=cfg.model, name="direct"))]
    floor, floor_url = start_floor("relay-floor", upstream)
    stack.callback(floor.stop)
    result.append(Arm("relay-floor", client.Target(base_url=floor_url, model=cfg.model, name="relay-floor"), floor,
                      latency=False, floor=True))

    if any(a.startswith("baton") for a in want):
        log("baton: migrating the bench database, provisioning a tenant and a key")
        arms_mod.migrate(cfg.db_url)
        tenant = arms_mod.provision_tenant(cfg.db_url, model=cfg.model,
                                           model_source=str(Path(cfg.model_dir).resolve()))
        for name in ("baton", "baton-notrace", "baton-noflow", *LIBRARY_ARMS):
            if name not in want:
                continue
            base, swap = LIBRARY_ARMS.get(name, (name, {}))
            env = arms_mod.gateway_env(tenant, upstreams={cfg.model: upstream}, tracing=base == "baton",
                                       otlp_endpoint=otlp)
            env.update(swap)
            if name == "baton-noflow":
                env["BATON_GATEWAY__FLOW__ENABLED"] = "false"
            proc, url = arms_mod.start_gateway(name, env, cpus=cfg.gateway_cpus)
            stack.callback(proc.stop)
            result.append(Arm(name, client.Target(base_url=url, model=cfg.model, api_key=tenant.api_key, name=name),
                              proc))
            if name == "baton" and cfg.scaling_workers > 1 and (cfg.throughput_requests or cfg.upstream == "zero"):
                # the same gateway with N worker processes, for the throughput phase: does it scale?
                wname = f"baton-{cfg.scaling_workers}w"
                proc, url = arms_mod.start_gateway(wname, env, cpus=cfg.gateway_cpus, workers=cfg.scaling_workers)
                stack.callback(proc.stop)
                result.append(Arm(wname, client.Target(base_url=url, model=cfg.model, api_key=tenant.api_key,
                                                       name=wname), proc, latency=False))
    if "litellm" in want:
        try:
            log("litellm: preparing its venv (first use installs litellm[proxy]) and starting the proxy")
            exe = arms_mod.ensure_litellm(cfg.state_dir)
            out["litellm_version"] = arms_mod.litellm_version(exe)
            proc, url, key = arms_mod.start_litellm(exe, model=cfg.model, upstream_v1=upstream, cpus=cfg.gateway_cpus)
            stack.callback(proc.stop)
            result.append(Arm("litellm", client.Target(base_url=url, model=cfg.model, api_key=key, name="litellm"),
                              proc))
        except (StartError, OSError) as exc:
            msg = f"LiteLLM arm not run: {str(exc)[-600:]}"
            out["notes"].append(msg)
            log(msg)
    for arm in result:
        _warm(arm, cfg)
    return result


def _warm(arm: Arm, cfg: GatewayConfig) -> None:
    samples = random_dataset(max(1, cfg.warmup), cfg.input_len, cfg.output_len, seed=10_000 + cfg.seed)
    results, _ = client.run(client.run_load(arm.target, samples, max_concurrency=1))
    failed = [r.error for r in results if not r.success]
    if failed:
        raise StartError(f"arm {arm.name} fails its warm-up requests: {failed[0]}")


def _latency_round(cfg: GatewayConfig, arms: list[Arm], conc: int, tok: HFTokenizer | None,
                   progress: ProgressFactory | None) -> dict[str, Any]:
    block = max(cfg.block_size, 4 * conc)
    n = cfg.blocks * block * len(arms)
    samples = random_dataset(n, cfg.input_len, cfg.output_len, seed=cfg.seed + conc, tokenizer=tok)
    results: dict[str, list[stats.RequestResult]] = {a.name: [] for a in arms}
    cpu: dict[str, float] = {a.name: 0.0 for a in arms}
    busy: dict[str, float] = {a.name: 0.0 for a in arms}
    cb = progress(f"concurrency {conc}", n) if progress else None
    it = iter(samples)

    async def go() -> None:
        sessions = {a.name: client.make_session(conc) for a in arms}
        try:
            for b in range(cfg.blocks):
                order = arms[b % len(arms):] + arms[: b % len(arms)]
                for arm in order:
                    chunk: list[SampleRequest] = [next(it) for _ in range(block)]
                    c0 = arm.cpu_now()
                    res, dur = await client.run_load(arm.target, chunk, max_concurrency=conc, progress=cb,
                                                     session=sessions[arm.name])
                    cpu[arm.name] += arm.cpu_now() - c0
                    arm.sample_rss()
                    results[arm.name].extend(res)
                    busy[arm.name] += dur
        finally:
            for s in sessions.values():
                await s.close()

    client.run(go())
    per_arm: dict[str, Any] = {}
    for arm in arms:
        rs = results[arm.name]
        summary = stats.summarize(rs, busy[arm.name], percentiles=(50, 90, 99))
        summary["proxy_cpu_ms_per_request"] = (1000 * cpu[arm.name] / len(rs)) if arm.proc and rs else None
        per_arm[arm.name] = summary
    direct = [r for r in results["direct"] if r.success]
    added: dict[str, Any] = {}
    for arm in arms:
        if arm.name == "direct":
            continue
        ok = [r for r in results[arm.name] if r.success]
        added[arm.name] = {
            "ttft_ms": _scale(stats.added_latency([r.ttft for r in direct], [r.ttft for r in ok])),
            "itl_ms": _scale(stats.added_latency([g for r in direct for g in r.itl], [g for r in ok for g in r.itl])),
            "e2el_ms": _scale(stats.added_latency([r.latency for r in direct], [r.latency for r in ok])),
        }
    return {"concurrency": conc, "requests_per_arm": cfg.blocks * block, "block_size": block, "arms": per_arm,
            "added": added, "ratios": _ratios(added, per_arm)}


def _scale(d: dict[str, float]) -> dict[str, float]:
    return {k: v * 1000.0 for k, v in d.items()}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _ratios(added: dict[str, Any], per_arm: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lite = added.get("litellm")
    for name in ("baton", "baton-notrace"):
        mine = added.get(name)
        if not mine:
            continue
        if lite:
            out[f"{name}_over_litellm"] = {
                "ttft_p50": _ratio(mine["ttft_ms"]["p50"], lite["ttft_ms"]["p50"]),
                "ttft_p99": _ratio(mine["ttft_ms"]["p99"], lite["ttft_ms"]["p99"]),
                "e2el_p50": _ratio(mine["e2el_ms"]["p50"], lite["e2el_ms"]["p50"]),
                "cpu_per_request": _ratio(per_arm[name]["proxy_cpu_ms_per_request"],
                                          per_arm["litellm"]["proxy_cpu_ms_per_request"]),
            }
    if "baton-notrace" in added and "baton-noflow" in added:
        out["flow_control_overhead"] = {
            "ttft_p50_ms": added["baton-notrace"]["ttft_ms"]["p50"] - added["baton-noflow"]["ttft_ms"]["p50"],
            "e2el_p50_ms": added["baton-notrace"]["e2el_ms"]["p50"] - added["baton-noflow"]["e2el_ms"]["p50"],
            "cpu_ms_per_request": _diff(per_arm["baton-notrace"]["proxy_cpu_ms_per_request"],
                                        per_arm["baton-noflow"]["proxy_cpu_ms_per_request"]),
        }
    libraries = {}
    for name, (base, _) in LIBRARY_ARMS.items():
        if name in added and base in added:
            libraries[name] = {
                "against": base,
                "cpu_ms_per_request": per_arm[name]["proxy_cpu_ms_per_request"],
                "hand_written_cpu_ms_per_request": per_arm[base]["proxy_cpu_ms_per_request"],
                "cpu_ratio": _ratio(per_arm[name]["proxy_cpu_ms_per_request"],
                                    per_arm[base]["proxy_cpu_ms_per_request"]),
                "added_ttft_p50_ms": added[name]["ttft_ms"]["p50"],
                "hand_written_added_ttft_p50_ms": added[base]["ttft_ms"]["p50"],
            }
    if libraries:
        out["libraries"] = libraries
    if "baton" in added and "baton-notrace" in added:
        out["tracing_overhead"] = {
            "ttft_p50_ms": added["baton"]["ttft_ms"]["p50"] - added["baton-notrace"]["ttft_ms"]["p50"],
            "e2el_p50_ms": added["baton"]["e2el_ms"]["p50"] - added["baton-notrace"]["e2el_ms"]["p50"],
            "cpu_ms_per_request": _diff(per_arm["baton"]["proxy_cpu_ms_per_request"],
                                        per_arm["baton-notrace"]["proxy_cpu_ms_per_request"]),
        }
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _throughput(cfg: GatewayConfig, arms: list[Arm], n: int, progress: ProgressFactory | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    samples = random_dataset(n, 16, cfg.output_len, seed=cfg.seed + 77)
    for arm in arms:
        count = n if arm.name != "litellm" else max(50, n // 10)
        cb = progress(f"throughput {arm.name}", count) if progress else None
        c0 = arm.cpu_now()
        res, dur = client.run(client.run_load(arm.target, samples[:count], max_concurrency=cfg.throughput_concurrency,
                                              progress=cb))
        used = arm.cpu_now() - c0
        arm.sample_rss()
        ok = sum(r.success for r in res)
        out[arm.name] = {
            "requests": count, "completed": ok, "duration_s": dur, "requests_per_s": ok / dur if dur else None,
            "proxy_cpu_s": used if arm.proc else None,
            "requests_per_cpu_s": (ok / used) if arm.proc and used > 0 else None,
            "rss_mb": sum(arm.proc.rss_mb().values()) if arm.proc else None,
            "ttft_ms": stats.describe([r.ttft for r in res if r.success], (50, 99), scale=1000.0),
        }
    return out


def _per_token(cfg: GatewayConfig, arms: list[Arm], n: int, progress: ProgressFactory | None) -> dict[str, Any]:
    """Each proxy's CPU per relayed token: the same requests with 1 and with ``output_len`` output tokens, the
    difference in CPU over the extra tokens (what a request costs whatever its length cancels out)."""
    conc = cfg.throughput_concurrency if cfg.upstream == "zero" else min(cfg.throughput_concurrency, 8)
    out: dict[str, Any] = {"concurrency": conc, "lengths": [1, cfg.output_len]}
    for arm in arms:
        if arm.proc is None or not (arm.latency or arm.floor):
            continue
        count = n if arm.name != "litellm" else max(20, n // 10)
        cpu_ms: list[float] = []
        for length in (1, cfg.output_len):
            samples = random_dataset(count, 16, length, seed=cfg.seed + 99 + length)
            cb = progress(f"per token {arm.name}, {length} tokens", count) if progress else None
            c0 = arm.cpu_now()
            res, _ = client.run(client.run_load(arm.target, samples, max_concurrency=conc, progress=cb))
            # a 1-token answer of the tiny model may be a token without text of its own (part of a character):
            # it completed all the same, and only the CPU it cost counts here
            failed = [r.error for r in res if not r.success and not (length == 1 and r.error == "no tokens")]
            if failed:
                raise StartError(f"arm {arm.name} failed {len(failed)} per-token requests: {failed[0]}")
            cpu_ms.append(1000 * (arm.cpu_now() - c0) / count)
        out[arm.name] = {"requests": count, "cpu_ms_per_request": {"1": cpu_ms[0], str(cfg.output_len): cpu_ms[1]},
                         "cpu_ms_per_token": (cpu_ms[1] - cpu_ms[0]) / (cfg.output_len - 1)}
    return out


#: Issue-level targets of the gateway's figures (tracing on unless named).
TARGETS = {"added_ttft_p50_ms": 0.5, "added_ttft_p99_ms": 1.5, "added_itl_p50_ms": 0.05, "baton_over_litellm": 0.05}
THROUGHPUT_TARGETS = {"requests_per_cpu_s": 2000, "rss_mb": 200}
CPU_MS_PER_TOKEN = 0.02


def headline(res: dict[str, Any]) -> dict[str, Any]:
    """The figures the targets (docs/architecture.md) name, from the concurrency-1 round (or the first)."""
    h: dict[str, Any] = {}
    rounds = res.get("rounds") or []
    r1 = next((r for r in rounds if r["concurrency"] == 1), rounds[0] if rounds else None)
    if r1:
        for name in ("baton", "baton-notrace", "litellm"):
            if name in r1["added"]:
                a = r1["added"][name]
                h[name] = {"added_ttft_p50_ms": a["ttft_ms"]["p50"], "added_ttft_p99_ms": a["ttft_ms"]["p99"],
                           "added_itl_p50_ms": a["itl_ms"]["p50"], "added_itl_p99_ms": a["itl_ms"]["p99"],
                           "cpu_ms_per_request": r1["arms"][name]["proxy_cpu_ms_per_request"]}
        h["ratios"] = r1["ratios"]
        # the proxies' own latency, judged where nothing else adds to it: in front of the zero upstream
        h["targets"] = dict(TARGETS) if (res.get("config") or {}).get("upstream", "zero") == "zero" else {}
    tp = res.get("throughput", {}).get("baton")
    if tp:
        h["throughput"] = {"requests_per_cpu_s": tp["requests_per_cpu_s"], "requests_per_s": tp["requests_per_s"],
                           "rss_mb": tp["rss_mb"], "targets": dict(THROUGHPUT_TARGETS)}
        n = res["config"].get("scaling_workers") or 0
        many = res.get("throughput", {}).get(f"baton-{n}w")
        if many and many["requests_per_s"] and tp["requests_per_s"]:
            h["throughput"]["workers"] = n
            h["throughput"]["workers_over_one"] = many["requests_per_s"] / tp["requests_per_s"]
            h["throughput"]["targets"]["workers_over_one"] = 0.9 * n
    pt = res.get("per_token") or {}
    per = {name: pt[name]["cpu_ms_per_token"] for name in ("baton", "baton-notrace", "litellm", "relay-floor")
           if name in pt}
    if per:
        h["per_token"] = {"cpu_ms_per_token": per, "target": CPU_MS_PER_TOKEN}
    return h


def plot(path: Path, res: dict[str, Any]) -> Path | None:
    rounds = res.get("rounds") or []
    if not rounds:
        return None
    groups: dict[str, dict[str, float]] = {}
    for r in rounds:
        for name, a in r["added"].items():
            groups[f"c={r['concurrency']} {name}"] = {"TTFT p50": a["ttft_ms"]["p50"], "TTFT p99": a["ttft_ms"]["p99"],
                                                      "ITL p50": a["itl_ms"]["p50"], "E2E p50": a["e2el_ms"]["p50"]}
    png: Path = report.plot_bars(path, groups, ylabel="ms",
                                 title=f"added latency vs direct ({res['config']['upstream']} upstream)")
    return png
