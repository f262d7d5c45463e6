"""The prefill side of the recovery ladder, run by the P/D decode server before the first token.

1. Remote prefill (Ray's flow: the prompt with ``max_tokens=1`` and the connector's
   ``kv_transfer_params`` to a prefill replica). A call that raises (the replica died: Ray actor
   errors), answers with a server error, or does not answer within ``BATON_PREFILL_TIMEOUT_S`` is
   retried, ``BATON_PREFILL_ATTEMPTS`` attempts in all with exponential backoff from
   ``BATON_PREFILL_BACKOFF_S``; Ray Serve's router sends a retry to a live replica.
2. Then the decode replica prefills locally (the request on its own engine without remote KV
   params), unless ``BATON_LOCAL_PREFILL=0``.
3. Then 503 (the gateway's own budget may retry the whole request).

The rung is chosen from live health, never by waiting for Ray to replace a replica: the handle's
router knows which prefill replicas are alive (Ray drops a replica from it as soon as a call to it
fails with the actor dead). With none alive the request goes to rung 2 at once (before the first
attempt, or instead of a retry); a retry after a timeout needs another live replica than the one
that did not answer (with a single replica, the retry would wait on the same stalled engine).

Each step taken is a ``recovery_steps`` entry (``prefill_retry``, ``local_prefill``), written as the
request's data-plane fact for the gateway (:mod:`baton.dataplane.facts`). A client error from the
prefill engine (4xx) is passed on at once: retrying cannot change it. Connectors that bind a peer
before dispatch or hand off concurrently, and multiplexed (LoRA) requests, keep Ray's own flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from baton.dataplane.facts import record_fact

log = logging.getLogger(__name__)

ENV_TIMEOUT = "BATON_PREFILL_TIMEOUT_S"
ENV_ATTEMPTS = "BATON_PREFILL_ATTEMPTS"
ENV_BACKOFF = "BATON_PREFILL_BACKOFF_S"
ENV_LOCAL = "BATON_LOCAL_PREFILL"


@dataclass(frozen=True, slots=True)
class PrefillPolicy:
    timeout_s: float = 10.0
    attempts: int = 3
    backoff_s: float = 0.2
    local_prefill: bool = True

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PrefillPolicy:
        e = os.environ if env is None else env
        d = cls()

        def num(name: str, default: float) -> float:
            try:
                return float(e.get(name, default))
            except ValueError:
                return default

        return cls(timeout_s=max(num(ENV_TIMEOUT, d.timeout_s), 0.001),
                   attempts=max(int(num(ENV_ATTEMPTS, d.attempts)), 1),
                   backoff_s=max(num(ENV_BACKOFF, d.backoff_s), 0.0),
                   local_prefill=e.get(ENV_LOCAL, "1").strip().lower() not in ("0", "false", "no"))

    def delay(self, attempt: int) -> float:
        """Wait before attempt ``attempt`` (2-based: the first retry waits ``backoff_s``)."""
        return float(min(self.backoff_s * 2.0 ** (attempt - 2), 5.0))


class Steps:
    """The request's recovery steps, in the shared shape (see ``Outcome.step`` in the gateway)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, started_pc: float, outcome: str, detail: str) -> None:
        now = time.perf_counter()
        self.items.append({"step": name, "at_ms": round((started_pc - self.start) * 1000, 3),
                           "duration_ms": round((now - started_pc) * 1000, 3), "outcome": outcome,
                           "detail": detail[:200]})


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


def request_id_of(raw_request_info: Any) -> str | None:
    headers = getattr(raw_request_info, "headers", None) or {}
    rid = headers.get("x-request-id") if isinstance(headers, dict) else None
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
    from ray.llm._internal.common.patches.vllm.tokenize_once import reuse_prompt_token_ids
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest
    from ray.serve._private.http_util import session_id_from_headers

    backend = server._get_connector_backend()
    if (backend.requires_peer_binding or backend.concurrent_handoff or serve.get_multiplexed_model_id()
            or not isinstance(request, ChatCompletionRequest | CompletionRequest)):
        async for chunk in fallback(request, raw_request_info):
            yield chunk
        return
    policy = policy or PrefillPolicy.from_env()
    method = "chat" if isinstance(request, ChatCompletionRequest) else "completions"
    handle = server._prefill_handle
    if raw_request_info is not None:
        session_id = session_id_from_headers(raw_request_info.headers)
        if session_id:
            handle = handle.options(session_id=session_id)
    call = getattr(handle, method)
    steps = Steps()
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
                chunk = await asyncio.wait_for(gen.__anext__(), timeout=policy.timeout_s)
            except TimeoutError:
                why = f"prefill did not answer within {policy.timeout_s:g} s"
                timed_out = True
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
                    if attempt > 1:
                        steps.add("prefill_retry", t0, "failed", f"prefill refused the request ({code})")
                        await record_fact(request_id_of(raw_request_info), "recovery_steps", steps.items)
                    yield chunk
                    return
                why = f"prefill answered {code}"
                chunk = None
            if chunk is None:
                with contextlib.suppress(Exception):
                    gen.cancel()
                if attempt > 1:
                    steps.add("prefill_retry", t0, "failed", f"attempt {attempt}: {why}")
                log.warning("prefill attempt %d/%d: %s", attempt, policy.attempts, why)
                live = live_replicas(server._prefill_handle)
                if live == 0:
                    why += "; no live prefill replica"
                    break
                if timed_out and live == 1:
                    why += "; the only live prefill replica did not answer"
                    break
                continue
            if attempt > 1:
                steps.add("prefill_retry", t0, "recovered", f"attempt {attempt} answered after: {why}")
            prefill_chunk = chunk
            break

    if prefill_chunk is not None:
        if steps.items:
            await record_fact(request_id_of(raw_request_info), "recovery_steps", steps.items)
        decode_request = backend.prepare_decode_request(request=request, peer=None, prefill_response=prefill_chunk)
        with reuse_prompt_token_ids(server._decode_reuse_ids(prefill_chunk)):
            local_gen = await local(method, decode_request, raw_request_info)
            async for out in local_gen:
                yield out
        return

    if not policy.local_prefill:
        steps.add("local_prefill", time.perf_counter(), "failed", "local prefill is off")
        await record_fact(request_id_of(raw_request_info), "recovery_steps", steps.items)
        yield unavailable("No prefill replica answered. Retry shortly.")
        return
    t0 = time.perf_counter()
    try:
        local_gen = await local(method, request, raw_request_info)
        first = await local_gen.__anext__()
    except Exception as exc:
        steps.add("local_prefill", t0, "failed", f"{why}; local prefill failed: {type(exc).__name__}")
        await record_fact(request_id_of(raw_request_info), "recovery_steps", steps.items)
        yield unavailable("No prefill replica answered. Retry shortly.")
        return
    failed = _is_error(first)
    steps.add("local_prefill", t0, "failed" if failed else "recovered", f"after: {why}")
    await record_fact(request_id_of(raw_request_info), "recovery_steps", steps.items)
    if failed:
        yield unavailable("No prefill replica answered. Retry shortly.")
        return
    yield first
    async for out in local_gen:
        yield out
