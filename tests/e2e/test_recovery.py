"""The recovery ladder on the real stack, through the gateway process ``baton up`` runs (``baton gateway run``).

The default topology: one prefill and one decode replica of a P/D deployment (Ray Serve LLM, vLLM, NIXL,
LMCache with a dedicated ``redis-server`` as its remote tier): the session's fault stack, shared with the
chaos drills (:func:`tests.shared_stack.fault_stack`). The gateway routes to the decode pool with the
prefill pool as its fallback, as a deployed route does. Each test kills or takes down a real part
with real signals and judges what the client received against an undisturbed greedy run of the same
prompt, and the request record's steps against the rung that must have served:

- decode replica SIGKILLed mid-stream: the rest of the stream comes from the prefill engine at once
  (``aggregated_fallback``), not after Ray replaced the replica;
- prefill replica SIGKILLed during a long prefill: the decode replica prefills locally (``local_prefill``).
  The kill is timed from an undisturbed prompt of the same length on the same stack (a quarter of its TTFT
  after sending), so it lands inside the prefill however fast the machine is (a fixed 80 ms came after a
  105 ms TTFT on a fast machine);
- the LMCache Redis tier down: served as before, nothing fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.e2e


def _family(title: str) -> list[int]:
    """Pids of every process whose title names the replica, and of their children (its vLLM engine)."""
    psutil = pytest.importorskip("psutil")
    pids: list[int] = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(title in part for part in proc.info["cmdline"] or []):
                pids += [proc.pid, *(c.pid for c in proc.children(recursive=True))]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return pids


def _kill(pids: list[int]) -> list[int]:
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def _wait_replaced(app: str, title: str, victims: list[int], timeout_s: float = 900) -> None:
    """Until Ray runs a new replica of the pool (a process not among the victims, with its engine) and
    Serve reports the app healthy again: Serve's status alone still says healthy right after a kill."""
    from ray import serve

    from baton.bench.chaos.faults import gone

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fresh = [pid for pid in _family(title) if pid not in victims]
        status = serve.status().applications.get(app)
        if (all(gone(pid) for pid in victims) and len(fresh) >= 2 and status is not None
                and status.status == "RUNNING" and all(d.status == "HEALTHY" for d in status.deployments.values())):
            return
        time.sleep(2)
    raise TimeoutError(f"{title}: no replacement running after {timeout_s:.0f} s")


@pytest.fixture
def stack(fault_stack):  # type: ignore[no-untyped-def]
    """The session's fault stack (:func:`tests.shared_stack.fault_stack`)."""
    return fault_stack


def _stream(ep: Any, prompt: list[int], max_tokens: int, **kw: Any) -> Any:
    from baton.bench.recovery import stream

    with httpx.Client(timeout=300, trust_env=False) as client:
        return stream(client, ep, prompt, max_tokens, **kw)


def _steps(ep: Any, request_id: str | None) -> tuple[str | None, list[tuple[str, str]]]:
    status, steps = _step_details(ep, request_id)
    return status, [(step, outcome) for step, outcome, _ in steps]


def _step_details(ep: Any, request_id: str | None) -> tuple[str | None, list[tuple[str, str, str]]]:
    from baton.bench.recovery import _record

    rec = _record(ep.db, request_id) or {}
    return rec.get("status"), [(s.get("step"), s.get("outcome"), s.get("detail") or "")
                               for s in rec.get("recovery_steps", [])]


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def test_a_decode_kill_mid_stream_goes_on_on_the_prefill_engine_at_once(stack) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(600, seed=1)
    reference = _stream(stack, prompt, 200)
    assert reference.finished and len(reference.ids) == 200

    victims = _family(f"ServeReplica:{stack.app}:Decode")
    assert victims, "no decode replica process found"
    killed: list[int] = []

    def on_token(s: Any) -> None:
        if s.kill_pc is None and len(s.ids) >= 30:
            killed.extend(_kill(victims))
            s.kill_pc = time.perf_counter()

    run = _stream(stack, prompt, 200, on_token=on_token)
    assert killed
    assert run.status == 200 and run.error is None and run.finished
    assert run.ids == reference.ids  # no token lost, repeated or reordered
    status, steps = _steps(stack, run.request_id)
    print("decode kill:", steps)
    assert status == "completed"
    # served by the live prefill engine, not by a replacement Ray had to start
    assert ("aggregated_fallback", "recovered") in steps and ("decode_resume", "recovered") in steps
    _wait_replaced(stack.app, f"ServeReplica:{stack.app}:Decode", victims)


def test_a_prefill_kill_during_a_long_prefill_is_prefilled_on_the_decode_side(stack) -> None:  # type: ignore[no-untyped-def]
    assert _stream(stack, _prompt(64, seed=9), 4).finished  # both pools serve
    victims = _family(f"ServeReplica:{stack.app}.prefill:Prefill")
    assert victims, "no prefill replica process found"
    prompt = _prompt(1800, seed=2)  # four 512-token engine steps
    calibration = _stream(stack, _prompt(1800, seed=12), 1)  # another prompt: no prefix of it is cached
    assert calibration.ttft_ms is not None
    delay_s = calibration.ttft_ms / 4000  # a quarter of a whole prefill's time in
    killed: dict[str, Any] = {}

    def killer(t0: float) -> None:
        time.sleep(delay_s)
        killed["pids"] = _kill(victims)
        killed["at"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    thread = threading.Thread(target=killer, args=(t0,))
    thread.start()
    run = _stream(stack, prompt, 32)
    thread.join()
    assert killed["pids"]
    assert run.ttft_ms is not None and killed["at"] * 1000 < run.ttft_ms, "the kill came after the first token"
    status, details = _step_details(stack, run.request_id)
    steps = [(step, outcome) for step, outcome, _ in details]
    print("prefill kill at", round(killed["at"] * 1000), "ms (an undisturbed TTFT", round(calibration.ttft_ms),
          "ms); TTFT", round(run.ttft_ms), "ms;", details)
    assert status == "completed" and run.finished and len(run.ids) == 32
    assert ("local_prefill", "recovered") in steps or ("prefill_retry", "recovered") in steps
    # The ladder learned of the death from the pool (its live replicas), not by waiting out its timeout.
    assert not [d for _, _, d in details if "did not answer within" in d], details
    reference = _stream(stack, prompt, 32)  # the same prompt, undisturbed
    assert run.ids == reference.ids
    _wait_replaced(f"{stack.app}.prefill", f"ServeReplica:{stack.app}.prefill:Prefill", victims)


def test_the_redis_tier_down_is_skipped_and_costs_no_request(stack) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(700, seed=3)
    reference = _stream(stack, prompt, 24)
    fired, evidence = stack.redis_tier.down()
    assert fired, evidence
    try:
        for seed in (3, 4):  # the stored prefix, and a new prompt whose KV cannot be stored
            p = _prompt(700, seed=seed)
            run = _stream(stack, p, 24)
            status, steps = _steps(stack, run.request_id)
            assert run.status == 200 and run.finished and run.error is None and status == "completed", steps
            assert not [s for s in steps if s[1] == "failed"]
            if seed == 3:
                assert run.ids == reference.ids
    finally:
        stack.redis_tier.start()
