"""Decode-failure recovery on the real P/D stack (Ray Serve LLM, vLLM, NIXL): the decode replica is
SIGKILLed (with its engine) mid-stream; the gateway's resume logic waits out Ray's replacement of the
replica and continues the stream; the client's text equals the undisturbed greedy run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest

from baton.api.gateway.resume import ResumePolicy
from baton.bench.recovery import relay_stream
from baton.core import models as m
from baton.dataplane.spec import DeploymentSpec

from .conftest import NIXL_PORT_BASE

pytestmark = pytest.mark.e2e

APP = "rec"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 20}],
        "max_tokens": 96, "temperature": 0}


def replica_family(title: str) -> list:  # type: ignore[type-arg]
    """Every process whose title names the replica, and their children (the vLLM engine)."""
    psutil = pytest.importorskip("psutil")
    family = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(title in part for part in proc.info["cmdline"] or []):
                family += [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return family


def kill(family: list) -> list[int]:  # type: ignore[type-arg]
    """SIGKILL, at once: the processes were found before the stream started, so the kill lands mid-stream."""
    psutil = pytest.importorskip("psutil")
    killed = []
    for p in family:
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            os.kill(p.pid, signal.SIGKILL)
            killed.append(p.pid)
    return killed


def test_a_killed_decode_replica_does_not_break_the_clients_stream(serve_cluster, tiny_model):
    spec = DeploymentSpec(name=APP, model={"path": str(tiny_model), "served_name": "tiny"}, mode="pd",
                          engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 8},
                          kv={"connector": "nixl", "nixl_port_base": NIXL_PORT_BASE + 300})
    url = serve_cluster.deploy(spec)
    try:
        baseline = asyncio.run(relay_stream(lambda: url, "chat/completions", CHAT))
        assert baseline.outcome.status is m.RequestStatus.COMPLETED and baseline.outcome.recovery_steps == []
        assert baseline.outcome.completion_tokens == 96

        killed: list[int] = []
        family = replica_family(f"ServeReplica:{APP}:Decode")
        run = asyncio.run(relay_stream(
            lambda: url, "chat/completions", CHAT, kill_after=2,
            kill=lambda: killed.extend(kill(family)),
            policy=ResumePolicy(attempts=200, budget_s=400, backoff_s=0.5, backoff_max_s=2.0)))
        print(f"killed {killed}; recovery {run.recovery_ms:.0f} ms; steps {run.outcome.recovery_steps}")
        assert killed, "no decode replica process found"
        o = run.outcome
        assert o.status is m.RequestStatus.COMPLETED, run.raw[-500:]
        assert run.text == baseline.text  # no token lost, repeated or reordered
        assert o.completion_tokens == 96 and o.prompt_tokens == baseline.outcome.prompt_tokens
        assert b"event: error" not in run.raw and run.raw.count(b"[DONE]") == 1
        finishes = [c["finish_reason"] for ev in run.events for c in ev["choices"] if c.get("finish_reason")]
        assert finishes == ["length"] and len({ev["id"] for ev in run.events}) == 1
        assert run.events[-1]["usage"]["completion_tokens"] == 96
        assert o.recovery_steps and o.recovery_steps[-1]["step"] == "decode_resume"
        assert o.recovery_steps[-1]["outcome"] == "recovered"
    finally:
        serve_cluster.delete(APP)
