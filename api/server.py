"""The HTTP/1.1 protocol the gateway process serves ``/v1``, ``/admin/v1`` and the console with: uvicorn's
httptools protocol plus the read deadlines it lacks.

uvicorn times out an idle keep-alive connection only after a response; a connection that never sends a
byte, a request head that never completes, or a body that stops arriving holds its socket open for ever,
so a handful of slow clients could pin a gateway. :class:`DeadlineProtocol` closes

- a connection that sends nothing within ``keep_alive_s`` of opening (as uvicorn does after a response);
- a request whose head (request line and headers) is not complete ``header_timeout_s`` after its first
  byte: answered ``408 Request Timeout``;
- a request whose body goes silent for ``body_timeout_s``: the handler sees the client disconnect, as for
  any client that goes away (nothing accepted is lost: a request is accepted once its body is whole);
- a client address's connection beyond ``max_unfinished_per_client`` still sending a request head:
  answered ``429`` at once and closed (behind a proxy every client shares its address: raise the cap).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from baton.core.settings import GatewaySettings, load_settings

_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 39\r\n\r\n" \
       b"The request did not arrive in time.\r\n\r\n"
_429 = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 51\r\n" \
       b"\r\nToo many unfinished requests from this address.\r\n\r\n"


@dataclass(frozen=True)
class ReadLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    max_unfinished_per_client: int = 64

    @classmethod
    def of(cls, gateway: GatewaySettings) -> ReadLimits:
        return cls(header_timeout_s=gateway.header_timeout_s, body_timeout_s=gateway.body_timeout_s,
                   idle_timeout_s=gateway.keep_alive_s, max_unfinished_per_client=gateway.max_unfinished_per_client)


@functools.cache
def _process_limits() -> ReadLimits:
    return ReadLimits.of(load_settings().gateway)


#: client host -> connections of that host whose request head is incomplete (this process's)
_unfinished: dict[str, int] = {}


class DeadlineProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with deadlines on reading a request (see the module's docstring); uvicorn
    takes it by import path (``http="baton.api.server:DeadlineProtocol"``), so each worker process makes its
    own, with the limits of its ``BATON_GATEWAY__*`` settings."""

    def __init__(self, *args: Any, limits: ReadLimits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits or _process_limits()
        self._deadline: asyncio.TimerHandle | None = None
        self._head_pending = False

    # --- the deadline timer -------------------------------------------------------------------------

    def _arm(self, seconds: float, on_expiry: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, on_expiry)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close(self, answer: bytes | None = None) -> None:
        if self.transport.is_closing():
            return
        if answer is not None and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(answer)
        self.transport.close()

    def _head_started(self) -> None:
        if not self._head_pending and self.client:
            self._head_pending = True
            _unfinished[self.client[0]] = _unfinished.get(self.client[0], 0) + 1

    def _head_ended(self) -> None:
        if self._head_pending and self.client:
            self._head_pending = False
            host = self.client[0]
            left = _unfinished.get(host, 1) - 1
            if left > 0:
                _unfinished[host] = left
            else:
                _unfinished.pop(host, None)

    # --- uvicorn's protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.client and _unfinished.get(self.client[0], 0) >= self.limits.max_unfinished_per_client:
            transport.write(_429)
            transport.close()
            return
        self._arm(self.limits.idle_timeout_s, self._close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._head_ended()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started()
        self._arm(self.limits.header_timeout_s, functools.partial(self._close, _408))

    def on_headers_complete(self) -> None:
        self._head_ended()
        self._arm(self.limits.body_timeout_s, self._close)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self.flow.read_paused:
            self._disarm()  # the handler is the slow one: it has not read what came
        else:
            self._arm(self.limits.body_timeout_s, self._close)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

