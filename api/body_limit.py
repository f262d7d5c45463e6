"""A ceiling on request bodies, applied before any route reads one.

A body whose ``Content-Length`` is over the limit is refused at once (413, in the shape of where it was
sent: OpenAI's on ``/v1``, problem details elsewhere) without reading a byte of it; a body without a
length (chunked) is counted as it arrives and refused as soon as it passes the limit, so no route ever
holds more than ``max_bytes`` of one request in memory.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baton.api.errors import error_response
from baton.core import errors


class RequestTooLargeError(errors.ClientError):
    status = 413
    code = "request_too_large"
    title = "Request too large"


def _message(max_bytes: int) -> str:
    size = f"{max_bytes / 2**20:.0f} MiB" if max_bytes >= 2**20 else f"{max_bytes} bytes"
    return f"The request body is larger than the {size} this server accepts."


class BodyLimit:
    """ASGI middleware: at most ``max_bytes`` of body per request; ``uploads`` (path -> bytes): a larger
    ceiling for an upload route (``POST /v1/files``), whose route stores the body a part at a time."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, uploads: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.uploads = uploads or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.uploads.get(scope.get("path", ""), self.max_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    response = error_response(Request(scope), RequestTooLargeError(_message(limit)))
                    await response(scope, receive, send)
                    return
                break
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, _message(limit))
            return message

        await self.app(scope, counted, send)
