"""The prefill side of the recovery ladder (`baton.dataplane.recovery.orchestrate`) and what the
renderer sets for it. The Ray handle here is a fake with the calls the orchestrator makes
(`.remote(...)` -> an async iterator with `cancel()`); the real stack runs in tests/e2e."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest

pytest.importorskip("ray")

from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest, ErrorResponse

from baton.core.contracts import PhasesFact, RecoveryStepsFact, ReplicaEnv
from baton.dataplane import pd, recovery
from baton.dataplane.recovery import PrefillPolicy, orchestrate
from baton.dataplane.render import kv_transfer_config, render_llm_config
from baton.dataplane.spec import DeploymentSpec

FAST = PrefillPolicy(timeout_s=0.2, attempts=3, backoff_s=0.0)


class _Gen:
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.cancelled = False

    def __aiter__(self) -> _Gen:
        return self

    async def __anext__(self) -> Any:
        if self.behaviour == "die":
            raise RuntimeError("ActorDiedError")  # what a dead replica's call raises (any exception)
        if self.behaviour == "hang":
            await asyncio.Event().wait()
        if self.behaviour == "held":  # Serve's router holds the call: its replica died, a new one is far off
            await asyncio.sleep(0.03)
            self.on_held()
            await asyncio.Event().wait()
        if self.behaviour == "503":
            return recovery.unavailable("engine dead")
        if self.behaviour == "400":
            from vllm.entrypoints.serve.engine.protocol import ErrorInfo

            return ErrorResponse(error=ErrorInfo(message="bad", type="BadRequestError", code=400))
        return {"prefilled": True}

    def cancel(self) -> None:
        self.cancelled = True


class _Method:
    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.calls: list[_Gen] = []

    on_die: Any = None  # Ray drops a replica from its router once a call to it fails with the actor dead

    def remote(self, request: Any, raw: Any) -> _Gen:
        gen = _Gen(self.script.pop(0) if self.script else "ok")
        gen.on_held = self.on_die or (lambda: None)  # type: ignore[attr-defined]
        self.calls.append(gen)
        if gen.behaviour == "die" and self.on_die is not None:
            self.on_die()
        return gen


class _Backend:
    requires_peer_binding = False
    concurrent_handoff = False

    def prepare_prefill_request(self, *, request: Any, peer: Any) -> Any:
        return request

    def prepare_decode_request(self, *, request: Any, peer: Any, prefill_response: Any) -> Any:
        return ("decode-with-remote-kv", request)


class _Router:
    """What the ladder reads of Ray's router: whether it knows the replicas, and which are alive."""

    def __init__(self, live: int) -> None:
        self.request_router = type("RR", (), {"curr_replicas": {f"r{i}": object() for i in range(live)}})()

    def running_replicas_populated(self) -> bool:
        return True


class _Server:
    def __init__(self, script: list[str], live: int | None = None) -> None:
        self.method = _Method(script)
        self._prefill_handle = type("H", (), {"completions": self.method, "options": lambda s, **k: s})()
        if live is not None:
            self._prefill_handle._router = self.router = _Router(live)
            self.method.on_die = self.router.request_router.curr_replicas.popitem

    def _get_connector_backend(self) -> _Backend:
        return _Backend()

    def _request_prefill_token_ids(self, request: Any) -> None:
        pass

    def _decode_reuse_ids(self, chunk: Any) -> None:
        return None


async def _fallback(request: Any, raw: Any):  # type: ignore[no-untyped-def]
    raise AssertionError("Ray's flow is not used for the default connector path")
    yield


