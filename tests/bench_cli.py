"""Runs a ``baton bench`` command as a user does (a subprocess of the CLI), for the benchmarks' smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_bench(tmp_path: Path, *args: str, timeout_s: float = 600) -> dict[str, Any]:
    """``baton bench ARGS --out tmp_path/<name>.json``; its result, checked to say where it came from."""
    out = tmp_path / f"{args[0]}.json"
    run = subprocess.run([sys.executable, "-m", "baton.cli.main", "bench", *args, "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout_s)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    prov = result["provenance"]
    assert prov["commit"] and prov["command"][1:3] == ["bench", args[0]] and prov["end"]["time"]
    return result
