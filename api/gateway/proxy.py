"""Passing a request to the upstream engine and its answer back to the client.

One :class:`~baton.api.gateway.upstream.UpstreamClient` per process talks to every upstream. Streams
are relayed chunk by chunk as they arrive (whole SSE events; a partial event waits for its end), never re-buffered or
re-serialised; a chunk is only parsed when it carries the engine's usage report, which the gateway
always asks for (``stream_options.include_usage``) and removes again when the client did not.

Every request ends in exactly one :class:`~baton.api.gateway.metering.Outcome` (completed, failed or
cancelled) and one release of its rate-limit lease, whatever happens: upstream errors, a cut
stream (the client then gets an SSE ``error`` event, never a silently short 200), or the client
going away (noticed at once by watching ``http.disconnect``, not only at the next write).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from baton.api.errors import openai_error_body
from baton.api.gateway.engine_text import client_text
from baton.api.gateway.metering import Outcome
from baton.api.gateway.sse import SSEFrames
from baton.api.gateway.upstream import HttpxUpstreamClient, UpstreamClient, UpstreamResponse
from baton.core import errors
from baton.core import models as m

log = logging.getLogger(__name__)

_DONE = b"data: [DONE]"
_USAGE = b'"usage":{'


class UpstreamTimeoutError(errors.UpstreamError):
    status = 504
    code = "upstream_timeout"
    title = "The model took too long to answer"


def new_client(*, timeout_s: float, max_connections: int, library: str = "baton") -> UpstreamClient:
    """The upstream client of a gateway process (see :mod:`baton.api.gateway.upstream`); ``library="httpx"``:
    the same calls over httpx (the gateway bench's library arm)."""
    cls = HttpxUpstreamClient if library == "httpx" else UpstreamClient
    return cls(timeout_s=timeout_s, connect_timeout_s=5.0, max_connections=max_connections, keepalive_expiry_s=30.0)


# -- trace context -------------------------------------------------------------------------------

def _hex(s: str, n: int) -> bool:
    return len(s) == n and all(c in "0123456789abcdef" for c in s)


def trace_context(incoming: str | None) -> tuple[str, str]:
    """(traceparent to send upstream, trace id). Keeps a valid W3C ``traceparent``; starts one otherwise.

    The gateway does not create spans here; OpenTelemetry instrumentation replaces this function's
    body (a child span id under the same trace) without touching its callers."""
    if incoming:
        parts = incoming.strip().lower().split("-")
        if (len(parts) >= 4 and _hex(parts[0], 2) and parts[0] != "ff" and _hex(parts[1], 32)
                and parts[1] != "0" * 32 and _hex(parts[2], 16) and parts[2] != "0" * 16 and _hex(parts[3], 2)):
            return "-".join(parts[:4]), parts[1]
    trace_id = secrets.token_hex(16)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


def upstream_headers(request_id: str, traceparent: str, *, stream: bool) -> dict[str, str]:
    """The headers of every upstream call: the one seam for propagation (tracing, request ids)."""
    return {
        "content-type": "application/json",
        "accept": "text/event-stream" if stream else "application/json",
        "traceparent": traceparent,
        "x-request-id": request_id,
    }


# -- upstream errors -----------------------------------------------------------------------------

#: Said when the model's Serve app is not there (yet) or has no ready replica: deploying, restarting, or
#: not deployed on this Ray cluster. The gateway has already checked the model exists and is granted.
STARTING_MESSAGE = "The model is starting or has no ready replica right now. Retry shortly."
STARTING_RETRY_AFTER_S = 5


def upstream_error(status: int, content: bytes) -> errors.BatonError:
    """An engine's error reply as a client error (4xx: its message is for the client), a 503 while the
    model's app is not serving (Serve's ingress answers 404 for an app it does not have, 503 without a
    ready replica), or a 502."""
    if status in (404, 503):
        return errors.UnavailableError(STARTING_MESSAGE, headers={"retry-after": str(STARTING_RETRY_AFTER_S)})
    if status >= 500 or status < 400:
        return errors.UpstreamError("The model failed to answer. Try again.")
    message = "The model rejected the request."
    code: str | None = None
    param: str | None = None
    try:
        data = orjson.loads(content)
        err = data.get("error") if isinstance(data, dict) else None
        src = err if isinstance(err, dict) else data if isinstance(data, dict) else {}
        if isinstance(src.get("message"), str) and src["message"]:
            message = client_text(src["message"])
        if isinstance(src.get("param"), str):
            param = src["param"]
        if isinstance(src.get("code"), str):
            code = src["code"]
    except orjson.JSONDecodeError:
        pass
    if status == 429:
        return errors.RateLimitedError("The model is overloaded right now. Retry shortly.",
                                       headers={"retry-after": "1"})
    exc = errors.ValidationError(message, param=param)
    if code:
        exc.extra["openai_code"] = code
    return exc


def transport_error(exc: httpx.HTTPError) -> errors.BatonError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeoutError()
    if isinstance(exc, httpx.ConnectError):
        return errors.UnavailableError("The model is not reachable right now. Try again shortly.")
    return errors.UpstreamError("The model failed to answer. Try again.")


def read_usage(usage: Any, outcome: Outcome) -> None:
    if not isinstance(usage, dict):
        return
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        outcome.cached_tokens = int(details.get("cached_tokens") or 0)


# -- the stream ----------------------------------------------------------------------------------

def _count_tokens(chunk: bytes) -> int:
    """Token-bearing pieces in relayed events: one per non-empty content/text delta (vLLM streams one
    token per delta). Used only when no usage report arrives (the client went away)."""
    return (chunk.count(b'"content":"') - chunk.count(b'"content":""')
            + chunk.count(b'"text":"') - chunk.count(b'"text":""'))


_ERROR_EVENT = b'data: {"error"'


def clean_error_events(out: bytes) -> bytes:
    """An engine's mid-stream error event (``data: {"error": {...}}``) in OpenAI's shape with only what a
    client may read: a 4xx's message reduced by :func:`client_text`, a 5xx's replaced by Baton's sentence;
    other events as they are. Called only on chunks that hold such an event."""
    kept: list[bytes] = []
    for ev in out.split(b"\n\n"):
        if ev.startswith(_ERROR_EVENT):
            try:
                err = orjson.loads(ev[6:]).get("error")
            except (orjson.JSONDecodeError, AttributeError):
                err = None
            raw = err.get("message") if isinstance(err, dict) else None
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) and 400 <= code < 500 else 500  # vLLM puts the status in code
            message = (client_text(raw) if status < 500 and isinstance(raw, str) and raw
                       else "The model failed to answer. Try again.")
            kept.append(b"data: " + openai_error_body(message, status=status, code=None))
            continue
        kept.append(ev)
    return b"\n\n".join(kept)


