"""A small asyncio Redis client (RESP2) that runs the rate limiter's Lua scripts on one pipelined connection.

redis-py's asyncio client spends about 0.15-0.3 ms of CPU per command in Python (connection pool
checkout and release, retry and timeout wrappers, event dispatch, observability hooks, the parser):
more than a whole gateway request should cost. The gateway's hot path sends only ``EVALSHA``; here a
command is one write on a shared connection and its reply is parsed in ``data_received`` (RESP2),
with any number of commands in flight, answered in order; the commands of one turn of the event loop go
out in one write (so under load Redis reads many with one system call).

:func:`lean_scripts` builds one from a ``redis.asyncio.Redis`` client's own connection settings when
that client talks plain TCP (host, port, db, username, password, socket timeouts); for anything else
(TLS, Unix sockets, a cluster, a test double) it returns None and the limiter keeps redis-py's
scripts. A script the server does not know yet (``NOSCRIPT``) is sent once with ``EVAL``. Failures are
``ConnectionError`` / ``TimeoutError`` / :class:`RedisReplyError`, which the limiter already treats as
"Redis is unavailable".
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import Connection

_CRLF = b"\r\n"


class RedisReplyError(Exception):
    """An error reply (``-ERR ...``)."""


class _Incomplete(Exception):
    pass


def _parse(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply from ``buf[pos:]``: (value, next position); :class:`_Incomplete` if cut short."""
    end = buf.find(_CRLF, pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    line = bytes(buf[pos + 1:end])
    nxt = end + 2
    if kind == 58:  # ':'
        return int(line), nxt
    if kind == 42:  # '*'
        n = int(line)
        if n < 0:
            return None, nxt
        items = []
        for _ in range(n):
            item, nxt = _parse(buf, nxt)
            items.append(item)
        return items, nxt
    if kind == 36:  # '$'
        n = int(line)
        if n < 0:
            return None, nxt
        if len(buf) < nxt + n + 2:
            raise _Incomplete
        return bytes(buf[nxt:nxt + n]), nxt + n + 2
    if kind == 43:  # '+'
        return line, nxt
    if kind == 45:  # '-'
        return RedisReplyError(line.decode("utf-8", "replace")), nxt
    raise ConnectionError(f"unexpected Redis reply type {chr(kind)!r}")


def _command(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.lost = False
        self.out: list[bytes] = []  # commands queued in this turn of the event loop, written together
        self.flushing = False

    def send(self, data: bytes) -> None:
        """Queues a command; everything queued in one turn of the event loop goes out in one write."""
        self.out.append(data)
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        if self.out and self.transport is not None and not self.lost:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        pos = 0
        buf = self.buf
        try:
            while pos < len(buf) and self.waiting:
                value, pos = _parse(buf, pos)
                fut = self.waiting.popleft()
                if not fut.done():
                    fut.set_result(value)
        except _Incomplete:
            pass
        except (ValueError, ConnectionError) as exc:
            self._fail(ConnectionError(f"unreadable Redis reply ({exc})"))
            return
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(ConnectionError("the Redis connection was lost"))

    def _fail(self, exc: BaseException) -> None:
        self.lost = True
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class LeanScripts:
    """``EVALSHA`` over one connection, opened on first use and again after a failure."""

    def __init__(self, *, host: str, port: int, db: int = 0, username: str | None = None,
                 password: str | None = None, timeout_s: float | None = 5.0,
                 connect_timeout_s: float | None = 2.0) -> None:
        self._host, self._port, self._db = host, port, db
        self._username, self._password = username, password
        self._timeout = timeout_s
        self._connect_timeout = connect_timeout_s
        self._proto: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    def script(self, source: str) -> Script:
        return Script(self, source)

    async def call(self, *parts: bytes | str | int) -> Any:
        [value] = await self.call_many([parts])
        if isinstance(value, RedisReplyError):
            raise value
        return value

    async def call_many(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        """Several commands sent together; their replies in order, an error reply as a :class:`RedisReplyError`
        value (not raised). A lost connection or a timeout raises for all of them."""
        proto = self._proto
        if proto is None or proto.lost:
            proto = await self._connect()
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Any]] = []
        for parts in commands:
            fut: asyncio.Future[Any] = loop.create_future()
            proto.waiting.append(fut)
            proto.send(_command(*parts))
            futs.append(fut)
        timer = loop.call_later(self._timeout, self._timed_out, proto, futs[-1]) if self._timeout else None
        try:
            return [await fut for fut in futs]
        except BaseException:
            for fut in futs:  # failed together (the connection is gone): retrieved, so none is logged
                if fut.done() and not fut.cancelled():
                    fut.exception()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _timed_out(self, proto: _Protocol, fut: asyncio.Future[Any]) -> None:
        if not fut.done():
            # Replies come in order: a late one would answer the next command. Start over.
            proto._fail(TimeoutError("Redis did not answer in time"))

    async def _connect(self) -> _Protocol:
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            async with asyncio.timeout(self._connect_timeout):  # not wait_for: it can lose a cancellation (3.11)
                _, proto = await loop.create_connection(_Protocol, self._host, self._port)
            hello: list[tuple[bytes | str | int, ...]] = []
            if self._password is not None:
                hello.append(("AUTH", self._username, self._password) if self._username
                             else ("AUTH", self._password))
            if self._db:
                hello.append(("SELECT", self._db))
            self._proto = proto
            for parts in hello:
                await self.call(*parts)
            self._connecting.set_result(proto)
            return proto
        except BaseException as exc:
            self._proto = None
            err = exc if isinstance(exc, Exception) else ConnectionError("Redis connection interrupted")
            self._connecting.set_exception(err)
            self._connecting.exception()  # retrieved: waiters raise it themselves
            raise
        finally:
            self._connecting = None

    async def aclose(self) -> None:
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None


class Script:
    """Called like redis-py's registered scripts: ``await script(keys=[...], args=[...])``."""

    def __init__(self, client: LeanScripts, source: str) -> None:
        self._client = client
        self._source = source
        self._sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[int | str] = ()) -> Any:
        [value] = await self.many([(keys, args)])
        if isinstance(value, RedisReplyError):
            raise value
        return value

    async def many(self, calls: Sequence[tuple[Sequence[str], Sequence[int | str]]]) -> list[Any]:
        """The script run once per ``(keys, args)``, all sent together; the replies in order (an error reply
        as a :class:`RedisReplyError` value)."""
        out = await self._client.call_many([("EVALSHA", self._sha, len(k), *k, *a) for k, a in calls])
        unknown = [i for i, v in enumerate(out) if isinstance(v, RedisReplyError) and str(v).startswith("NOSCRIPT")]
        if unknown:
            again = await self._client.call_many(
                [("EVAL", self._source, len(calls[i][0]), *calls[i][0], *calls[i][1]) for i in unknown])
            for i, v in zip(unknown, again, strict=True):
                out[i] = v
        return out


def lean_scripts(redis: Any) -> LeanScripts | None:
    """A :class:`LeanScripts` on the same server as ``redis`` (a ``redis.asyncio.Redis``), or None when
    that client is not a plain TCP connection this module can reproduce."""
    try:
        pool = redis.connection_pool
        if pool.connection_class is not Connection:
            return None
        kw = pool.connection_kwargs
        if kw.get("credential_provider") is not None or kw.get("redis_connect_func") is not None:
            return None
        return LeanScripts(host=kw.get("host") or "localhost", port=int(kw.get("port") or 6379),
                           db=int(kw.get("db") or 0), username=kw.get("username"), password=kw.get("password"),
                           timeout_s=kw.get("socket_timeout") or 5.0,
                           connect_timeout_s=kw.get("socket_connect_timeout") or kw.get("socket_timeout") or 2.0)
    except (AttributeError, TypeError, ValueError, ImportError):
        return None
