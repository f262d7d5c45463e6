"""The run's engine slots (:mod:`tests.engine_slots`): a holder keeps others out until it is done, in
another process as in this one, and a request that cannot be served in time goes on without."""

from __future__ import annotations

import subprocess
import sys
import time

from tests import engine_slots as es


def test_slots_are_held_across_processes_and_given_back(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(es, "SLOT_DIR", tmp_path)
    monkeypatch.setattr(es, "SLOTS", 2)
    code = ("import time, sys; sys.path.insert(0, {root!r}); from tests import engine_slots as es; "
            "es.SLOT_DIR = __import__('pathlib').Path({d!r}); es.SLOTS = 2\n"
            "with es.engine_slots(2, 'other'):\n print('held', flush=True); time.sleep(3)")
    other = subprocess.Popen([sys.executable, "-c", code.format(root=str(es.ROOT), d=str(tmp_path))],
                             stdout=subprocess.PIPE, text=True)
    assert other.stdout is not None and other.stdout.readline().strip() == "held"
    with es.engine_slots(1, "late", timeout_s=1) as waited:  # both held elsewhere: gives up after 1 s
        assert waited >= 1
    t0 = time.monotonic()
    with es.engine_slots(1, "patient") as waited:  # served once the other process lets go
        assert waited > 0.5
    assert time.monotonic() - t0 < 10
    other.wait()
    with es.engine_slots(5, "greedy") as waited:  # asks for more than there are: all of them, at once
        assert waited < 1
