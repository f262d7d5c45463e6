"""The gateway's HTTP/1.1 client for its upstreams (Ray Serve's proxy, a bare engine): keep-alive
connections per host, an ``asyncio.Protocol`` with httptools' C parser, and nothing else.

Why not httpx: a streamed request through httpx/httpcore costs more gateway CPU than the rest of the
gateway's work on it (connection-pool bookkeeping, a socket-readability probe per reuse, h11 events,
anyio streams, one iteration per chunk). Here a request is one write; the answer is parsed as it
arrives in ``data_received``, and :meth:`UpstreamResponse.aiter_raw` hands over **everything received
since the last read** in one piece, so chunks that arrive together are relayed in one ASGI send
while a token that arrives alone is relayed at once (nothing waits to coalesce).

It is the gateway's only upstream client: every call of a request (the first, a retry, a resumed
stream, the fallback pool's) is an :data:`Opener` over it. Failures are httpx's exception classes
(``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``, all ``httpx.HTTPError``),
which the error mapping and the retry rules name.

Silence: a request waits at most ``read_timeout`` for its answer and between pieces of it. One timer
per connection watches that (re-armed only when it fires), not one per wait: a streamed token costs
no timer.

Connections: idle ones are reused newest first; one the server closed is noticed by the event loop
(``connection_lost``) and dropped before reuse; a reused connection that fails before any byte of
the answer is retried once on a fresh connection (the server closed it as the request was sent).
A body that is not read to its end closes its connection. At most ``max_connections`` requests are
in flight per client; more wait for a slot.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_mod
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools
import httpx

#: Buffered answer bytes above which the upstream socket stops being read until the relay catches up.
HIGH_WATER = 1 << 20


@dataclass(frozen=True, slots=True)
class _Origin:
    scheme: str
    host: str
    port: int
    host_header: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request at a time."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.used = False  # served a request before (a failure before the answer may be a stale close)
        # per request
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.received = False  # any byte of the answer arrived
        self.keep_alive = True
        self.buffer: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.deadline = 0.0  # loop time by which the waiter must hear something
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed upstream answer ({type(exc).__name__})"))
            return
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            # An answer ends by its length or its last chunk; one cut by a close is an error.
            self.error = httpx.RemoteProtocolError("the upstream closed the connection mid-answer")
        self._wake()

    # -- httptools callbacks ------------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.buffer.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- request side -------------------------------------------------------------------------------

    def start(self, head: bytes, body: bytes) -> None:
        self.status = 0
        self.headers_done = self.complete = self.received = False
        self.keep_alive = True
        self.buffer = []
        self.buffered = 0
        self.error = None
        self.parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        self.transport.write(head + body)

    async def wait(self, silence_s: float | None) -> None:
        """Until more of the answer arrived, it ended or failed; ``httpx.ReadTimeout`` after ``silence_s``."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        if silence_s is not None:
            self.deadline = loop.time() + silence_s
            timer = self.timer
            if timer is None or timer.when() > self.deadline:  # none yet, or set for a longer silence
                if timer is not None:
                    timer.cancel()
                self.timer = loop.call_at(self.deadline, self._check_silence)
        try:
            await waiter
        finally:
            self.waiter = None

    def _check_silence(self) -> None:
        """The connection's one silence timer: fails a waiter past its deadline, else waits on for it."""
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait arms it again
        loop = asyncio.get_running_loop()
        if loop.time() >= self.deadline:
            waiter.set_exception(httpx.ReadTimeout("the upstream did not answer in time"))
        else:
            self.timer = loop.call_at(self.deadline, self._check_silence)

    def take(self) -> bytes:
        data = self.buffer[0] if len(self.buffer) == 1 else b"".join(self.buffer)
        self.buffer = []
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        self.closed = True
        self.disarm()
        if self.transport is not None:
            self.transport.close()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.close()


