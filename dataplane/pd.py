"""Baton's P/D decode server: Ray Serve LLM's decode-side orchestrator with a recovery seam.

Ray's `PDDecodeServer` sends the prompt to a prefill replica (`max_tokens=1`, NIXL
`kv_transfer_params`), then decodes locally on the transferred KV. `BatonPDDecodeServer` routes every
request through `_orchestrate`, the prefill side of the recovery ladder (`baton.dataplane.recovery`:
retry prefill on another live replica, else prefill locally); the decode side (resume on another
replica, or on the prefill pool's engine) is the gateway's. The prefill pool is a Serve application of
its own (`baton.dataplane.app.build_prefill_app`), looked up by name. The server also records each KV
handoff (the prefill blocks the decode engine pulls), the numbers the `dataplane.kv_handoff` span reports,
as the request's `handoff` fact (`baton.core.contracts.HandoffFact`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer

from baton.core.contracts import REQUEST_ID_HEADER, HandoffFact
from baton.dataplane import tracing as dp_tracing
from baton.dataplane.facts import spawn_fact

MAX_RECORDED_HANDOFFS = 1024
#: The longest a new decode replica spends warming up before it takes traffic (it takes traffic anyway after).
WARMUP_TIMEOUT_S = 60.0
#: Request ids of warm-up requests start with this (they never reach the gateway or the request records).
WARMUP_PREFIX = "baton-warmup-"
WARMUP_WORDS = ("the", "a", "river", "stone", "light", "over", "under", "quiet", "city", "winter", "green", "runs")

logger = logging.getLogger(__name__)


class _RecordingBackend:
    """Wraps the KV-connector backend to see what prefill handed over for each decode request."""

    def __init__(self, inner: Any, handoffs: collections.deque[dict[str, Any]]):
        self._inner = inner
        self._handoffs = handoffs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def prepare_prefill_request(self, *, request: Any, peer: Any) -> Any:
        prefill_request = self._inner.prepare_prefill_request(request=request, peer=peer)
        clamp_min_tokens(prefill_request)
        rt = dp_tracing.current.get()
        if rt is not None:
            rt.start_prefill(prefill_request)
        return prefill_request

    def prepare_decode_request(self, *, request: Any, peer: Any, prefill_response: Any) -> Any:
        decode_request = self._inner.prepare_decode_request(
            request=request, peer=peer, prefill_response=prefill_response
        )
        params = getattr(prefill_response, "kv_transfer_params", None) or {}
        usage = getattr(prefill_response, "usage", None)
        handoff = {
            "request_id": getattr(request, "request_id", None),
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "remote_engine_id": params.get("remote_engine_id"),
            "remote_blocks": _count_blocks(params.get("remote_block_ids")),
        }
        self._handoffs.append(handoff)
        rt = dp_tracing.current.get()
        if rt is not None and prefill_response is not None:
            rt.end_prefill(prefill_response, handoff["prompt_tokens"], int(handoff["remote_blocks"] or 0))
            rt.start_decode(decode_request, {**handoff, "connector": "nixl"})
        return decode_request


def clamp_min_tokens(prefill_request: Any) -> None:
    """The prefill request makes one token (Ray clamps ``max_tokens``); a client's ``min_tokens`` above 1
    would make vLLM refuse it ("min_tokens must be less than or equal to max_tokens=1"). The decode
    request keeps the client's value."""
    if (getattr(prefill_request, "min_tokens", None) or 0) > 1:
        prefill_request.min_tokens = 1


def _count_blocks(block_ids: Any) -> int:
    """Blocks in `remote_block_ids`: a flat list, or one list per KV-cache group."""
    if not block_ids:
        return 0
    return sum(_count_blocks(b) if isinstance(b, list | tuple) else 1 for b in block_ids)


