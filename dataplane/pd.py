"""Baton's P/D decode server: Ray Serve LLM's decode-side orchestrator with a recovery seam.

Ray's `PDDecodeServer` sends the prompt to a prefill replica (`max_tokens=1`, NIXL
`kv_transfer_params`), then decodes locally on the transferred KV. `BatonPDDecodeServer` routes every
request through `_orchestrate`, the one place where the recovery ladder plugs in (retry prefill on
another replica, prefill locally, resume decode elsewhere); today it delegates unchanged to Ray's
orchestration. It also records each KV handoff (the prefill blocks the decode engine pulls), the
numbers the `dataplane.kv_handoff` span reports.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncGenerator
from typing import Any

from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer

MAX_RECORDED_HANDOFFS = 1024


class _RecordingBackend:
    """Wraps the KV-connector backend to see what prefill handed over for each decode request."""

    def __init__(self, inner: Any, handoffs: collections.deque[dict[str, Any]]):
        self._inner = inner
        self._handoffs = handoffs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def prepare_decode_request(self, *, request: Any, peer: Any, prefill_response: Any) -> Any:
        decode_request = self._inner.prepare_decode_request(
            request=request, peer=peer, prefill_response=prefill_response
        )
        params = getattr(prefill_response, "kv_transfer_params", None) or {}
        usage = getattr(prefill_response, "usage", None)
        self._handoffs.append(
            {
                "request_id": getattr(request, "request_id", None),
                "prompt_tokens": getattr(usage, "prompt_tokens", None),
                "remote_engine_id": params.get("remote_engine_id"),
                "remote_blocks": _count_blocks(params.get("remote_block_ids")),
            }
        )
        return decode_request


def _count_blocks(block_ids: Any) -> int:
    """Blocks in `remote_block_ids`: a flat list, or one list per KV-cache group."""
    if not block_ids:
        return 0
    return sum(_count_blocks(b) if isinstance(b, list | tuple) else 1 for b in block_ids)


class BatonPDDecodeServer(PDDecodeServer):
    """Decode-side server of a Baton P/D deployment."""

    _handoffs: collections.deque[dict[str, Any]]

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
        """Prefill remotely, then decode locally. The recovery ladder wraps this generator."""
        async for chunk in super()._pd_handle_request(request, raw_request_info):
            yield chunk

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        return self._orchestrate(request, raw_request_info)

    async def completions(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        return self._orchestrate(request, raw_request_info)