def _run(script: list[str], policy: PrefillPolicy = FAST,
         live: int | None = None) -> tuple[list[Any], list[Any], _Server, list[dict]]:
    """Runs the ladder; returns its output, what the decode engine was given, the server, and the facts
    written (``{"id": ..., field: JSON}`` each, awaited or spawned alike, in order)."""
    server = _Server(script, live)
    decoded: list[Any] = []
    facts: list[dict] = []

    async def local(method: str, req: Any, raw: Any):  # type: ignore[no-untyped-def]
        decoded.append(req)

        async def gen():  # type: ignore[no-untyped-def]
            yield "tok-1"
            yield "tok-2"

        return gen()

    async def record(rid: Any, fact: Any) -> None:
        facts.append({"id": rid, fact.FIELD.value: fact.to_json()})

    def spawn(rid: Any, fact: Any) -> None:
        facts.append({"id": rid, fact.FIELD.value: fact.to_json()})

    request = CompletionRequest(model="m", prompt="hi", max_tokens=4)
    raw = type("Raw", (), {"headers": {"x-request-id": "abc123"}})()

    async def main() -> list[Any]:
        return [c async for c in orchestrate(server, request, raw, _fallback, local, policy=policy)]

    original = recovery.record_fact, recovery.spawn_fact
    recovery.record_fact, recovery.spawn_fact = record, spawn  # type: ignore[assignment]
    try:
        out = asyncio.run(main())
    finally:
        recovery.record_fact, recovery.spawn_fact = original  # type: ignore[assignment]
    return out, decoded, server, facts


def _steps(facts: list[dict]) -> list[tuple[str, str]]:
    written = [f["recovery_steps"] for f in facts if "recovery_steps" in f]
    return [(s["step"], s["outcome"]) for s in written[-1]] if written else []


def _phases(facts: list[dict]) -> PhasesFact:
    (written,) = [f["phases"] for f in facts if "phases" in f]  # once per request
    return PhasesFact.from_json(written)


def _recorded_steps(facts: list[dict]) -> list[dict]:
    written = [f["recovery_steps"] for f in facts if "recovery_steps" in f]
    return RecoveryStepsFact.from_json(written[-1]).to_json() if written else []


def test_a_healthy_prefill_takes_no_step() -> None:
    out, decoded, server, facts = _run([])
    assert out == ["tok-1", "tok-2"] and decoded[0][0] == "decode-with-remote-kv"
    assert len(server.method.calls) == 1 and _steps(facts) == []
    phases = _phases(facts)  # measured: one prefill call, then the handoff to the first token
    assert [(p.phase, p.outcome, p.attempt) for p in phases.phases] == [
        ("remote_prefill", "ok", 1), ("kv_handoff", "ok", None)]
    prefill, handoff = phases.phases
    assert 0 <= prefill.start_ms <= prefill.end_ms <= handoff.start_ms and handoff.duration_ms >= 0
    assert phases.received_unix > 0 and facts[-1]["id"] == "abc123"


@pytest.mark.parametrize("failure", ["die", "hang", "503"])
def test_a_failed_or_silent_prefill_is_retried(failure: str) -> None:
    out, decoded, server, facts = _run([failure])
    assert out == ["tok-1", "tok-2"] and decoded[0][0] == "decode-with-remote-kv"
    assert len(server.method.calls) == 2 and server.method.calls[0].cancelled
    assert _steps(facts) == [("prefill_retry", "recovered")] and facts[0]["id"] == "abc123"


def test_when_every_prefill_fails_the_decode_side_prefills_locally() -> None:
    out, decoded, _server, facts = _run(["die", "hang", "503"])
    assert out == ["tok-1", "tok-2"]
    assert not isinstance(decoded[0], tuple)  # the original request, no remote KV params
    assert _steps(facts) == [("prefill_retry", "failed"), ("prefill_retry", "failed"), ("local_prefill", "recovered")]
    assert [(p.phase, p.outcome, p.attempt) for p in _phases(facts).phases] == [
        ("remote_prefill", "failed", 1), ("remote_prefill", "failed", 2), ("remote_prefill", "failed", 3),
        ("local_prefill", "ok", None)]
    assert _recorded_steps(facts) == facts[-2]["recovery_steps"]  # the steps' JSON is the contract's


def test_with_no_live_prefill_replica_the_decode_side_prefills_at_once() -> None:
    out, decoded, server, facts = _run(["ok"], live=0)
    assert out == ["tok-1", "tok-2"] and not isinstance(decoded[0], tuple)
    assert server.method.calls == []  # no call that would wait for Ray to replace the pool
    assert _steps(facts) == [("local_prefill", "recovered")]
    assert "no live prefill replica" in _recorded_steps(facts)[0]["detail"]
    assert [p.phase for p in _phases(facts).phases] == ["local_prefill"]  # no remote call was made


