"""The gateway's upstream client against a raw asyncio HTTP server: keep-alive reuse, chunks that arrive
together handed over together, stale connections, timeouts and cut answers as httpx's errors."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest

from baton.api.gateway.upstream import HttpxUpstreamClient, UpstreamClient

#: Baton's client and the httpx one the gateway bench weighs it against (gateway.upstream_client): the same
#: failures, timeouts included, for the relays and the retry rules
CLIENTS = pytest.mark.parametrize("cls", [UpstreamClient, HttpxUpstreamClient], ids=["baton", "httpx"])

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.Server, str, list[int]]:
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions", accepted


async def _stream_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (req := await _read_request(reader)) is not None:
        assert req.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and b"x-request-id: r1" in req
        writer.write(HEAD + _chunked(b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"))
        await writer.drain()


def test_a_streamed_answer_arrives_whole_in_one_piece_and_the_connection_is_reused() -> None:
    async def go() -> None:
        server, url, accepted = await _serve(_stream_forever)
        client = UpstreamClient(timeout_s=5)
        try:
            for _ in range(3):
                r = await client.post(url, b'{"x":1}', {"x-request-id": "r1"}, stream=True)
                assert r.status_code == 200
                pieces = [p async for p in r.aiter_raw()]
                assert pieces == [b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"]  # sent together, relayed together
            assert len(accepted) == 1
        finally:
            await client.aclose()
            server.close()

    asyncio.run(go())


def test_pieces_that_arrive_apart_are_handed_over_apart() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(HEAD)
        for part in (b"data: a\n\n", b"data: b\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def go() -> None:
        server, url, _ = await _serve(slow)
        client = UpstreamClient(timeout_s=5)
        try:
            r = await client.post(url, b"{}", {"x-request-id": "r1"}, stream=True)
            assert [p async for p in r.aiter_raw()] == [b"data: a\n\n", b"data: b\n\n"]
        finally:
            await client.aclose()
            server.close()

    asyncio.run(go())


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()

    async def go() -> None:
        server, url, accepted = await _serve(one_then_close)
        client = UpstreamClient(timeout_s=5)
        try:
            for _ in range(2):
                r = await client.post(url, b"{}", {}, stream=False)
                assert (r.status_code, r.content) == (200, b"{}")
                await asyncio.sleep(0.05)  # the server's close reaches the idle connection
            assert len(accepted) == 2
        finally:
            await client.aclose()
            server.close()

    asyncio.run(go())


def test_a_body_left_unread_closes_its_connection() -> None:
    async def in_two_parts(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader) is not None:
            writer.write(HEAD + b"9\r\ndata: 1\n\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(_chunked(b"data: [DONE]\n\n"))
            await writer.drain()

    async def go() -> None:
        server, url, accepted = await _serve(in_two_parts)
        client = UpstreamClient(timeout_s=5)
        try:
            r = await client.post(url, b"{}", {"x-request-id": "r1"}, stream=True)
            await r.aclose()
            r = await client.post(url, b"{}", {"x-request-id": "r1"}, stream=True)
            assert b"[DONE]" in b"".join([p async for p in r.aiter_raw()])
            assert len(accepted) == 2
        finally:
            await client.aclose()
            server.close()

    asyncio.run(go())


@CLIENTS
@pytest.mark.parametrize("when", ["before the answer", "mid-stream"])
def test_silence_is_a_read_timeout(when: str, cls: type[UpstreamClient]) -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if when == "mid-stream":
            writer.write(HEAD + b"9\r\ndata: 1\n\n\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    async def go() -> None:
        server, url, _ = await _serve(stall)
        client = cls(timeout_s=5)
        try:
            with pytest.raises(httpx.ReadTimeout):
                r = await client.post(url, b"{}", {}, stream=True, read_timeout=0.2)
                assert when == "mid-stream"
                async for piece in r.aiter_raw():
                    assert piece == b"data: 1\n\n"
        finally:
            await client.aclose()
            server.close()

    asyncio.run(go())


@CLIENTS
def test_an_answer_cut_mid_way_is_a_protocol_error(cls: type[UpstreamClient]) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(HEAD + b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()

    async def go() -> None:
        server, url, _ = await _serve(cut)
        client = cls(timeout_s=5)
        try:
            r = await client.post(url, b"{}", {}, stream=True)
            got = []
            with pytest.raises(httpx.RemoteProtocolError):
                async for piece in r.aiter_raw():
                    got.append(piece)
            assert got == [b"data: 1\n\n"]
        finally:
            await client.aclose()
            server.close()

    asyncio.run(go())


@CLIENTS
def test_an_unreachable_upstream_is_a_connect_error(cls: type[UpstreamClient]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused

        async def go() -> None:
            client = cls(timeout_s=5)
            with pytest.raises(httpx.ConnectError):
                await client.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {}, stream=True)

        asyncio.run(go())


@CLIENTS
def test_silence_counts_from_the_last_piece_and_a_shorter_limit_applies_at_once(cls: type[UpstreamClient]) -> None:
    """The silence limit, shortened from 3 s to 0.4 s after the first piece, ends the 1.2 s pause after the
    eighth (a timer still set for the 3 s limit would let the ninth piece through), while pieces 0.1 s apart
    for 0.8 s in all pass (the connection's one timer waits on for each new deadline)."""
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(HEAD)
        for _ in range(8):
            writer.write(b"9\r\ndata: 1\n\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.2)
        writer.write(b"9\r\ndata: 2\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def go() -> None:
        server, url, _ = await _serve(trickle)
        client = cls(timeout_s=5)
        got: list[bytes] = []
        try:
            r = await client.post(url, b"{}", {}, stream=True, read_timeout=3.0)
            with pytest.raises(httpx.ReadTimeout):
                async for piece in r.aiter_raw():
                    got.append(piece)
                    r.set_read_timeout(0.4)
        finally:
            await client.aclose()
            server.close()
        assert b"".join(got) == b"data: 1\n\n" * 8

    asyncio.run(go())
