"""Finding and ending the processes of a Ray head that Baton started, by the mark in their environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psutil

from baton.bench.procs import STACK_MARK, kill_marked, marked_processes

SLEEPER = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]


def _start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    # a session of its own and SIGTERM ignored: what an orphaned engine looks like to its owner
    return subprocess.Popen(SLEEPER, env={**os.environ, **env}, start_new_session=True)


def test_kill_marked_ends_every_process_of_the_mark_and_nothing_else() -> None:
    mark = f"/tmp/baton-test-{uuid.uuid4().hex}"
    marked = [_start({STACK_MARK: mark}) for _ in range(2)]
    other = _start({STACK_MARK: mark + "-other"})
    unmarked = _start({})
    try:
        deadline = time.monotonic() + 10
        while len(marked_processes(mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(p.pid for p in marked_processes(mark)) == sorted(p.pid for p in marked)

        assert kill_marked(mark, grace_s=0.5) == 2  # SIGTERM is ignored: SIGKILL after the grace
        for p in marked:
            p.wait(10)  # kill_marked reaped them already (psutil waits on its children)
            assert not psutil.pid_exists(p.pid)
        assert other.poll() is None and unmarked.poll() is None
        assert marked_processes(mark) == []
        assert kill_marked(mark) == 0
    finally:
        for p in (*marked, other, unmarked):
            p.kill()
            p.wait()