def _split_usage(out: bytes, outcome: Outcome, strip: bool) -> bytes:
    """Reads the usage report out of complete events; drops its event when the client did not ask."""
    events = out.split(b"\n\n")
    kept: list[bytes] = []
    for ev in events:
        if _USAGE in ev and ev.startswith(b"data: {"):
            try:
                data = orjson.loads(ev[6:])
            except orjson.JSONDecodeError:
                kept.append(ev)
                continue
            if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                read_usage(data["usage"], outcome)
                if strip and not data.get("choices"):
                    continue
        kept.append(ev)
    return b"\n\n".join(kept)


class SSERelay(Response):
    """An ASGI response relaying one upstream SSE stream; calls ``done`` exactly once at the end."""

    def __init__(self, response: UpstreamResponse, outcome: Outcome, *, strip_usage: bool,
                 headers: list[tuple[bytes, bytes]], done: Callable[[Outcome], None]) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = headers
        self._response = response
        self._outcome = outcome
        self._strip = strip_usage
        self._done = done
        self._disconnected = False
        self._ending = False  # the last body message is being sent: a disconnect now is no cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        me = asyncio.current_task()
        watcher = asyncio.create_task(self._watch(receive, me))
        outcome = self._outcome
        finished = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._relay(send)
            finished = True
        except asyncio.CancelledError:
            if not self._disconnected:
                raise
            if me is not None:
                me.uncancel()
        except OSError:  # the client's socket is gone (ASGI 2.4: send raises)
            self._disconnected = True
        finally:
            watcher.cancel()
            if not finished:
                outcome.metered = True  # the engine worked; what reached the client is counted
                outcome.status = m.RequestStatus.CANCELLED
                outcome.error_code = "client_disconnected"
                outcome.http_status = 499
            outcome.end_pc = time.perf_counter()
            self._done(outcome)
            asyncio.get_running_loop().create_task(self._response.aclose())

    async def _watch(self, receive: Receive, task: asyncio.Task[Any] | None) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if self._ending:
                    return
                self._disconnected = True
                if task is not None:
                    task.cancel()
                return

    async def _relay(self, send: Send) -> None:
        outcome = self._outcome
        strip = self._strip
        frames = SSEFrames()
        saw_done = False
        last = outcome.start_pc
        try:
            async for received in self._response.aiter_raw():
                now = time.perf_counter()
                out = frames.feed(received)
                if not out:
                    continue
                n = _count_tokens(out)
                if n:
                    if outcome.first_token is None:
                        outcome.first_token = now
                    else:
                        outcome.gaps.append(now - last)
                    last = now
                    outcome.completion_tokens += n
                if _USAGE in out:
                    out = _split_usage(out, outcome, strip)
                    if not out.strip():
                        continue
                if _ERROR_EVENT in out:
                    out = clean_error_events(out)
                if _DONE in out:
                    saw_done = True
                await send({"type": "http.response.body", "body": out, "more_body": True})
        except httpx.HTTPError as exc:
            await self._fail(send, transport_error(exc))
            return
        if pending := frames.pending:
            if _DONE in pending:
                saw_done = True
            await send({"type": "http.response.body", "body": pending, "more_body": True})
        if not saw_done:
            await self._fail(send, errors.UpstreamError("The model's stream ended early. Try again."))
            return
        outcome.metered = True
        self._ending = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _fail(self, send: Send, exc: errors.BatonError) -> None:
        outcome = self._outcome
        outcome.status = m.RequestStatus.FAILED
        outcome.http_status = exc.status
        outcome.error_code = exc.code
        outcome.metered = True  # the engine worked and tokens reached the client
        body = openai_error_body(exc.title, status=exc.status, code=exc.code)
        self._ending = True
        await send({"type": "http.response.body", "body": b"event: error\ndata: " + body + b"\n\n" + _DONE + b"\n\n",
                    "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_headers(extra: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())
    return headers
