"""``baton up`` waits for each process it starts: a process that exits first fails the wait at once, with
the end of its log, instead of running out the wait's whole limit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import typer

from baton.cli.stack import Processes, wait_for


def test_a_process_that_exits_before_it_comes_up_fails_the_wait_at_once(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    procs = Processes(tmp_path)
    procs.start("ray", [sys.executable, "-c", "print('no authentication token was found'); raise SystemExit(1)"])
    with pytest.raises(typer.Exit):
        wait_for("Ray dashboard", lambda: False, 600, interval_s=0.1, process=(procs, "ray"))
    err = capsys.readouterr().err  # the exit's message, not the limit's ("did not come up within")
    assert "exited before it came up" in err and "no authentication token was found" in err


def test_a_process_still_running_is_waited_for(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    pid = procs.start("slow", [sys.executable, "-c", "import time; time.sleep(30)"])
    calls = []
    try:
        wait_for("slow", lambda: len(calls.append(1) or calls) >= 3, 60, interval_s=0.05, process=(procs, "slow"))
        assert not procs.exited("slow")
    finally:
        assert procs.stop("slow")
    # the child that ended on SIGTERM was reaped by the stop (not taken for alive as a zombie until its limit)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_down_stops_a_process_restarted_by_hand_outside_its_own_session(tmp_path: Path) -> None:
    """An operator restarts the gateway from a shell (not a process group of its own) and records its pid:
    ``down`` still stops it."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "gateway.pid").write_text(str(proc.pid))
        procs = Processes(tmp_path)
        assert procs.pid("gateway") == proc.pid
        assert procs.stop("gateway", timeout_s=10)
        assert proc.wait(timeout=10) is not None
    finally:
        proc.kill()
