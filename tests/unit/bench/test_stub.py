"""The bench stub writes a stream as an engine does: one write per token (so a relay sees every token), or
the whole body at once when batched."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from baton.bench import stub


async def _reads(batched: bool, n: int) -> tuple[list[bytes], list[dict]]:
    """The socket reads of one streamed answer, as they arrived, and its SSE events."""
    stub.configure(token_gap_ms=20, batched=batched)
    server = await stub.serve()
    port = server.sockets[0].getsockname()[1]
    body = orjson.dumps({"model": "m", "messages": [], "max_tokens": n, "stream": True,
                         "stream_options": {"include_usage": True}})
    reads: list[bytes] = []
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        while piece := await reader.read(65536):
            reads.append(piece)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
        stub.configure()
    whole = b"".join(reads)
    events = [orjson.loads(line[line.index(b"{"):]) for line in whole.split(b"\n") if line.startswith(b"data: {")]
    return reads, events


@pytest.mark.parametrize("batched", [False, True])
def test_a_stream_is_one_write_per_token_unless_batched(batched: bool) -> None:
    reads, events = asyncio.run(_reads(batched, 6))
    tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(tokens) == 6 and events[-1]["usage"]["completion_tokens"] == 6
    if batched:
        assert len(reads) == 1  # head and whole body in one write
    else:
        assert len(reads) >= 6 + 2  # role, 6 tokens, usage, [DONE]: each arrives on its own
        assert all(r.count(b"data: ") <= 1 for r in reads)


def test_a_negative_gap_is_refused() -> None:
    with pytest.raises(ValueError):
        stub.configure(token_gap_ms=-1)