def test_a_dead_only_replica_is_not_retried_the_decode_side_prefills() -> None:
    out, decoded, server, facts = _run(["die", "ok"], live=1)
    assert out == ["tok-1", "tok-2"] and not isinstance(decoded[0], tuple)
    assert len(server.method.calls) == 1
    assert _steps(facts) == [("local_prefill", "recovered")]


def test_a_call_held_while_the_only_replica_dies_ends_at_once_not_at_the_timeout() -> None:
    """A prefill replica SIGKILLed mid-prefill: Serve's router keeps the call for a replacement instead of
    failing it, so only the pool's live replicas say it is gone (the call waited out the 10 s timeout)."""
    slow = PrefillPolicy(timeout_s=30.0, attempts=3, backoff_s=0.0)
    import time

    t0 = time.perf_counter()
    out, decoded, server, facts = _run(["held", "ok"], policy=slow, live=1)
    assert time.perf_counter() - t0 < 5  # far from the 30 s timeout: the pool's death ended the wait
    assert out == ["tok-1", "tok-2"] and not isinstance(decoded[0], tuple)
    assert len(server.method.calls) == 1 and server.method.calls[0].cancelled
    assert _steps(facts) == [("local_prefill", "recovered")]
    assert "lost its last live replica" in _recorded_steps(facts)[0]["detail"]


def test_a_stalled_only_replica_is_not_asked_again_but_one_of_two_is() -> None:
    _, _, server, facts = _run(["hang", "ok"], live=1)
    assert len(server.method.calls) == 1 and _steps(facts) == [("local_prefill", "recovered")]
    _, decoded, server, facts = _run(["hang", "ok"], live=2)
    assert len(server.method.calls) == 2 and decoded[0][0] == "decode-with-remote-kv"
    assert _steps(facts) == [("prefill_retry", "recovered")]


def test_without_local_prefill_the_ladder_ends_in_503() -> None:
    out, decoded, _, facts = _run(["die"] * 3, PrefillPolicy(timeout_s=0.2, attempts=3, backoff_s=0,
                                                              local_prefill=False))
    assert len(out) == 1 and isinstance(out[0], ErrorResponse) and out[0].error.code == 503 and decoded == []
    assert _steps(facts)[-1] == ("local_prefill", "failed")
    # the ladder gave up: the attempts it made are still measured
    assert [(p.phase, p.outcome) for p in _phases(facts).phases] == [("remote_prefill", "failed")] * 3


def test_a_client_error_from_prefill_is_not_retried() -> None:
    out, decoded, server, _ = _run(["400"])
    assert out[0].error.code == 400 and len(server.method.calls) == 1 and decoded == []


def test_policy_from_env() -> None:
    p = ReplicaEnv.from_environ({"BATON_PREFILL_TIMEOUT_S": "2.5", "BATON_PREFILL_ATTEMPTS": "5",
                                 "BATON_LOCAL_PREFILL": "0", "BATON_PREFILL_BACKOFF_S": "junk"}).prefill
    assert (p.timeout_s, p.attempts, p.local_prefill, p.backoff_s) == (2.5, 5, False, 0.2)


def _spec(**kv: Any) -> DeploymentSpec:
    return DeploymentSpec(name="d", model={"path": "/m", "served_name": "m"}, mode="pd", kv=kv)


def test_kv_load_failures_recompute_on_every_connector() -> None:
    from vllm.config.kv_transfer import KVTransferConfig

    nixl = kv_transfer_config(_spec(connector="nixl"), "decode")
    both = kv_transfer_config(_spec(connector="nixl", lmcache={"local_cpu_gib": 0.25}), "prefill")
    assert nixl is not None and both is not None
    assert nixl["kv_load_failure_policy"] == "recompute" and both["kv_load_failure_policy"] == "recompute"
    assert all(c["kv_load_failure_policy"] == "recompute" for c in both["kv_connector_extra_config"]["connectors"])
    assert KVTransferConfig(**both).kv_load_failure_policy == "recompute"  # vLLM accepts the rendered config
    env = render_llm_config(_spec(connector="nixl"), "decode")["runtime_env"]["env_vars"]
    assert env["BATON_PREFILL_TIMEOUT_S"] and env["BATON_LOCAL_PREFILL"] == "1"


