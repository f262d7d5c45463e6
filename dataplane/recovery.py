"""The prefill side of the recovery ladder, run by the P/D decode server before the first token.

1. Remote prefill (Ray's flow: the prompt with ``max_tokens=1`` and the connector's
   ``kv_transfer_params`` to a prefill replica). A call that raises (the replica died: Ray actor
   errors), answers with a server error, or does not answer within the policy's timeout is retried,
   the policy's attempts in all with exponential backoff (:class:`~baton.core.contracts.PrefillPolicy`,
   read from the replica's environment: :class:`~baton.core.contracts.ReplicaEnv`); Ray Serve's router
   sends a retry to a live replica.
2. Then the decode replica prefills locally (the request on its own engine without remote KV
   params), unless the policy turns local prefill off.
3. Then 503 (the gateway's own budget may retry the whole request).

The rung is chosen from live health, never by waiting for Ray to replace a replica: the handle's
router knows which prefill replicas are alive (Ray drops a replica from it as soon as a call to it
fails with the actor dead). With none alive the request goes to rung 2 at once (before the first
attempt, or instead of a retry); a retry after a timeout needs another live replica than the one
that did not answer (with a single replica, the retry would wait on the same stalled engine).

Each step taken is a :class:`~baton.core.contracts.RecoveryStep` (``prefill_retry``, ``local_prefill``),
written as the request's ``recovery_steps`` fact for the gateway (:mod:`baton.dataplane.facts`) before the
decode starts. What the ladder measured (each remote prefill call, the KV handoff from submitting the
decode request to its first token, a local prefill) is the request's ``phases`` fact
(:class:`~baton.core.contracts.PhasesFact`), written in the background once the first token is out or the
ladder has given up: the console draws the request's waterfall from it. A client error from the prefill
engine (4xx) is passed on at once: retrying cannot change it. Connectors that bind a peer before
dispatch or hand off concurrently, and multiplexed (LoRA) requests, keep Ray's own flow (no phases).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from baton.core.contracts import (
    PHASE_KV_HANDOFF,
    PHASE_LOCAL_PREFILL,
    PHASE_REMOTE_PREFILL,
    REQUEST_ID_HEADER,
    STEP_LOCAL_PREFILL,
    STEP_PREFILL_RETRY,
    Phase,
    PhaseName,
    PhaseOutcome,
    PhasesFact,
    PrefillPolicy,
    RecoveryStep,
    RecoveryStepsFact,
    ReplicaEnv,
    StepName,
    StepOutcome,
)
from baton.dataplane.facts import record_fact, spawn_fact

log = logging.getLogger(__name__)


class LadderRecord:
    """What the ladder did for one request: its recovery steps and its measured phases, timed from the
    moment the decode server took the request up (``perf_counter`` and wall clock read together)."""

    def __init__(self, request_id: str | None) -> None:
        self.request_id = request_id
        self.start = time.perf_counter()
        self.received_unix = time.time()
        self.items: list[RecoveryStep] = []
        self.phases: list[Phase] = []
        self._phases_posted = False

    def add(self, name: StepName, started_pc: float, outcome: StepOutcome, detail: str) -> None:
        self.items.append(RecoveryStep.timed(name, origin_pc=self.start, started_pc=started_pc,
                                             now_pc=time.perf_counter(), outcome=outcome, detail=detail))

    def phase(self, name: PhaseName, started_pc: float, outcome: PhaseOutcome = "ok", *,
              attempt: int | None = None, detail: str = "") -> None:
        self.phases.append(Phase(name, round((started_pc - self.start) * 1000, 3),
                                 round((time.perf_counter() - started_pc) * 1000, 3), outcome, attempt, detail[:200]))

    async def record_steps(self) -> None:
        await record_fact(self.request_id, RecoveryStepsFact(tuple(self.items)))

    def post_phases(self) -> None:
        """Writes the phases fact once, in the background (never delays a token)."""
        if not self._phases_posted and self.phases:
            self._phases_posted = True
            spawn_fact(self.request_id, PhasesFact(round(self.received_unix, 6), tuple(self.phases)))


def _error_code(chunk: Any) -> int | None:
    err = getattr(chunk, "error", None)
    code = getattr(err, "code", None)
    return code if isinstance(code, int) else None


def _is_error(chunk: Any) -> bool:
    return type(chunk).__name__ == "ErrorResponse" or _error_code(chunk) is not None


def unavailable(message: str) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo

    return ErrorResponse(error=ErrorInfo(message=message, type="ServiceUnavailable", code=503))


def live_replicas(handle: Any) -> int | None:
    """Prefill replicas the handle's router can send to now; None while it does not know (not yet used,
    or Ray's internals not as expected: then the ladder runs as if they were all alive)."""
    try:
        router = handle._router
        if router is None or not router.running_replicas_populated():
            return None
        inner = getattr(router, "_asyncio_router", router)
        request_router = inner.request_router
        return None if request_router is None else len(request_router.curr_replicas)
    except Exception:
        return None


