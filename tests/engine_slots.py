"""Engines started beside the session's shared stack, counted across the run's pytest processes (the main
run and the lane, :mod:`tests.stages`), so that together they never hold more than the machine's memory.

Each vLLM engine on the CPU holds gigabytes with its Serve replica, and the shared stack's engines, Ray,
Postgres and the pytest processes already hold much of the machine's memory. Ray's memory monitor kills a worker
(a Serve replica: its app's route answers 404 until the replica is back) once the node passes 95%, so a
module that starts engines of its own takes that many *slots* first (:func:`engine_slots`), and holds
them until its engines are gone: ``BATON_TEST_ENGINE_SLOTS`` (3) engines beside the stack at most.

Slots are ``flock`` locks on files under ``var/test-slots`` (a process that dies gives its slots back).
A request takes a guard lock first and keeps it until it holds all it asked for, so a module that needs
three slots is not starved by modules that need one; a request still unserved after ``timeout_s`` goes
on without (and says so): a slow run is better than a hung one."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLOTS = int(os.environ.get("BATON_TEST_ENGINE_SLOTS", "3"))
SLOT_DIR = ROOT / "var" / "test-slots"


def _try(path: Path) -> IO[str] | None:
    f = path.open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


@contextmanager
def engine_slots(n: int, who: str, *, timeout_s: float = 1800.0) -> Iterator[float]:
    """Holds ``n`` of the run's engine slots (at most all of them) while the block runs; yields how long it
    waited for them (seconds)."""
    n = max(0, min(n, SLOTS))
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    held: list[IO[str]] = []
    started = time.monotonic()
    with (SLOT_DIR / "guard").open("a+") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one request fills at a time: the first in line is served first
        try:
            while len(held) < n:
                for i in range(SLOTS):
                    if len(held) == n:
                        break
                    f = _try(SLOT_DIR / f"slot-{i}")
                    if f is not None:
                        held.append(f)
                if len(held) < n:
                    if time.monotonic() - started > timeout_s:
                        print(f"engine slots: {who} goes on with {len(held)} of {n} after {timeout_s:.0f} s",
                              file=sys.stderr)
                        break
                    time.sleep(0.5)
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
    waited = time.monotonic() - started
    if waited > 1:
        print(f"engine slots: {who} waited {waited:.0f} s for {n}", file=sys.stderr)
    try:
        yield waited
    finally:
        for f in held:
            f.close()  # closing the file gives its lock back


def slots_fixture(n: int) -> Any:
    """A module-scoped fixture that holds ``n`` slots: name it first among an engine fixture's parameters
    (``engine_room = slots_fixture(2)``), and the slots are taken before its engines start and given back
    after they stop."""

    @pytest.fixture(scope="module")
    def engine_room(request: pytest.FixtureRequest) -> Iterator[float]:
        with engine_slots(n, request.module.__name__) as waited:
            yield waited

    return engine_room
