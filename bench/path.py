"""``baton bench path``: the request path hop by hop, five arms taking turns on the same prompts.

Arms, all on this machine's cores at once (idle when it is not their turn):

- ``engine``: a bare vLLM OpenAI server with the CPU profile's engine settings (the reference);
- ``serve-agg``: a Ray Serve LLM aggregated app, through Serve's ingress (HAProxy);
- ``serve-pd``: a Ray Serve LLM P/D app (Baton's decode server, NIXL), through Serve's ingress;
- ``baton-agg`` / ``baton-pd``: the same two apps through Baton's gateway (keys, limits, metering,
  tracing on);
- ``serve-pd-ray`` / ``baton-pd-ray``: the P/D app again with Ray Serve's default replica settings
  instead of the throughput-optimized preset Baton renders (``RAY_SERVE_THROUGHPUT_OPTIMIZED=0``: user
  code on a thread of its own, the handle's router on a loop of its own, Ray actor calls between
  replicas), what the preset buys measured in the same run.

The apps are built from :class:`~baton.dataplane.spec.DeploymentSpec` by Baton's own builders on a
Ray head of the bench's own with Baton's cluster environment, so they are what ``baton up`` serves.
For each concurrency the arms run in turns, in reversed order every other round. Each request carries
its own ``traceparent``; the gateway, the decode server and the decode engine export their spans to a
receiver in this process, and each P/D request's TTFT is split into hops: gateway, to the decode
server (gateway's forward, HAProxy, the replica's HTTP server), decode server before prefill, remote
prefill call (Ray handle, prefill replica and engine), decode server between prefill and decode, KV
transfer (NIXL, measured in the engine), first decode step, and back to the client. At concurrency 1
the CPU time of every process per request is recorded too (psutil), and a saturation phase (all
prompts at once, ``saturation_concurrency`` in flight) gives each arm's throughput.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.bench import client, report, stats
from baton.bench.datasets import HFTokenizer, SampleRequest, random_dataset
from baton.bench.procs import Proc, start_engine

Log = Callable[[str], None]
ProgressFactory = Callable[[str, int], Callable[[stats.RequestResult], None]]

ARMS = ("engine", "serve-agg", "serve-pd", "baton-agg", "baton-pd", "serve-pd-ray", "baton-pd-ray")
#: The Serve replicas' environment of the ``*-pd-ray`` arms' app: Ray Serve's defaults.
SERVE_DEFAULTS_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}
HOPS = ("gateway", "to decode server", "decode server, before prefill", "remote prefill call",
        "decode server, prefill to decode", "KV transfer (NIXL)", "first decode step", "back to the client")
#: The targets for this path (docs/architecture.md) (ms, ratios).
TARGETS = {"baton_pd_added_ttft_p50_ms": 15.0, "baton_agg_added_ttft_p50_ms": 3.0,
           "pd_saturation_vs_engine": 0.5, "itl_p50_within": 0.10}


@dataclass
class PathConfig:
    model_dir: Path | None = None
    """The tiny model (built under ``state_dir`` when unset)."""
    concurrencies: list[int] = field(default_factory=lambda: [1, 8])
    num_prompts: int = 40
    """Requests per arm, concurrency and round."""
    rounds: int = 2
    input_len: int = 256
    output_len: int = 64
    saturation_prompts: int = 64
    saturation_concurrency: int = 16
    warmup: int = 3
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    kv_cache_gib: float = 0.5
    pd_tiers: bool = True
    """The P/D app with LMCache tiers (CPU memory and Redis), as ``baton up`` deploys it."""
    max_model_len: int = 2048
    seed: int = 0
    state_dir: Path = Path("var/bench/path")


@dataclass
class Sent:
    result: stats.RequestResult
    trace_id: str
    sent_ns: int


# -- the stack ---------------------------------------------------------------------------------------


@dataclass
class Stack:
    targets: dict[str, client.Target]
    procs: dict[str, list[Proc]]
    """Processes whose CPU time is attributed: ``engine``, ``ray`` (the head's whole tree), ``gateway``."""


def _specs(cfg: PathConfig, model_dir: Path, otlp: str, facts_redis: str, nixl_base: int) -> list[Any]:
    from baton.dataplane.spec import DeploymentSpec

    common: dict[str, Any] = {
        "model": {"path": str(model_dir.resolve()), "served_name": "tiny"},
        "engine": {"kv_cache_space_gib": cfg.kv_cache_gib, "max_num_seqs": 16, "max_model_len": cfg.max_model_len},
        "telemetry": {"otlp_endpoint": otlp, "facts_redis_url": facts_redis},
    }
    agg = DeploymentSpec(name="path-agg", route_prefix="/path-agg", mode="aggregated",
                         **{**common, "model": {**common["model"], "served_name": "tiny-agg"}})
    tiers = {"redis_url": facts_redis, "local_cpu_gib": 0.25} if cfg.pd_tiers else None
    pd = DeploymentSpec(name="path-pd", route_prefix="/path-pd", mode="pd",
                        kv={"connector": "nixl", "nixl_port_base": nixl_base, "lmcache": tiers},
                        **{**common, "model": {**common["model"], "served_name": "tiny-pd"}})
    pd_ray = pd.model_copy(update={
        "name": "path-pd-ray", "route_prefix": "/path-pd-ray", "env": dict(SERVE_DEFAULTS_ENV),
        "model": pd.model.model_copy(update={"served_name": "tiny-pd-ray"}),
        "kv": pd.kv.model_copy(update={"nixl_port_base": nixl_base + 500})})
    return [agg, pd, pd_ray]


def app_of(arm: str) -> str:
    """The app an arm calls: ``agg``, ``pd`` or ``pd-ray`` (``engine`` for the bare engine)."""
    return arm.split("-", 1)[1] if "-" in arm else arm


def is_pd(arm: str) -> bool:
    return app_of(arm).startswith("pd")


def engine_profile_env() -> dict[str, str]:
    """The bare engine with the CPU profile's engine settings (executor in-process, passive OpenMP) and the
    thread count of the Serve replicas' engines: Ray gives a worker that holds a fraction of a CPU one
    OpenMP thread (``OMP_NUM_THREADS=1``)."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def path_stack(cfg: PathConfig, settings: Any, db: Any, otlp: str, *, log: Log) -> Iterator[Stack]:
    from baton.bench.chaos.stack import add_tenant, deploy, start_gateway, start_head

    model_dir = _model_dir(cfg, log)
    logs = cfg.state_dir / "logs"
    with contextlib.ExitStack() as es:
        log("starting a bare vLLM engine")
        engine, engine_url = start_engine("path-engine", model_dir, served_name="tiny", kv_cache_gib=1,
                                          extra=["--distributed-executor-backend", "uni", "--max-model-len",
                                                 str(cfg.max_model_len)],
                                          env=engine_profile_env(), wait=False)
        es.callback(engine.stop)
        log("starting a Ray head and deploying the aggregated and the P/D app")
        head = start_head(logs)
        es.callback(head.stop)
        wanted = {app_of(a) for a in cfg.arms}
        specs = [s for s in _specs(cfg, model_dir, otlp, settings.redis.url, 24000 + (head.serve_port % 40) * 100)
                 if s.name.removeprefix("path-") in wanted]
        urls = deploy(head, specs) if specs else {}
        engine.wait_http(engine_url.removesuffix("/v1") + "/health", timeout_s=300)
        models = {f"tiny-{name.removeprefix('path-')}": url for name, url in urls.items()}
        targets = {"engine": client.Target(engine_url, "tiny", name="engine")}
        gateways: list[Proc] = []
        for model, url in models.items():
            targets[f"serve-{model.removeprefix('tiny-')}"] = client.Target(url, model, name=f"serve-{model[5:]}")
        if any(a.startswith("baton-") for a in cfg.arms):
            _, key = add_tenant(db, settings, dict.fromkeys(models, model_dir), max_model_len=cfg.max_model_len,
                                prefix="path")
            gateway, gw_url = start_gateway(settings, models, logs, env={"BATON_TELEMETRY__OTLP_ENDPOINT": otlp})
            es.callback(gateway.stop)
            gateways.append(gateway)
            for model in models:
                arm = f"baton-{model.removeprefix('tiny-')}"
                targets[arm] = client.Target(f"{gw_url}/v1", model, api_key=key, name=arm)
        yield Stack(targets={a: targets[a] for a in cfg.arms},
                    procs={"engine": [engine], "ray": [head.proc], "gateway": gateways})


def _model_dir(cfg: PathConfig, log: Log) -> Path:
    if cfg.model_dir is not None:
        return Path(cfg.model_dir)
    from baton.dataplane.tinymodel import build_tiny_model

    folder = cfg.state_dir / "models" / "tiny-seed0"
    if not (folder / "config.json").exists():
        log(f"building the tiny model in {folder}")
        build_tiny_model(folder, seed=0)
    return folder


# -- load ---------------------------------------------------------------------------------------------


async def _run_arm(target: client.Target, samples: list[SampleRequest], *, concurrency: int,
                   progress: Callable[[stats.RequestResult], None] | None) -> tuple[list[Sent], float]:
    sent: list[Sent] = []

    async def send(sess: Any, sample: SampleRequest, i: int, t0: float) -> stats.RequestResult:
        trace_id = secrets.token_hex(16)
        tgt = dataclasses.replace(target, headers={**target.headers,
                                                   "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
        sent_ns = time.time_ns()
        r = await client.send_one(sess, tgt, sample, t0=t0)
        sent.append(Sent(r, trace_id, sent_ns))
        return r

    _, duration = await client.run_requests(send, samples, max_concurrency=concurrency, progress=progress)
    return sent, duration


def _cpu_by_process(stack: Stack) -> dict[int, tuple[str, float]]:
    import psutil

    out: dict[int, tuple[str, float]] = {}
    for group, procs in stack.procs.items():
        for proc in procs:
            for p in proc._procs():
                with contextlib.suppress(psutil.Error):
                    out[p.pid] = (_label(group, p), sum(p.cpu_times()[:2]))
    return out


def _label(group: str, p: Any) -> str:
    """A stable name for a process: Ray's and vLLM's process titles, the engine under its replica."""
    try:
        title = str((p.cmdline() or [p.name()])[0])
    except Exception:
        title = group
    if group == "engine":
        return "bare engine: engine core" if title.startswith("VLLM::") else "bare engine: API server"
    if group != "ray":
        return group
    if title.startswith("VLLM::"):
        with contextlib.suppress(Exception):
            parent = str((p.parent().cmdline() or [""])[0])
            return f"engine of {parent.removeprefix('ray::ServeReplica:')}"
        return "engine"
    if title.startswith("ray::ServeReplica:"):
        return "replica " + title.removeprefix("ray::ServeReplica:")
    if title.startswith("ray::"):
        return title.split(".")[0]
    name = Path(title).name
    return "ray: " + (name if name not in ("python", "python3") else "python")


def cpu_per_request(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                    n: int) -> dict[str, float]:
    """CPU ms per request by process label (processes present at both ends)."""
    by: dict[str, float] = {}
    for pid, (label, end) in after.items():
        if pid in before:
            by[label] = by.get(label, 0.0) + (end - before[pid][1])
    return {k: round(v * 1000 / max(n, 1), 3) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v > 0}


# -- attribution -------------------------------------------------------------------------------------


def attribute(spans: list[dict[str, Any]], sent_ns: int, ttft_s: float) -> dict[str, float] | None:
    """A P/D request's TTFT in hops (ms) from its spans; None when the spans needed are missing."""
    by: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by.setdefault(s["name"], []).append(s)
    prefill = sorted(by.get("dataplane.prefill", []), key=lambda s: s["start"])
    decode = by.get("dataplane.decode", [])
    handoff = by.get("dataplane.kv_handoff", [])
    if not prefill or not decode or not handoff:
        return None
    c0, c1 = sent_ns, sent_ns + int(ttft_s * 1e9)
    received = int(prefill[0]["attrs"].get("baton.server.received_unix_nano") or prefill[0]["start"])
    p0, p1 = prefill[0]["start"], prefill[-1]["end"]
    k = min(s["start"] for s in decode)
    f = min(s["end"] for s in handoff)
    transfer = sum(s["end"] - s["start"] for s in by.get("dataplane.kv_transfer", []))
    gw_edge = c0
    hops: dict[str, float] = {}
    gateway = [s for s in spans if s["name"] in ("gateway.ratelimit", "gateway.auth")]
    if gateway:
        gw_edge = max(s["end"] for s in gateway)
        hops["gateway"] = gw_edge - c0
    hops["to decode server"] = received - gw_edge
    hops["decode server, before prefill"] = p0 - received
    hops["remote prefill call"] = p1 - p0
    hops["decode server, prefill to decode"] = k - p1
    hops["KV transfer (NIXL)"] = transfer
    hops["first decode step"] = (f - k) - transfer
    hops["back to the client"] = c1 - f
    return {h: round(v / 1e6, 3) for h, v in hops.items()}


def _example(sent: list[Sent], traced: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The spans of the median-TTFT request, relative to its send time: a waterfall to read."""
    ok = sorted((s for s in sent if s.result.success and traced.get(s.trace_id)), key=lambda s: s.result.ttft)
    if not ok:
        return []
    mid = ok[len(ok) // 2]
    rows = [{"name": "client: first token", "start_ms": round(mid.result.ttft * 1000, 3), "duration_ms": 0.0}]
    for sp in sorted(traced[mid.trace_id], key=lambda x: x["start"]):
        attrs = {k: v for k, v in sp["attrs"].items() if k.startswith("baton.kv.") or k in ("baton.prefill.attempt",)}
        rows.append({"name": sp["name"], "service": sp["service"],
                     "start_ms": round((sp["start"] - mid.sent_ns) / 1e6, 3),
                     "duration_ms": round((sp["end"] - sp["start"]) / 1e6, 3), "attrs": attrs})
    return sorted(rows, key=lambda r: r["start_ms"])


def _median_hops(rows: list[dict[str, float]]) -> dict[str, float]:
    return {h: round(statistics.median(r.get(h, 0.0) for r in rows), 3) for h in HOPS if any(h in r for r in rows)}


def _summary(sent: list[Sent], duration: float) -> dict[str, Any]:
    return stats.summarize([s.result for s in sent], duration)


# -- the run -----------------------------------------------------------------------------------------


def run_path(cfg: PathConfig, settings: Any, db: Any, *, log: Log = print,
             progress: ProgressFactory | None = None) -> dict[str, Any]:
    from baton.bench.otlp_receiver import receiver

    started = report.provenance()
    with receiver() as (otlp, rec), path_stack(cfg, settings, db, otlp, log=log) as stack:
        tok = HFTokenizer(_model_dir(cfg, log))
        samples = random_dataset(cfg.num_prompts, cfg.input_len, cfg.output_len, seed=cfg.seed, tokenizer=tok)
        warm = random_dataset(cfg.warmup, cfg.input_len, cfg.output_len, seed=cfg.seed + 1, tokenizer=tok)
        for arm, target in stack.targets.items():
            log(f"warming up {arm}")
            client.run(_run_arm(target, warm, concurrency=1, progress=None))

        runs: dict[int, dict[str, list[Sent]]] = {}
        durations: dict[int, dict[str, float]] = {}
        cpu: dict[str, dict[str, float]] = {}
        for conc in cfg.concurrencies:
            runs[conc] = {arm: [] for arm in stack.targets}
            durations[conc] = {arm: 0.0 for arm in stack.targets}
            for rnd in range(cfg.rounds):
                order = list(stack.targets) if rnd % 2 == 0 else list(reversed(stack.targets))
                for arm in order:
                    tick = progress(f"c={conc} round {rnd + 1} {arm}", len(samples)) if progress else None
                    before = _cpu_by_process(stack) if conc == 1 else {}
                    sent, duration = client.run(_run_arm(stack.targets[arm], samples, concurrency=conc,
                                                         progress=tick))
                    if conc == 1:
                        after = _cpu_by_process(stack)
                        per = cpu_per_request(before, after, len(sent))
                        prev = cpu.get(arm)
                        cpu[arm] = per if prev is None else {k: round((prev.get(k, 0) + per.get(k, 0)) / 2, 3)
                                                             for k in {*prev, *per}}
                    runs[conc][arm].extend(sent)
                    durations[conc][arm] += duration

        saturation: dict[str, dict[str, Any]] = {}
        sat = random_dataset(cfg.saturation_prompts, cfg.input_len, cfg.output_len, seed=cfg.seed + 2, tokenizer=tok)
        for arm, target in stack.targets.items():
            tick = progress(f"saturation {arm}", len(sat)) if progress else None
            sent, duration = client.run(_run_arm(target, sat, concurrency=cfg.saturation_concurrency, progress=tick))
            saturation[arm] = _summary(sent, duration)

        log("collecting spans")
        rec.settle()
        result = _result(cfg, runs, durations, cpu=cpu, saturation=saturation, rec=rec)
    result["provenance"] = report.provenance(started)
    return result


def _result(cfg: PathConfig, runs: dict[int, dict[str, list[Sent]]], durations: dict[int, dict[str, float]], *,
            cpu: dict[str, dict[str, float]], saturation: dict[str, dict[str, Any]], rec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "path", "config": {k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in dataclasses.asdict(cfg).items()},
                           "arms": list(next(iter(runs.values())).keys()) if runs else [], "concurrency": {}}
    for conc, arms in runs.items():
        block: dict[str, Any] = {}
        for arm, sent in arms.items():
            summary = _summary(sent, durations[conc][arm])
            entry: dict[str, Any] = {"summary": summary}
            if is_pd(arm):
                traced = rec.by_trace({s.trace_id for s in sent if s.result.success})
                rows = [a for s in sent if s.result.success
                        for a in [attribute(traced.get(s.trace_id, []), s.sent_ns, s.result.ttft)] if a]
                entry["hops_ms_median"] = _median_hops(rows)
                entry["attributed_requests"] = len(rows)
                entry["example_trace"] = _example(sent, traced)
            block[arm] = entry
        base = block.get("engine")
        if base:
            for entry in block.values():
                s, b = entry["summary"], base["summary"]
                entry["added_ttft_p50_ms"] = round(s["ttft_ms"]["p50"] - b["ttft_ms"]["p50"], 3)
                entry["itl_p50_ratio"] = _ratio(s["itl_ms"]["p50"], b["itl_ms"]["p50"])
        out["concurrency"][str(conc)] = block
    out["cpu_ms_per_request_c1"] = cpu
    out["saturation"] = saturation
    if "engine" in saturation:
        eng = saturation["engine"]["output_throughput"]
        out["saturation_vs_engine"] = {arm: _ratio(s["output_throughput"], eng) for arm, s in saturation.items()}
    out["targets"] = targets_met(out)
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def targets_met(result: dict[str, Any]) -> dict[str, Any]:
    """Each of the path targets (docs/architecture.md) next to the measured figure (concurrency 1)."""
    c1 = result.get("concurrency", {}).get("1", {})
    out: dict[str, Any] = {}

    def row(name: str, measured: float | None, target: float, ok: bool | None) -> None:
        out[name] = {"measured": measured, "target": target, "met": ok}

    pd = c1.get("baton-pd", {}).get("added_ttft_p50_ms")
    agg = c1.get("baton-agg", {}).get("added_ttft_p50_ms")
    row("baton_pd_added_ttft_p50_ms", pd, TARGETS["baton_pd_added_ttft_p50_ms"],
        None if pd is None else pd <= TARGETS["baton_pd_added_ttft_p50_ms"])
    row("baton_agg_added_ttft_p50_ms", agg, TARGETS["baton_agg_added_ttft_p50_ms"],
        None if agg is None else agg <= TARGETS["baton_agg_added_ttft_p50_ms"])
    sat = (result.get("saturation_vs_engine") or {}).get("baton-pd")
    row("pd_saturation_vs_engine", sat, TARGETS["pd_saturation_vs_engine"],
        None if sat is None else sat >= TARGETS["pd_saturation_vs_engine"])
    itl = c1.get("baton-pd", {}).get("itl_p50_ratio")
    row("baton_pd_itl_p50_vs_engine", itl, 1 + TARGETS["itl_p50_within"],
        None if itl is None else itl <= 1 + TARGETS["itl_p50_within"])
    return out


def plot(path: Path, result: dict[str, Any]) -> Path:
    """TTFT p50 per arm at each concurrency, and the P/D arms' TTFT split into hops (concurrency 1)."""
    plt = report._plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    arms = result["arms"]
    concs = list(result["concurrency"])
    width = 0.8 / max(len(concs), 1)
    for i, conc in enumerate(concs):
        vals = [result["concurrency"][conc][a]["summary"]["ttft_ms"]["p50"] for a in arms]
        xs = [j + i * width for j in range(len(arms))]
        ax1.bar(xs, vals, width=width, label=f"concurrency {conc}")
    ax1.set_xticks([j + width * (len(concs) - 1) / 2 for j in range(len(arms))], arms, rotation=15)
    ax1.set_ylabel("TTFT p50 (ms)")
    ax1.set_title("TTFT p50 by arm")
    ax1.legend()
    c1 = result["concurrency"].get(concs[0], {}) if concs else {}
    pd_arms = [a for a in arms if is_pd(a) and c1.get(a, {}).get("hops_ms_median")]
    bottoms = [0.0] * len(pd_arms)
    cmap = plt.get_cmap("tab10")
    for k, hop in enumerate(HOPS):
        vals = [c1[a]["hops_ms_median"].get(hop, 0.0) for a in pd_arms]
        if not any(vals):
            continue
        ax2.barh(pd_arms, vals, left=bottoms, color=cmap(k % 10), label=hop)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    engine = c1.get("engine", {}).get("summary", {}).get("ttft_ms", {}).get("p50")
    if engine:
        ax2.axvline(engine, color="black", linestyle="--", linewidth=1, label="bare engine TTFT p50")
    ax2.set_xlabel(f"ms (median per hop, concurrency {concs[0] if concs else '?'})")
    ax2.set_title("P/D TTFT by hop (spans)")
    if pd_arms:
        ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":  # pragma: no cover - use `baton bench path`
    sys.exit("run `baton bench path --help`")
