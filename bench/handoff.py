"""``baton bench handoff``: how long the P->D KV handoff takes against the ideal.

Two vLLM servers with ``NixlConnector`` (CPU buffers, UCX on loopback), one core each; the bench acts
as the P/D proxy: prefill on P with ``max_tokens=1`` and ``kv_transfer_params.do_remote_decode``,
then decode on D with the ``kv_transfer_params`` P returned, so D pulls the prompt's KV over NIXL.

Handoff time is NIXL's own transfer duration as the decode engine exports it on ``/metrics``
(``vllm:nixl_xfer_time_seconds`` histogram: sum and count grow by one transfer per request; the
request's bytes are in ``vllm:nixl_bytes_transferred``). Requests are sent one at a time, so each
delta belongs to one request. A client-side figure is kept beside it: D's time to first token minus
one decode step (its median inter-token latency), which also holds the scheduling of the load.

Ideal time = KV bytes / memcpy bandwidth of this machine, KV bytes = 2 x layers x kv_heads x head_dim
x tokens x 4 (fp32), memcpy bandwidth measured with NumPy on large buffers. Efficiency = ideal /
measured (1.0 = the transfer runs at memcpy speed).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from baton.bench import report
from baton.bench.datasets import HFTokenizer, random_dataset
from baton.bench.procs import Proc, engine_command, engine_env, free_port

Log = Callable[[str], None]

#: Model shapes the bench can build (``baton model make-tiny``'s builder with another shape).
SHAPES: dict[str, dict[str, int]] = {
    # Baton's default tiny model: 1 KiB of KV per token (fp32).
    "tiny": {},
    # A bench-sized model: 8 layers x 8 KV heads x 64 = 32 KiB of KV per token, so that a 2k-token
    # handoff (64 MiB) is long enough to be dominated by bandwidth rather than per-transfer set-up.
    "bench": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 8, "head_dim": 64},
}


@dataclass
class HandoffConfig:
    shapes: list[str] = field(default_factory=lambda: ["tiny", "bench"])
    prompt_lens: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048, 3584])
    repeats: int = 3
    output_len: int = 8
    seed: int = 0
    state_dir: str = "var"
    kv_cache_gib: int = 1
    memcpy_mb: int = 256


def measure_memcpy(size_mb: int = 256, repeats: int = 7) -> dict[str, float]:
    """Copy bandwidth of this machine: best and median of ``repeats`` copies of a ``size_mb`` buffer
    (bytes copied per second; one read and one write of each byte)."""
    import numpy as np

    n = size_mb * 2**20
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return {"bytes": float(n), "best_GBps": n / min(times) / 1e9, "median_GBps": n / statistics.median(times) / 1e9}


def model_dir_for(shape: str, state_dir: str = "var", seed: int = 0) -> Path:
    """A model folder of ``shape``, built once (deterministic from ``seed``)."""
    from baton.dataplane.tinymodel import DEFAULT_SHAPE, TinyModelShape, build_tiny_model

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} ({', '.join(SHAPES)})")
    if shape == "tiny" and (Path(state_dir) / "models" / "tiny" / "config.json").exists():
        return Path(state_dir) / "models" / "tiny"
    folder = Path(state_dir) / "bench" / "models" / f"{shape}-seed{seed}"
    if not (folder / "config.json").exists():
        fields = {**asdict(DEFAULT_SHAPE), **SHAPES[shape]}
        build_tiny_model(folder, seed=seed, shape=TinyModelShape(**fields))
    return folder


def model_shape(folder: Path) -> dict[str, int]:
    cfg = json.loads((folder / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    return {"layers": int(cfg["num_hidden_layers"]), "kv_heads": int(cfg.get("num_key_value_heads", heads)),
            "head_dim": int(cfg.get("head_dim") or cfg["hidden_size"] // heads)}


def kv_bytes(shape: dict[str, int], tokens: int, dtype_bytes: int = 4) -> int:
    """The KV bytes of ``tokens`` tokens of a :func:`model_shape` (:func:`baton.core.contracts.kv_bytes`)."""
    from baton.core.contracts import kv_bytes as formula

    return formula(num_layers=shape["layers"], num_kv_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                   tokens=tokens, bytes_per_element=dtype_bytes)


def parse_metrics(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sums of Prometheus samples by name (over all label sets), for the names asked."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            with contextlib.suppress(ValueError, IndexError):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


NIXL_METRICS = ("vllm:nixl_xfer_time_seconds_sum", "vllm:nixl_xfer_time_seconds_count",
                "vllm:nixl_bytes_transferred_sum", "vllm:nixl_post_time_seconds_sum",
                "vllm:nixl_num_failed_transfers_total")


def nixl_config() -> str:
    """The P/D engines' ``--kv-transfer-config``: the connector Baton's deployments run on a CPU host
    (:func:`baton.dataplane.render.kv_transfer_config`: vLLM's NixlConnector with Baton's transfer
    timing, NIXL's progress thread woken by its events, a pause before an empty engine step while KV is
    held or awaited, KV that fails to load recomputed). vLLM's bare connector busy-steps a prefill engine
    that holds KV, and on two cores that can starve its own handshake listener until the KV lease (30 s)
    runs out: the benchmarks measure P/D as Baton serves it, not that."""
    from baton.dataplane import render
    from baton.dataplane.spec import DeploymentSpec

    spec = DeploymentSpec(name="bench", model={"path": ".", "served_name": "bench"}, mode="pd",
                          kv={"connector": "nixl"})
    return json.dumps(render.kv_transfer_config(spec, "prefill"))


def start_pd_pair(model_dir: Path, *, served_name: str, kv_cache_gib: int = 1, max_model_len: int = 4096,
                  timeout_s: float = 300.0, tag: str = "") -> tuple[Proc, str, Proc, str]:
    """Prefill and decode vLLM servers with NixlConnector, one core each; both started, then awaited."""
    procs = []
    for role, core in (("prefill", "0"), ("decode", "1")):
        port = free_port()
        env = {**engine_env(kv_cache_gib, omp_bind=core), "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
        cmd = engine_command(model_dir, port=port, served_name=served_name, max_model_len=max_model_len,
                             extra=["--kv-transfer-config", nixl_config()])
        procs.append((Proc(f"{role}{tag}", cmd, env=env).start(), f"http://127.0.0.1:{port}"))
    try:
        for proc, url in procs:
            proc.wait_http(f"{url}/health", timeout_s=timeout_s)
    except BaseException:
        for proc, _ in procs:
            proc.stop()
        raise
    (p, purl), (d, durl) = procs
    return p, purl, d, durl


def pd_request(http: httpx.Client, prefill_url: str, decode_url: str, *, model: str, prompt: str,
               max_tokens: int) -> dict[str, Any]:
    """One request through P then D, the way a P/D proxy sends it; client-side times in seconds."""
    t0 = time.perf_counter()
    r = http.post(f"{prefill_url}/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": 1, "stream": False, "temperature": 0.0,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                               "remote_block_ids": None, "remote_host": None, "remote_port": None}})
    r.raise_for_status()
    body = r.json()
    params = body.get("kv_transfer_params")
    if not params:
        raise RuntimeError("the prefill engine returned no kv_transfer_params (is NixlConnector configured?)")
    prompt_tokens = int((body.get("usage") or {}).get("prompt_tokens") or 0)
    t1 = time.perf_counter()
    ttft = None
    gaps: list[float] = []
    last = t1
    with http.stream("POST", f"{decode_url}/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "temperature": 0.0, "kv_transfer_params": params}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            data = json.loads(line[5:])
            if any(c.get("text") for c in data.get("choices") or ()):
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t1
                else:
                    gaps.append(now - last)
                last = now
    return {"prefill_s": t1 - t0, "decode_ttft_s": ttft, "itl_s": gaps, "prompt_tokens": prompt_tokens,
            "total_s": time.perf_counter() - t0}


def _scrape(http: httpx.Client, url: str) -> dict[str, float]:
    return parse_metrics(http.get(f"{url}/metrics").text, NIXL_METRICS)


def _wait_transfer(http: httpx.Client, url: str, before: dict[str, float], timeout_s: float = 5.0) -> dict[str, float]:
    """Metrics once the transfer count has grown (stats reach /metrics with the next engine step)."""
    deadline = time.monotonic() + timeout_s
    now = _scrape(http, url)
    while now["vllm:nixl_xfer_time_seconds_count"] <= before["vllm:nixl_xfer_time_seconds_count"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
        now = _scrape(http, url)
    return now


def run_shape(cfg: HandoffConfig, shape_name: str, *, memcpy_Bps: float, link_Bps: float, log: Log,
              progress: Callable[[str, int], Callable[[Any], None]] | None = None) -> dict[str, Any]:
    folder = model_dir_for(shape_name, cfg.state_dir, cfg.seed)
    shape = model_shape(folder)
    tok = HFTokenizer(folder)
    log(f"{shape_name}: starting prefill and decode engines with Baton's NIXL connector on {folder}")
    p, purl, d, durl = start_pd_pair(folder, served_name=shape_name, kv_cache_gib=cfg.kv_cache_gib,
                                     tag=f"-{shape_name}")
    rows = []
    try:
        with httpx.Client(timeout=300.0) as http:
            warm = random_dataset(2, 64, 2, seed=cfg.seed + 99, tokenizer=tok)
            for s in warm:
                pd_request(http, purl, durl, model=shape_name, prompt=s.prompt, max_tokens=2)
            tick = progress(shape_name, len(cfg.prompt_lens) * cfg.repeats) if progress else None
            for n in cfg.prompt_lens:
                samples = random_dataset(cfg.repeats, n, cfg.output_len, seed=cfg.seed + n, tokenizer=tok)
                for s in samples:
                    before = _scrape(http, durl)
                    r = pd_request(http, purl, durl, model=shape_name, prompt=s.prompt, max_tokens=cfg.output_len)
                    after = _wait_transfer(http, durl, before)
                    delta = {k: after[k] - before[k] for k in NIXL_METRICS}
                    tokens = r["prompt_tokens"] or s.prompt_len
                    kvb = kv_bytes(shape, tokens)
                    count = delta["vllm:nixl_xfer_time_seconds_count"]
                    xfer = delta["vllm:nixl_xfer_time_seconds_sum"] if count else None
                    itl50 = statistics.median(r["itl_s"]) if r["itl_s"] else 0.0
                    client_handoff = (r["decode_ttft_s"] - itl50) if r["decode_ttft_s"] is not None else None
                    ideal = kvb / memcpy_Bps
                    rows.append({
                        "prompt_len": n, "prompt_tokens": tokens, "kv_bytes": kvb,
                        "nixl_bytes": delta["vllm:nixl_bytes_transferred_sum"],
                        "nixl_transfers": delta["vllm:nixl_xfer_time_seconds_count"],
                        "nixl_failed": delta["vllm:nixl_num_failed_transfers_total"],
                        "nixl_xfer_ms": xfer * 1000 if xfer is not None else None,
                        "nixl_post_ms": delta["vllm:nixl_post_time_seconds_sum"] * 1000,
                        "client_handoff_ms": client_handoff * 1000 if client_handoff is not None else None,
                        "prefill_ms": r["prefill_s"] * 1000, "decode_ttft_ms": (r["decode_ttft_s"] or 0) * 1000,
                        "decode_itl_p50_ms": itl50 * 1000,
                        "ideal_memcpy_ms": ideal * 1000, "ideal_link_ms": kvb / link_Bps * 1000,
                        "efficiency": (ideal / xfer) if xfer else None,
                        "efficiency_client": (ideal / client_handoff)
                        if client_handoff and client_handoff > 0 else None,
                    })
                    if tick:
                        tick(None)
    finally:
        d.stop()
        p.stop()
    return {"shape": shape_name, "model_dir": str(folder), "model_shape": shape,
            "kv_bytes_per_token": kv_bytes(shape, 1), "requests": rows, "by_length": _by_length(rows)}


def _by_length(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n in sorted({r["prompt_len"] for r in rows}):
        rs = [r for r in rows if r["prompt_len"] == n]

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float | None:
            vals = [r[key] for r in rs if r[key] is not None]
            return statistics.median(vals) if vals else None

        out.append({"prompt_len": n, "kv_bytes": med("kv_bytes"), "nixl_bytes": med("nixl_bytes"),
                    "nixl_xfer_ms": med("nixl_xfer_ms"), "client_handoff_ms": med("client_handoff_ms"),
                    "ideal_memcpy_ms": med("ideal_memcpy_ms"), "ideal_link_ms": med("ideal_link_ms"),
                    "efficiency": med("efficiency"), "efficiency_client": med("efficiency_client"),
                    "prefill_ms": med("prefill_ms"), "decode_ttft_ms": med("decode_ttft_ms"),
                    "failed_transfers": sum(r["nixl_failed"] for r in rs)})
    return out


def run_handoff(cfg: HandoffConfig, *, link_gbps: float = 1.9, log: Log = print,
                progress: Callable[[str, int], Callable[[Any], None]] | None = None) -> dict[str, Any]:
    started = report.provenance()
    log(f"memcpy bandwidth: copying {cfg.memcpy_mb} MiB buffers")
    mem = measure_memcpy(cfg.memcpy_mb)
    log(f"memcpy: {mem['best_GBps']:.2f} GB/s best, {mem['median_GBps']:.2f} GB/s median")
    shapes = [run_shape(cfg, s, memcpy_Bps=mem["best_GBps"] * 1e9, link_Bps=link_gbps * 1e9, log=log,
                        progress=progress) for s in cfg.shapes]
    out = {"benchmark": "handoff", "config": asdict(cfg), "memcpy": mem,
           "link_bandwidth_GBps": link_gbps, "method": "NIXL transfer time from the decode engine's /metrics "
           "(vllm:nixl_xfer_time_seconds, one transfer per request); client-side: decode TTFT minus one ITL",
           "shapes": shapes}
    out["headline"] = {s["shape"]: {str(r["prompt_len"]): r["efficiency"] for r in s["by_length"]} for s in shapes}
    out["target"] = {"efficiency": 0.5, "prompt_len_min": 2048}
    out["provenance"] = report.provenance(started)
    return out


def plot(path: Path, res: dict[str, Any]) -> Path:
    plt = report._plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for s in res["shapes"]:
        rows = s["by_length"]
        xs = [r["prompt_len"] for r in rows]
        axes[0].plot(xs, [r["nixl_xfer_ms"] for r in rows], "o-", label=f"{s['shape']} NIXL transfer")
        axes[0].plot(xs, [r["ideal_memcpy_ms"] for r in rows], "--", label=f"{s['shape']} ideal (memcpy)")
        axes[1].plot(xs, [r["efficiency"] for r in rows], "o-",
                     label=f"{s['shape']} ({s['kv_bytes_per_token']} B/token)")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("prompt tokens")
    axes[0].set_ylabel("ms")
    axes[0].set_title("KV handoff time")
    axes[1].axhline(0.5, color="grey", linestyle=":", label="target 0.5")
    axes[1].set_xlabel("prompt tokens")
    axes[1].set_ylabel("ideal / measured")
    axes[1].set_title("handoff efficiency")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
