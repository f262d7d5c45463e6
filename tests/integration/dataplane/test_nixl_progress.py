"""NIXL's progress thread with Baton's wake-up setting, on the real NIXL: two agents in two processes.

Agent A registers a buffer; agent B reads it over UCX (loopback, the CPU profile's transports). Each
process then samples the state of the threads NIXL started (``/proc/self/task/<tid>/stat``): a thread
that busy-polls is runnable in most samples, one that waits on UCX's events is asleep in nearly all.
NIXL's own setting is run as well, so the check is seen to tell a spinning thread from a sleeping one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from typing import Any

import pytest

pytest.importorskip("nixl")
pytest.importorskip("vllm")

SIZE = 1 << 20
SAMPLES = 200


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _runnable_fraction(tids: set[int]) -> float:
    """Fraction of samples in which any of ``tids`` was runnable, sampled for about a second."""
    me = threading.get_native_id()
    hits = 0
    for _ in range(SAMPLES):
        for tid in tids - {me}:
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                continue
            if state == "R":
                hits += 1
                break
        time.sleep(0.005)
    return hits / SAMPLES


def _agent(name: str, wakeup_ms: float | None) -> tuple[Any, set[int]]:
    from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config

    from baton.dataplane.nixl_progress import progress_wakeup

    before = _threads()
    with progress_wakeup(wakeup_ms):
        agent = NixlWrapper(name, nixl_agent_config(num_threads=4, capture_telemetry=True))
    return agent, _threads() - before


def _holder(wakeup_ms: float | None, to_reader: Any, from_reader: Any, out: Any) -> None:
    import torch

    agent, tids = _agent("holder", wakeup_ms)
    buf = torch.arange(SIZE // 4, dtype=torch.float32)
    agent.register_memory(buf)
    to_reader.put((agent.get_agent_metadata(), agent.get_serialized_descs(agent.get_xfer_descs(buf))))
    agent.add_remote_agent(from_reader.get())
    assert from_reader.get() == "read"
    out.put(("holder", _runnable_fraction(tids)))
    from_reader.get()  # the reader is done sampling too


def _reader(wakeup_ms: float | None, from_holder: Any, to_holder: Any, out: Any) -> None:
    import torch

    agent, tids = _agent("reader", wakeup_ms)
    buf = torch.zeros(SIZE // 4, dtype=torch.float32)
    agent.register_memory(buf)
    meta, descs = from_holder.get()
    peer = agent.add_remote_agent(meta)
    to_holder.put(agent.get_agent_metadata())
    handle = agent.initialize_xfer("READ", agent.get_xfer_descs(buf), agent.deserialize_descs(descs), peer, b"done")
    state = agent.transfer(handle)
    deadline = time.monotonic() + 60
    while state != "DONE" and time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
        assert state != "ERR"
    agent.release_xfer_handle(handle)
    out.put(("read", state == "DONE" and bool(torch.equal(buf, torch.arange(SIZE // 4, dtype=torch.float32)))))
    to_holder.put("read")
    out.put(("reader", _runnable_fraction(tids)))
    to_holder.put("done")


def _run_pair(wakeup_ms: float | None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    a_to_b, b_to_a, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    env = {"UCX_NET_DEVICES": "lo", "UCX_TLS": "tcp,self,sm"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        procs = [ctx.Process(target=_holder, args=(wakeup_ms, a_to_b, b_to_a, out)),
                 ctx.Process(target=_reader, args=(wakeup_ms, a_to_b, b_to_a, out))]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=180) for _ in range(3))
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        return results
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_agents_with_a_wakeup_period_move_the_bytes_and_sleep_between_events() -> None:
    r = _run_pair(10.0)
    assert r["read"] is True
    assert r["holder"] < 0.2, r
    assert r["reader"] < 0.2, r


def test_nixl_default_progress_thread_busy_polls() -> None:
    """The same pair with NIXL's own setting: the check above would catch a spinning thread."""
    r = _run_pair(None)
    assert r["read"] is True
    assert r["holder"] > 0.5 or r["reader"] > 0.5, r