class BatonPDDecodeServer(PDDecodeServer):
    """Decode-side server of a Baton P/D deployment."""

    _handoffs: collections.deque[dict[str, Any]]
    _baton_shape_cache: dp_tracing.ModelShape | None
    _baton_replica_name: str

    async def __init__(self, llm_config: Any, *, prefill_server: Any = None,  # type: ignore[misc]
                       prefill_app: str | None = None, prefill_deployment: str | None = None,
                       **kwargs: Any) -> None:
        """``prefill_server``: a handle to the prefill deployment bound in the same application (Ray's
        builder), or, when None, the deployment ``prefill_deployment`` of the application ``prefill_app``
        (Baton's P/D layout: the prefill pool is an application of its own, reachable over HTTP too)."""
        if prefill_server is None:
            from ray import serve

            if not (prefill_app and prefill_deployment):
                raise ValueError("a prefill handle, or the prefill application and deployment, is needed")
            # Not checked: the prefill application may still be deploying; calls wait for its replicas.
            prefill_server = serve.get_deployment_handle(prefill_deployment, prefill_app, _check_exists=False)
        await super().__init__(llm_config, prefill_server=prefill_server, **kwargs)


    async def _maybe_prewarm(self) -> None:
        """Called by Ray's ``PDDecodeServer.__init__`` once the engine is up, before Serve sends this replica
        any traffic: a small completion and a small chat over the whole P/D path, as a client's would go
        (the prefill deployment's handle learns its replicas, the prefill engine's KV reaches this engine
        over NIXL, so the connectors' handshake is done; the chat template is loaded; the replica's tracer
        and its Redis client for the gateway's facts are built), so the first request after a replacement
        does not pay for it. Their request ids start with :data:`WARMUP_PREFIX` (a trace of its own each).

        Ray's own pre-warm (``experimental_configs._prewarm_prefill_decode``) broadcasts a one-token prompt
        to every prefill replica and fails the replica when the prefill pool is away for five minutes;
        this one goes through the recovery ladder instead (no prefill replica: prefilled here, nothing
        lost), with a new prompt of two whole KV blocks (KV to pull whatever the connector's rounding to
        blocks; Ray's one-token prompt has none), and a failure or :data:`WARMUP_TIMEOUT_S` costs only the warm-up."""
        from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest
        from ray.llm._internal.serve.core.protocol import RawRequestInfo

        # prompts no tier holds (a cached one would be loaded from LMCache, and NIXL never meet its peer)
        rng, n = random.Random(), 2 * self._baton_block_size() + 8
        model = self._llm_config.model_id
        requests: list[CompletionRequest | ChatCompletionRequest] = [
            CompletionRequest(model=model, prompt=[rng.randrange(100, 1000) for _ in range(n)], max_tokens=1,
                              temperature=0.0, stream=False, request_id=f"{WARMUP_PREFIX}{uuid.uuid4().hex}"),
            # the chat path's own first-time work (the chat template, its renderer)
            ChatCompletionRequest(model=model, messages=[{"role": "user", "content": " ".join(
                rng.choice(WARMUP_WORDS) for _ in range(n))}], max_tokens=1, temperature=0.0, stream=False,
                request_id=f"{WARMUP_PREFIX}{uuid.uuid4().hex}"),
        ]
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(WARMUP_TIMEOUT_S):  # not wait_for: it can lose a cancellation (3.11)
                for request in requests:
                    # through the entry point Serve calls, so what a first request sets up (this replica's
                    # tracer and exporter, its Redis client for the gateway's facts) is set up here
                    raw = RawRequestInfo(headers={REQUEST_ID_HEADER: request.request_id})
                    call = self.chat if isinstance(request, ChatCompletionRequest) else self.completions
                    async with contextlib.aclosing(await call(request, raw)) as chunks:
                        async for _ in chunks:
                            pass
        except Exception as exc:
            logger.warning("baton: the decode replica's warm-up failed after %.0f ms (%s); it takes traffic "
                           "anyway", (time.perf_counter() - t0) * 1000, type(exc).__name__)
            return
        logger.info("baton: the decode replica warmed up over the P/D path in %.0f ms",
                    (time.perf_counter() - t0) * 1000)

    def _baton_block_size(self) -> int:
        cfg: Any = self._llm_config
        kwargs = cfg.engine_kwargs or {}
        gpu = any(b.get("GPU") for b in ((cfg.placement_group_config or {}).get("bundles") or []))
        # vLLM's default KV block: 128 tokens on the CPU backend, 16 on GPUs.
        return int(kwargs.get("block_size") or (16 if gpu else 128))

    def _get_connector_backend(self) -> Any:
        cached = getattr(self, "_baton_backend", None)
        if cached is None:
            self._handoffs = collections.deque(maxlen=MAX_RECORDED_HANDOFFS)
            cached = self._baton_backend = _RecordingBackend(super()._get_connector_backend(), self._handoffs)
        return cached

    async def kv_handoffs(self) -> list[dict[str, Any]]:
        """The most recent KV handoffs, oldest first: prompt tokens and prefill blocks pulled."""
        self._get_connector_backend()
        return list(self._handoffs)

    async def _orchestrate(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        """Prefill remotely (retried, else local prefill, else 503: `baton.dataplane.recovery`), then decode
        locally."""
        from ray.llm._internal.serve.core.server.llm_server import LLMServer

        from baton.dataplane.recovery import orchestrate

        def local(method: str, req: Any, raw: Any) -> Any:
            return getattr(LLMServer, method)(self, req, raw)

        async with contextlib.aclosing(orchestrate(self, request, raw_request_info, super()._pd_handle_request,
                                                   local)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        return self._traced(self._orchestrate(request, raw_request_info), raw_request_info)

    async def completions(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        return self._traced(self._orchestrate(request, raw_request_info), raw_request_info)

    # -- tracing ------------------------------------------------------------------------------------

    async def _traced(self, gen: AsyncGenerator[Any, None], raw_request_info: Any) -> AsyncGenerator[Any, None]:
        """The request's data-plane spans around the orchestration; its handoff fact for the gateway.

        Tracing never breaks serving: any failure in here costs only the spans.

        A client that goes away closes this generator (Serve throws ``CancelledError`` in at the ``yield``
        when the replica runs Baton's code on its own loop); the orchestration under it, and the engine's
        stream under that, are closed here and then, so the engine aborts the request at once. Left to
        the garbage collector, an abandoned stream kept decoding to its ``max_tokens``: the exception
        held below ties this frame into a reference cycle that only a full collection frees."""
        try:
            rt = dp_tracing.begin(raw_request_info, replica=self._baton_replica())
        except Exception:
            rt = None
        async with contextlib.aclosing(gen):
            if rt is None:
                async for item in gen:
                    yield item
                return
            token = dp_tracing.current.set(rt)
            error: BaseException | None = None
            try:
                async for item in gen:
                    if rt.decode is not None:
                        self._baton_chunk(rt, item)
                    yield item
            except BaseException as exc:
                error = exc
                raise
            finally:
                with contextlib.suppress(ValueError):  # finalised in another context
                    dp_tracing.current.reset(token)
                self._baton_finish(rt, error)
                error = None  # no cycle: the exception's traceback holds this frame

    def _baton_chunk(self, rt: dp_tracing.RequestTrace, item: Any) -> None:
        try:
            rt.chunk(item)
            if not rt.handoff_done:  # first token: the handoff is over, tell the gateway now
                self._baton_fact(rt, rt.first_token(self._baton_shape()))
        except Exception:
            return

    def _baton_finish(self, rt: dp_tracing.RequestTrace, error: BaseException | None) -> None:
        try:
            self._baton_fact(rt, rt.finish(self._baton_shape(), error))
        except Exception:
            return

    def _baton_fact(self, rt: dp_tracing.RequestTrace, fact: HandoffFact | None) -> None:
        if fact is not None:
            spawn_fact(rt.request_id, fact)

    def _baton_shape(self) -> dp_tracing.ModelShape | None:
        if not hasattr(self, "_baton_shape_cache"):
            cfg: Any = self._llm_config
            self._baton_shape_cache = dp_tracing.model_shape(
                str(cfg.model_loading_config.model_source), dtype=(cfg.engine_kwargs or {}).get("dtype"),
                block_size=self._baton_block_size())
        return self._baton_shape_cache

    def _baton_replica(self) -> str:
        if not hasattr(self, "_baton_replica_name"):
            try:
                from ray import serve

                self._baton_replica_name = str(serve.get_replica_context().replica_id.unique_id)
            except Exception:
                self._baton_replica_name = ""
        return self._baton_replica_name