class PoolGone(Exception):
    """The pool a call waits on has no live replica left (see :func:`first_answer`)."""


#: How often a waiting prefill call looks whether its pool still has a live replica.
POOL_WATCH_S = 0.02


async def first_answer(gen: Any, gone: Callable[[], bool], *, timeout_s: float,
                       watch_s: float = POOL_WATCH_S) -> Any:
    """The first chunk of ``gen``, or :class:`PoolGone` as soon as ``gone()`` (the pool's last live replica
    died: Serve's router holds the call for a replacement that takes minutes, so without this the call
    waits out ``timeout_s``, 10 s by default), or :class:`TimeoutError` after ``timeout_s``. The check is
    one attribute read every ``watch_s`` while a prefill is outstanding."""
    task = asyncio.ensure_future(gen.__anext__())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=min(watch_s, left))
            if done:
                return task.result()
            if gone():
                raise PoolGone
    finally:
        if not task.done():
            task.cancel()


def request_id_of(raw_request_info: Any) -> str | None:
    headers = getattr(raw_request_info, "headers", None) or {}
    rid = headers.get(REQUEST_ID_HEADER) if isinstance(headers, dict) else None
    if rid:
        return str(rid)
    try:
        from ray.serve.context import _get_serve_request_context

        return _get_serve_request_context().request_id or None
    except Exception:
        return None


async def orchestrate(server: Any, request: Any, raw_request_info: Any,
                      fallback: Callable[[Any, Any], AsyncGenerator[Any, None]],
                      local: Callable[[str, Any, Any], Awaitable[AsyncGenerator[Any, None]]],
                      *, policy: PrefillPolicy | None = None) -> AsyncGenerator[Any, None]:
    """Remote prefill with the ladder, then local decode (the body of ``BatonPDDecodeServer._orchestrate``).

    ``fallback``: Ray's own orchestration; ``local(method, request, raw)``: the decode engine's own
    ``chat``/``completions`` (LLMServer's request pipeline)."""
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest
    from ray.serve._private.http_util import session_id_from_headers

    backend = server._get_connector_backend()
    if (backend.requires_peer_binding or backend.concurrent_handoff or serve.get_multiplexed_model_id()
            or not isinstance(request, ChatCompletionRequest | CompletionRequest)):
        async with contextlib.aclosing(fallback(request, raw_request_info)) as chunks:
            async for chunk in chunks:
                yield chunk
        return
    policy = policy or ReplicaEnv.from_environ().prefill
    method = "chat" if isinstance(request, ChatCompletionRequest) else "completions"
    handle = server._prefill_handle
    if raw_request_info is not None:
        session_id = session_id_from_headers(raw_request_info.headers)
        if session_id:
            handle = handle.options(session_id=session_id)
    call = getattr(handle, method)
    ladder = LadderRecord(request_id_of(raw_request_info))
    try:
        async with contextlib.aclosing(_ladder(server, request, raw_request_info, local=local, policy=policy,
                                               method=method, call=call, ladder=ladder)) as chunks:
            async for chunk in chunks:
                yield chunk
    finally:
        ladder.post_phases()  # the ladder gave up, the client went away, or the stream ended without a token


