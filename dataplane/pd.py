"""Baton's P/D decode server: Ray Serve LLM's decode-side orchestrator with a recovery seam.

Ray's `PDDecodeServer` sends the prompt to a prefill replica (`max_tokens=1`, NIXL
`kv_transfer_params`), then decodes locally on the transferred KV. `BatonPDDecodeServer` routes every
request through `_orchestrate`, the one place where the recovery ladder plugs in (retry prefill on
another replica, prefill locally, resume decode elsewhere); today it delegates unchanged to Ray's
orchestration.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer


class BatonPDDecodeServer(PDDecodeServer):
    """Decode-side server of a Baton P/D deployment."""

    async def _orchestrate(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        """Prefill remotely, then decode locally. The recovery ladder wraps this generator."""
        async for chunk in super()._pd_handle_request(request, raw_request_info):
            yield chunk

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        return self._orchestrate(request, raw_request_info)

    async def completions(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[Any, None]:
        return self._orchestrate(request, raw_request_info)