class UpstreamResponse:
    """One answer: the status once its headers arrived, then the body as it comes."""

    __slots__ = ("_client", "_conn", "_done", "_read_timeout", "content", "status_code")

    def __init__(self, client: UpstreamClient | None, conn: _Connection | None, read_timeout: float | None,
                 *, status: int = 0, content: bytes = b"") -> None:
        self._client = client
        self._conn = conn
        self._read_timeout = read_timeout
        self._done = conn is None
        self.status_code = conn.status if conn is not None else status
        self.content = content

    @classmethod
    def read(cls, status: int, content: bytes) -> UpstreamResponse:
        """An answer already read whole (kept to be shown later, e.g. a pool's refusal)."""
        return cls(None, None, None, status=status, content=content)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; each piece is everything received since the previous one."""
        conn = self._conn
        if conn is None:
            if self.content:
                yield self.content
            return
        try:
            while True:
                if conn.buffer:
                    yield conn.take()
                    continue
                if conn.complete:
                    break
                if conn.error is not None:
                    raise conn.error
                await conn.wait(self._read_timeout)
        finally:
            await self.aclose()

    def set_read_timeout(self, seconds: float | None) -> None:
        """The longest silence allowed from now on (a stream that started may be held to a shorter one)."""
        self._read_timeout = seconds

    async def aread(self) -> bytes:
        """The whole body (read once; later calls return what was read)."""
        if self._done:
            return self.content
        parts = [piece async for piece in self.aiter_raw()]
        self.content = b"".join(parts)
        return self.content

    async def drain(self) -> bytes:
        """The rest of the answer (what arrived, if the connection breaks on the way), then closed: for an
        answer read only to be reported (a refusal)."""
        try:
            return await self.aread()
        except httpx.HTTPError:
            return b""
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        if self._client is not None and self._conn is not None:
            self._client._release(self._conn)


#: One upstream call of a request: ``opener(endpoint, body)`` -> the answer once its headers arrived.
Opener = Callable[[str, bytes], Awaitable[UpstreamResponse]]


class UpstreamClient:
    """Keep-alive connections per upstream origin (see the module doc)."""

    def __init__(self, *, timeout_s: float, connect_timeout_s: float = 5.0, max_connections: int = 1000,
                 keepalive_expiry_s: float = 30.0, ssl_context: ssl_mod.SSLContext | None = None) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._origins: dict[str, tuple[_Origin, bytes]] = {}
        self._ssl = ssl_context
        self._closed = False

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *, stream: bool,
                   read_timeout: float | None = None) -> UpstreamResponse:
        """Sends ``body``; returns once the answer's headers arrived (``stream=False``: the whole
        answer, in ``content``). ``read_timeout``: the longest silence allowed (default ``timeout_s``)."""
        if self._closed:
            raise httpx.ConnectError("the upstream client is closed")
        origin, path = self._origin(url)
        silence_s = self.timeout_s if read_timeout is None else read_timeout
        head = self._head(origin, path, headers, len(body))
        if self._slots is not None:
            await self._slots.acquire()
        try:
            response = await self._send(origin, head, body, silence_s)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        if not stream:
            await response.aread()
        return response

    async def _send(self, origin: _Origin, head: bytes, body: bytes, silence_s: float) -> UpstreamResponse:
        for attempt in (0, 1):
            conn = await self._checkout(origin)
            reused = conn.used
            conn.used = True
            conn.start(head, body)
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(silence_s)
            except httpx.RemoteProtocolError:
                conn.close()
                if reused and not conn.received and attempt == 0:
                    continue  # the server had closed this idle connection: once more, on a new one
                raise
            except BaseException:
                conn.close()
                raise
            return UpstreamResponse(self, conn, silence_s)
        raise AssertionError("unreachable")

    async def _checkout(self, origin: _Origin) -> _Connection:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or now - conn.idle_since > self.keepalive_expiry_s:
                conn.close()
                continue
            return conn
        loop = asyncio.get_running_loop()
        ssl = None
        if origin.scheme == "https":
            ssl = self._ssl or ssl_mod.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):  # not wait_for: it can lose a cancellation (3.11)
                _, conn = await loop.create_connection(lambda: _Connection(origin), origin.host, origin.port,
                                                       ssl=ssl, server_hostname=origin.host if ssl else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to the upstream within {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise httpx.ConnectError(f"the upstream refused the connection ({type(exc).__name__})") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        if self._slots is not None:
            self._slots.release()
        conn.disarm()
        if conn.complete and conn.keep_alive and not conn.closed and not self._closed and conn.error is None:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            conn.close()

    def _origin(self, url: str) -> tuple[_Origin, bytes]:
        known = self._origins.get(url)
        if known is not None:
            return known
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"not an http(s) upstream: {parts.scheme}://")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        default = (parts.scheme == "http" and port == 80) or (parts.scheme == "https" and port == 443)
        host = parts.hostname
        host_header = (f"[{host}]" if ":" in host else host) + ("" if default else f":{port}")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        origin = _Origin(parts.scheme, host, port, host_header.encode("ascii"))
        if len(self._origins) < 10_000:
            self._origins[url] = (origin, path.encode("ascii"))
        return origin, path.encode("ascii")

    @staticmethod
    def _head(origin: _Origin, path: bytes, headers: Mapping[str, str], length: int) -> bytes:
        lines = [b"POST ", path, b" HTTP/1.1\r\nhost: ", origin.host_header, b"\r\ncontent-length: ",
                 str(length).encode(), b"\r\n"]
        for name, value in headers.items():
            lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()



class HttpxUpstreamClient(UpstreamClient):
    """The same calls over httpx (``gateway.upstream_client: httpx``): the library arm ``baton bench gateway``
    weighs this module's client against (``baton-httpx``). httpx reads its read timeout once per body, so
    silence is watched here, around each read (a timer per piece: a stream that started can be held to a
    shorter silence, :meth:`UpstreamResponse.set_read_timeout`)."""

    def __init__(self, *, timeout_s: float, connect_timeout_s: float = 5.0, max_connections: int = 1000,
                 keepalive_expiry_s: float = 30.0) -> None:
        super().__init__(timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, max_connections=0,
                         keepalive_expiry_s=keepalive_expiry_s)
        limit = max_connections if max_connections > 0 else None
        self._httpx = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), trust_env=False,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit,
                                keepalive_expiry=keepalive_expiry_s))

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *, stream: bool,
                   read_timeout: float | None = None) -> UpstreamResponse:
        silence_s = self.timeout_s if read_timeout is None else read_timeout
        request = self._httpx.build_request(
            "POST", url, content=body, headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s, read=silence_s))
        response = HttpxUpstreamResponse(await self._httpx.send(request, stream=True), silence_s)
        if not stream:
            await response.aread()
        return response

    async def aclose(self) -> None:
        await self._httpx.aclose()


class HttpxUpstreamResponse(UpstreamResponse):
    """An httpx answer behind :class:`UpstreamResponse`'s methods."""

    __slots__ = ("_httpx",)

    def __init__(self, response: httpx.Response, read_timeout: float) -> None:
        super().__init__(None, None, read_timeout, status=response.status_code)
        self._httpx = response
        self._done = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        pieces = self._httpx.aiter_raw().__aiter__()
        try:
            while True:
                try:
                    async with asyncio.timeout(self._read_timeout):
                        piece = await pieces.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise httpx.ReadTimeout(f"no answer from the upstream for {self._read_timeout:g} s") from None
                yield piece
        finally:
            await self.aclose()

    async def aread(self) -> bytes:
        if not self._done:
            self.content = b"".join([piece async for piece in self.aiter_raw()])
        return self.content

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        await self._httpx.aclose()


def new_client(*, timeout_s: float, max_connections: int, library: str = "baton") -> UpstreamClient:
    """The upstream client of a gateway process (see :mod:`baton.api.gateway.upstream`); ``library="httpx"``:
    the same calls over httpx (the gateway bench's library arm)."""
    cls = HttpxUpstreamClient if library == "httpx" else UpstreamClient
    return cls(timeout_s=timeout_s, connect_timeout_s=5.0, max_connections=max_connections, keepalive_expiry_s=30.0)
