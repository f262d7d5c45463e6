"""``baton bench idle``: CPU of every process of the running ``baton up`` stack while no request is in flight.

The stack's processes are found from outside: every process whose environment carries the stack's
``BATON_STACK`` mark (the Ray head and all it starts: raylet, GCS, dashboard, Serve controller, HAProxy,
replicas, vLLM engines) and the gateway and worker of ``var/run``. After ``settle_s`` without traffic,
each one's CPU time is read twice, ``duration_s`` apart (psutil); the figure is the share of one core.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from baton.bench import report

#: The idle targets (docs/architecture.md) (share of one core).
ENGINE_TARGET = 0.05
STACK_TARGET = 0.25


def stack_processes(state_dir: Path) -> list[Any]:
    import psutil

    from baton.bench.procs import marked_processes

    run = state_dir / "run"
    found: dict[int, Any] = {}
    for name in ("gateway", "worker"):
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            root = psutil.Process(int((run / f"{name}.pid").read_text().strip()))
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
    for p in marked_processes(str(run.resolve())):
        found[p.pid] = p
    return list(found.values())


def _title(p: Any) -> str:
    """Ray's and vLLM's process titles; ``python <script>`` for other Python processes."""
    with contextlib.suppress(Exception):
        argv: list[str] = p.cmdline()
        if argv and Path(argv[0]).name.startswith("python") and len(argv) > 1:
            rest = argv[2] if argv[1] in ("-m", "-u") and len(argv) > 2 else argv[1]
            return f"python {Path(rest).name}"
        return argv[0] if argv else str(p.name())
    return "?"


def measure(state_dir: Path, *, settle_s: float = 10.0, duration_s: float = 10.0) -> dict[str, Any]:
    import psutil

    started = report.provenance()
    time.sleep(settle_s)
    procs = stack_processes(state_dir)
    if not procs:
        raise RuntimeError(f"no process of a `baton up` stack under {state_dir} (is it running?)")
    before: dict[int, float] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            before[p.pid] = sum(p.cpu_times()[:2])
    t0 = time.monotonic()
    time.sleep(duration_s)
    elapsed = time.monotonic() - t0
    rows = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.pid in before:
                share = (sum(p.cpu_times()[:2]) - before[p.pid]) / elapsed
                rows.append({"pid": p.pid, "process": _title(p), "core_share": round(share, 4)})
    rows.sort(key=lambda r: -r["core_share"])
    engines = [r for r in rows if r["process"].startswith("VLLM::")]
    total = sum(r["core_share"] for r in rows)
    worst = max((r["core_share"] for r in engines), default=None)
    return {
        "benchmark": "idle", "settle_s": settle_s, "duration_s": round(elapsed, 2), "processes": rows,
        "engines": len(engines), "stack_core_share": round(total, 4), "max_engine_core_share": worst,
        "targets": {
            "engine_core_share": {"measured": worst, "target": ENGINE_TARGET,
                                  "met": None if worst is None else worst <= ENGINE_TARGET},
            "stack_core_share": {"measured": round(total, 4), "target": STACK_TARGET, "met": total <= STACK_TARGET},
        },
        "provenance": report.provenance(started),
    }