# -- a client's hang-up ---------------------------------------------------------------------------
# When a replica runs Baton's code on its own event loop (Serve's throughput-optimized preset), a client
# that goes away is signalled by throwing ``CancelledError`` in at the decode server's ``yield``. Each
# generator under it must then close the one it iterates, down to the engine's stream (where vLLM aborts
# the request): an abandoned stream is closed only when the garbage collector frees it, and the exception
# the tracing layer held put it in a reference cycle, so the engine kept decoding to ``max_tokens``
# (`tests/e2e/test_pd_kv_lifecycle.py` saw it on the real stack). The garbage collector is off in
# these tests, so only an explicit close passes.


class _Engine:
    """The engine's stream: endless tokens; ``closed`` once its generator is closed (where vLLM aborts)."""

    def __init__(self) -> None:
        self.sent = 0
        self.closed = False

    async def stream(self) -> AsyncGenerator[str, None]:
        try:
            while True:
                await asyncio.sleep(0)
                self.sent += 1
                yield f"tok-{self.sent}"
        finally:
            self.closed = True


@pytest.fixture
def _no_gc() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _hang_up(gen: AsyncGenerator[Any, None], engine: _Engine, after: int) -> list[Any]:
    """Serve's hang-up with Baton's code on the replica's loop: ``after`` chunks, then ``CancelledError``
    thrown in at the ``yield`` (``ray.serve``'s ``_call_generator_async``). The engine's stream must be
    closed by then, before the loop runs anything else (a stream freed by reference counting is only
    scheduled for closing, and ``asyncio.run`` closes every generator left when it ends)."""
    got = [await gen.__anext__() for _ in range(after)]
    with pytest.raises(asyncio.CancelledError):
        await gen.athrow(asyncio.CancelledError())
    assert engine.closed and engine.sent == after
    return got


@pytest.fixture
def facts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    written: list[Any] = []

    async def record(rid: Any, fact: Any) -> None:
        written.append(fact)

    monkeypatch.setattr(recovery, "record_fact", record)
    monkeypatch.setattr(recovery, "spawn_fact", lambda rid, fact: written.append(fact))
    return written


@pytest.mark.parametrize("prefill", ["remote", "local"])
def test_a_hang_up_closes_the_engines_stream_on_both_ladder_paths(prefill: str, facts: list[Any], _no_gc: None) -> None:
    engine = _Engine()
    # "die" three times: no prefill replica answers, the decode side prefills itself
    server = _Server(["ok"] if prefill == "remote" else ["die", "die", "die"])

    async def local(method: str, req: Any, raw: Any) -> AsyncGenerator[str, None]:
        return engine.stream()

    async def main() -> list[Any]:
        request = CompletionRequest(model="m", prompt="hi", max_tokens=1000)
        raw = type("Raw", (), {"headers": {"x-request-id": "abc123"}})()
        return await _hang_up(orchestrate(server, request, raw, _fallback, local, policy=FAST), engine, after=3)

    assert asyncio.run(main()) == ["tok-1", "tok-2", "tok-3"]


@pytest.mark.parametrize("tracing", [True, False])
def test_a_hang_up_closes_the_engines_stream_through_the_tracing_layer(tracing: bool, monkeypatch: pytest.MonkeyPatch,
                                                                     _no_gc: None) -> None:
    engine = _Engine()

    class Trace:
        decode = None  # no decode span: nothing per chunk

    class Server:
        error: BaseException | None = None

        def _baton_replica(self) -> str:
            return "replica-1"

        def _baton_finish(self, rt: Any, error: BaseException | None) -> None:
            self.error = error

    monkeypatch.setattr(pd.dp_tracing, "begin", lambda raw, replica: Trace() if tracing else None)
    server = Server()
    traced = pd.BatonPDDecodeServer._traced(server, engine.stream(), None)  # type: ignore[arg-type]
    assert asyncio.run(_hang_up(traced, engine, after=2)) == ["tok-1", "tok-2"]
    assert isinstance(server.error, asyncio.CancelledError) == tracing  # the span ends as cancelled