async def _ladder(server: Any, request: Any, raw_request_info: Any, *,
                  local: Callable[[str, Any, Any], Awaitable[AsyncGenerator[Any, None]]], policy: PrefillPolicy,
                  method: str, call: Any, ladder: LadderRecord) -> AsyncGenerator[Any, None]:
    """The ladder itself: remote prefill attempts, then local decode on the KV; else local prefill; else 503."""
    backend = server._get_connector_backend()
    prefill_chunk: Any = None
    why = ""
    if live_replicas(server._prefill_handle) == 0:
        why = "no live prefill replica"
    else:
        for attempt in range(1, policy.attempts + 1):
            if attempt > 1:
                await asyncio.sleep(policy.delay(attempt))
            t0 = time.perf_counter()
            prefill_request = backend.prepare_prefill_request(request=request, peer=None)
            server._request_prefill_token_ids(prefill_request)
            gen = call.remote(prefill_request, raw_request_info)
            timed_out = False
            try:
                chunk = await first_answer(gen, lambda: live_replicas(server._prefill_handle) == 0,
                                           timeout_s=policy.timeout_s)
            except TimeoutError:
                why = f"prefill did not answer within {policy.timeout_s:g} s"
                timed_out = True
                chunk = None
            except PoolGone:
                why = "the prefill pool lost its last live replica while the call waited"
                chunk = None
            except StopAsyncIteration:
                why = "prefill ended without an answer"
                chunk = None
            except Exception as exc:  # RayActorError, ActorDiedError, ActorUnavailableError, ...
                why = f"prefill failed: {type(exc).__name__}"
                chunk = None
            if chunk is not None and _is_error(chunk):
                code = _error_code(chunk) or 500
                if code < 500 and code != 429:  # the request itself is refused: the client's error
                    ladder.phase(PHASE_REMOTE_PREFILL, t0, "failed", attempt=attempt,
                                 detail=f"prefill refused the request ({code})")
                    if attempt > 1:
                        ladder.add(STEP_PREFILL_RETRY, t0, "failed", f"prefill refused the request ({code})")
                        await ladder.record_steps()
                    yield chunk
                    return
                why = f"prefill answered {code}"
                chunk = None
            if chunk is None:
                ladder.phase(PHASE_REMOTE_PREFILL, t0, "failed", attempt=attempt, detail=why)
                with contextlib.suppress(Exception):
                    gen.cancel()
                if attempt > 1:
                    ladder.add(STEP_PREFILL_RETRY, t0, "failed", f"attempt {attempt}: {why}")
                log.warning("prefill attempt %d/%d: %s", attempt, policy.attempts, why)
                live = live_replicas(server._prefill_handle)
                if live == 0:
                    why += "; no live prefill replica"
                    break
                if timed_out and live == 1:
                    why += "; the only live prefill replica did not answer"
                    break
                continue
            ladder.phase(PHASE_REMOTE_PREFILL, t0, attempt=attempt)
            if attempt > 1:
                ladder.add(STEP_PREFILL_RETRY, t0, "recovered", f"attempt {attempt} answered after: {why}")
            prefill_chunk = chunk
            break

    if prefill_chunk is not None:
        if ladder.items:
            await ladder.record_steps()
        from ray.llm._internal.common.patches.vllm.tokenize_once import reuse_prompt_token_ids

        decode_request = backend.prepare_decode_request(request=request, peer=None, prefill_response=prefill_chunk)
        with reuse_prompt_token_ids(server._decode_reuse_ids(prefill_chunk)):
            t0 = time.perf_counter()
            local_gen = await local(method, decode_request, raw_request_info)
            waiting = True
            async with contextlib.aclosing(local_gen):
                async for out in local_gen:
                    if waiting:  # the decode engine pulled the KV and made its first token
                        waiting = False
                        ladder.phase(PHASE_KV_HANDOFF, t0, "failed" if _is_error(out) else "ok")
                        ladder.post_phases()
                    yield out
        return

    if not policy.local_prefill:
        ladder.add(STEP_LOCAL_PREFILL, time.perf_counter(), "failed", "local prefill is off")
        await ladder.record_steps()
        yield unavailable("No prefill replica answered. Retry shortly.")
        return
    t0 = time.perf_counter()
    own_gen: AsyncGenerator[Any, None] | None = None
    try:
        own_gen = await local(method, request, raw_request_info)
        first = await own_gen.__anext__()
    except Exception as exc:
        if own_gen is not None:
            with contextlib.suppress(Exception):
                await own_gen.aclose()
        ladder.phase(PHASE_LOCAL_PREFILL, t0, "failed", detail=f"local prefill failed: {type(exc).__name__}")
        ladder.add(STEP_LOCAL_PREFILL, t0, "failed", f"{why}; local prefill failed: {type(exc).__name__}")
        await ladder.record_steps()
        yield unavailable("No prefill replica answered. Retry shortly.")
        return
    async with contextlib.aclosing(own_gen):
        failed = _is_error(first)
        ladder.phase(PHASE_LOCAL_PREFILL, t0, "failed" if failed else "ok", detail=f"after: {why}")
        ladder.add(STEP_LOCAL_PREFILL, t0, "failed" if failed else "recovered", f"after: {why}")
        await ladder.record_steps()
        ladder.post_phases()
        if failed:
            yield unavailable("No prefill replica answered. Retry shortly.")
            return
        yield first
        async for out in own_gen:
            yield out
