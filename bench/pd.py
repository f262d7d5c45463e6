"""``baton bench pd``: aggregated vs P/D on a long-prompt/short-prompt mix, same cores, same load.

- Aggregated: two vLLM engines, one core each, requests spread round-robin (two replicas).
- P/D 1:1: a prefill and a decode engine with NixlConnector, one core each; the bench is the P/D proxy
  (prefill with ``max_tokens=1`` and ``do_remote_decode``, then a streamed decode on the transferred KV).
  TTFT is from sending the prefill request to the first decoded token.

The same prompts arrive at the same Poisson times in both arms. Reported per arm and rate: TTFT, TPOT
and ITL tails (overall and for short and long prompts apart: long prefills stalling short requests'
decode is what P/D removes), and goodput under the SLO with failures as misses. The control plane's
planner (:mod:`baton.control.pd_cost_model`) is calibrated from a short probe on the aggregated engines and
its prediction is printed beside the measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from baton.bench import client, report, stats
from baton.bench.datasets import HFTokenizer, SampleRequest, mix_dataset, random_dataset
from baton.bench.handoff import model_dir_for, model_shape, start_pd_pair
from baton.bench.procs import Proc, start_engine, wait_engines

Log = Callable[[str], None]
ProgressFactory = Callable[[str, int], Callable[[stats.RequestResult], None]]


@dataclass
class PdConfig:
    shape: str = "tiny"
    num_prompts: int = 40
    request_rates: list[float] = field(default_factory=lambda: [1.0, 2.0])
    long_len: int = 2048
    short_len: int = 128
    long_fraction: float = 0.25
    output_len: int = 32
    goodput: list[str] = field(default_factory=lambda: ["ttft:2000", "tpot:50"])
    slo_percentile: float = 90.0
    seed: int = 0
    state_dir: str = "var"
    link_gbps: float = 1.9


def _pd_prefill_body(model: str, prompt: str) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 1, "stream": False, "temperature": 0.0,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}}


def pd_sender(prefill_url: str, decode: client.Target, timeout_s: float = 300.0) -> client.SendFn:
    """A ``send`` for :func:`client.run_requests` acting as the P/D proxy."""
    import aiohttp

    async def send(session: Any, sample: SampleRequest, i: int, t0: float) -> stats.RequestResult:
        st = time.perf_counter()
        try:
            async with session.post(f"{prefill_url}/v1/completions", data=json.dumps(_pd_prefill_body(
                    decode.model, sample.prompt)), headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200 or not body.get("kv_transfer_params"):
                    return stats.RequestResult(False, sample.prompt_len, start=st - t0,
                                               latency=time.perf_counter() - st,
                                               error=f"prefill HTTP {resp.status}", arm=decode.name)
        except Exception as exc:  # a failed request, not a failed run
            return stats.RequestResult(False, sample.prompt_len, start=st - t0, latency=time.perf_counter() - st,
                                       error=f"prefill {type(exc).__name__}", arm=decode.name)
        prefill_s = time.perf_counter() - st
        target = dataclasses.replace(decode, extra_body={"kv_transfer_params": body["kv_transfer_params"]})
        r = await client.send_one(session, target, sample, timeout_s=timeout_s)
        r.start = st - t0
        r.ttft += prefill_s
        r.latency += prefill_s
        return r

    return send


def _probe(targets: list[client.Target], tok: HFTokenizer, cfg: PdConfig) -> list[dict[str, Any]]:
    """Sequential requests (no queueing) on the aggregated engines: records for the planner's
    calibration (prefill throughput from TTFT, decode step from TPOT)."""
    longs = random_dataset(3, cfg.long_len, cfg.output_len, seed=cfg.seed + 501, tokenizer=tok)
    shorts = random_dataset(3, cfg.short_len, cfg.output_len, seed=cfg.seed + 502, tokenizer=tok)
    results, _ = client.run(client.run_load(targets, longs + shorts, max_concurrency=1))
    return [{"prompt_tokens": r.prompt_len, "completion_tokens": r.output_tokens, "ttft_ms": r.ttft * 1000,
             "tpot_ms": r.tpot * 1000} for r in results if r.success]


def _load(arm: str, send_or_targets: Any, samples: list[SampleRequest], rate: float, cfg: PdConfig, *,
          slo: dict[str, float], progress: ProgressFactory | None) -> dict[str, Any]:
    cb = progress(f"{arm} rate {rate:g}", len(samples)) if progress else None
    if callable(send_or_targets):
        results, duration = client.run(client.run_requests(send_or_targets, samples, request_rate=rate,
                                                           seed=cfg.seed, progress=cb))
    else:
        results, duration = client.run(client.run_load(send_or_targets, samples, request_rate=rate, seed=cfg.seed,
                                                       progress=cb))
    pcts = (50.0, 90.0, 99.0)
    out: dict[str, Any] = stats.summarize(results, duration, slo=slo, percentiles=pcts)
    out["request_rate"] = rate
    out["by_kind"] = {k: stats.summarize([r for s, r in zip(samples, results, strict=True) if s.kind == k], duration,
                                         slo=slo, percentiles=pcts) for k in ("short", "long")}
    return out


#: The NIXL counters a P/D run reports (:func:`_kv_counts`), by the engine that keeps each: the decode
#: engine's KV reads and the reads that failed (the prompt is then recomputed: the request still
#: completes), the prefill engine's requests whose KV lease ran out before the decode side read it.
KV_COUNTS = {"transfers": ("decode", "vllm:nixl_xfer_time_seconds_count"),
             "failed_transfers": ("decode", "vllm:nixl_num_failed_transfers_total"),
             "expired_leases": ("prefill", "vllm:nixl_num_kv_expired_reqs_total")}


def _kv_counts(urls: dict[str, str], *, since: dict[str, int] | None = None) -> dict[str, int]:
    """:data:`KV_COUNTS` from the engines at ``urls`` (role -> base URL), or their growth ``since`` an
    earlier reading."""
    import httpx

    from baton.bench.handoff import parse_metrics

    # vLLM exports its KV-connector stats with the next engine step's: read once they have settled.
    time.sleep(1.0)
    now = {}
    for role, url in urls.items():
        names = tuple(name for r, name in KV_COUNTS.values() if r == role)
        got = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text, names)
        now.update({key: int(got[name]) for key, (r, name) in KV_COUNTS.items() if r == role})
    return {k: v - (since or {}).get(k, 0) for k, v in now.items()}


def run_pd(cfg: PdConfig, *, log: Log = print, progress: ProgressFactory | None = None) -> dict[str, Any]:
    slo = stats.parse_goodput(cfg.goodput)
    folder = model_dir_for(cfg.shape, cfg.state_dir, cfg.seed)
    tok = HFTokenizer(folder)
    name = cfg.shape
    samples = mix_dataset(cfg.num_prompts, long_len=cfg.long_len, short_len=cfg.short_len,
                          long_fraction=cfg.long_fraction, output_len=cfg.output_len, seed=cfg.seed, tokenizer=tok)
    started = report.provenance()
    out: dict[str, Any] = {"benchmark": "pd", "config": asdict(cfg), "model_dir": str(folder), "slo_ms": slo,
                           "arms": {}}
    warm = random_dataset(2, 64, 4, seed=cfg.seed + 9, tokenizer=tok)

    log("aggregated: two engines, one core each")
    with contextlib.ExitStack() as stack:
        targets = []
        engines: list[tuple[Proc, str]] = []
        for core in ("0", "1"):
            proc, url = start_engine(f"agg{core}", folder, served_name=name, omp_bind=core,
                                     extra=["--no-enable-prefix-caching"], wait=False)
            stack.callback(proc.stop)
            engines.append((proc, url))
            targets.append(client.Target(base_url=url, model=name, endpoint="completions", name="aggregated"))
        wait_engines(engines)
        client.run(client.run_load(targets, warm + warm, max_concurrency=1))
        out["calibration_records"] = _probe(targets, tok, cfg)
        out["arms"]["aggregated"] = [_load("aggregated", targets, samples, r, cfg, slo=slo, progress=progress)
                                     for r in cfg.request_rates]

    log("P/D 1:1: prefill and decode engines with Baton's NIXL connector, one core each")
    p, purl, d, durl = start_pd_pair(folder, served_name=name, tag="-pd")
    try:
        decode = client.Target(base_url=f"{durl}/v1", model=name, endpoint="completions", name="pd")
        send = pd_sender(purl, decode)
        engines_pd = {"prefill": purl, "decode": durl}
        client.run(client.run_requests(send, warm, max_concurrency=1))
        out["arms"]["pd"] = []
        for rate in cfg.request_rates:
            before = _kv_counts(engines_pd)
            run = _load("pd 1:1", send, samples, rate, cfg, slo=slo, progress=progress)
            run["kv"] = _kv_counts(engines_pd, since=before)
            out["arms"]["pd"].append(run)
    finally:
        d.stop()
        p.stop()

    out["prediction"] = predict(cfg, folder, samples, out["calibration_records"], slo)
    out["provenance"] = report.provenance(started)
    return out


def predict(cfg: PdConfig, folder: Path, samples: list[SampleRequest], records: list[dict[str, Any]],
            slo: dict[str, float]) -> dict[str, Any]:
    """The planner's answer for this mix, calibrated from the probe; None fields if it cannot say."""
    try:
        from baton.control import pd_cost_model as cost
    except ImportError as exc:  # the planner is part of the control plane; the bench runs without it
        return {"error": f"planner not available: {exc}"}
    shape = model_shape(folder)
    mshape = cost.ModelShape(num_layers=shape["layers"], num_kv_heads=shape["kv_heads"],
                             head_dim=shape["head_dim"], dtype="float32")
    base = cost.Hardware(link_bandwidth_gbps=cfg.link_gbps)
    cal = cost.calibrate(records, base)
    hw = cal.hardware if cal else base
    notes = []
    tpots = sorted(r["tpot_ms"] for r in records if r.get("tpot_ms"))
    if cal and tpots and hw.decode_step_ms < 0.5 <= statistics.median(tpots):
        # A starved API server flushes a whole answer at once, which makes the fast end of the TPOTs ~0.
        hw = dataclasses.replace(hw, decode_step_ms=statistics.median(tpots))
        notes.append("decode step taken from the probe's median TPOT: its fast end was ~0 (coalesced stream)")
    out: dict[str, Any] = {"hardware": asdict(hw), "calibrated": cal is not None, "notes": notes, "by_rate": []}
    for rate in cfg.request_rates:
        traffic = cost.Traffic(prompt_tokens=[s.prompt_len for s in samples],
                               output_tokens=[s.output_len for s in samples], arrival_rate=rate)
        sl = cost.Slo(ttft_ms=slo.get("ttft", 1e9), tpot_ms=slo.get("tpot", 1e9), percentile=cfg.slo_percentile)
        plan = cost.plan(mshape, hw, traffic, sl, ratios=[(1, 1)])
        row: dict[str, Any] = {"request_rate": rate, "recommended": plan.recommended, "reason": plan.reason,
                               "transfer_lower_bound_ms": plan.transfer_lower_bound_ms, "configs": {}}
        for c in plan.configs:
            per_unit = rate / 2 if c.prefill == 0 else rate  # two aggregated replicas share the load
            near = min(c.curve, key=lambda pt, x=per_unit: abs(float(pt.rate) - x)) if c.curve else None  # type: ignore[misc]
            row["configs"][c.name] = {
                "goodput_per_gpu": c.goodput_per_gpu, "goodput_two_cores": c.goodput_per_gpu * 2,
                "bottleneck": c.bottleneck,
                "at_rate": {"rate_per_unit": near.rate, "ttft_ms": near.ttft_ms, "tpot_ms": near.tpot_ms,
                            "ok": near.ok} if near else None,
            }
        out["by_rate"].append(row)
    return out


def plot(path: Path, res: dict[str, Any]) -> Path:
    plt = report._plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for arm, runs in res["arms"].items():
        rates = [r["request_rate"] for r in runs]
        axes[0].plot(rates, [r["by_kind"]["short"]["itl_ms"]["p99"] for r in runs], "o-", label=f"{arm} short ITL p99")
        axes[0].plot(rates, [r["by_kind"]["short"]["itl_ms"]["p50"] for r in runs], "s--", label=f"{arm} short ITL p50")
        axes[1].plot(rates, [r["ttft_ms"]["p90"] for r in runs], "o-", label=f"{arm} TTFT p90")
        axes[2].plot(rates, [r.get("goodput_fraction", math.nan) for r in runs], "o-", label=arm)
    axes[0].set_title("ITL of short requests (ms)")
    axes[1].set_title("TTFT p90 (ms)")
    axes[2].set_title(f"share within SLO {res['slo_ms']}")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
