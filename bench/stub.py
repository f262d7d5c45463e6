"""A zero-latency OpenAI-compatible upstream: answers every chat/completions request at once with
``max_tokens`` streamed chunks (one token each), so that a benchmark through a gateway measures the
gateway and nothing else.

Streams are written as an engine writes them: each token its own write, ``token_gap_ms`` apart (default
1 ms), so a relay in between sees (and pays for) every token and a client's inter-token latency is the
gap plus what the relay adds. ``batched`` writes the whole body at once (a relay's cheapest case; it is
not a measure of per-token latency).

A raw asyncio HTTP/1.1 server (keep-alive, chunked SSE), far cheaper per request than the gateway it
sits behind. Run it as ``python -m baton.bench.stub --port 9100`` or in-process with :func:`serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

TOKEN = " tok"  # noqa: S105 - the text of one streamed token
TOKEN_ID = 1000  # its id


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


#: How streams are written (:func:`configure`).
_MODE: dict[str, Any] = {"token_gap_s": 0.001, "batched": False}


def configure(*, token_gap_ms: float = 1.0, batched: bool = False) -> None:
    """Sets how this process's stub writes streams (see the module docstring)."""
    if token_gap_ms < 0:
        raise ValueError("token_gap_ms must be >= 0")
    _MODE.update(token_gap_s=token_gap_ms / 1000, batched=batched)


def stream_parts(req: dict[str, Any], chat: bool) -> list[bytes]:
    """The chunked-encoding frames of one request's SSE body, one per event, the terminator last. With
    ``return_token_ids`` (the gateway asks for them to resume streams) the events carry token ids as vLLM's
    do: the prompt's on the first event, each token's on its chunk."""
    n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
    model = str(req.get("model", "stub"))
    created = int(time.time())
    rid = "cmpl-stub"
    obj_name = "chat.completion.chunk" if chat else "text_completion"
    prompt = req.get("messages") or req.get("prompt") or ""
    prompt_tokens = max(1, len(json.dumps(prompt)) // 4)
    ids = bool(req.get("return_token_ids"))
    prompt_ids = list(range(1, prompt_tokens + 1))
    parts = []
    if chat:
        first: dict[str, Any] = {"id": rid, "object": obj_name, "created": created, "model": model,
                                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}]}
        if ids:
            first["prompt_token_ids"] = prompt_ids
        parts.append(_sse(first))
    for i in range(n):
        last = i == n - 1
        choice: dict[str, Any] = ({"index": 0, "delta": {"content": TOKEN}} if chat else {"index": 0, "text": TOKEN})
        choice["logprobs"] = None
        choice["finish_reason"] = "length" if last else None
        if ids:
            choice["token_ids"] = [TOKEN_ID]
            if not chat and i == 0:
                choice["prompt_token_ids"] = prompt_ids
        parts.append(_sse({"id": rid, "object": obj_name, "created": created, "model": model, "choices": [choice]}))
    if (req.get("stream_options") or {}).get("include_usage"):
        parts.append(_sse({"id": rid, "object": obj_name, "created": created, "model": model, "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                     "total_tokens": prompt_tokens + n}}))
    parts.append(b"data: [DONE]\n\n")
    return [*(_chunk(p) for p in parts), b"0\r\n\r\n"]


def stream_body(req: dict[str, Any], chat: bool) -> bytes:
    """The whole chunked-encoded SSE body for one request."""
    return b"".join(stream_parts(req, chat))


async def _write_stream(writer: asyncio.StreamWriter, req: dict[str, Any], chat: bool) -> None:
    """Each event its own write and drain, ``token_gap_s`` apart (or, batched, the whole body at once)."""
    head = _response("200 OK", b"text/event-stream", b"", chunked=True)
    if _MODE["batched"]:
        writer.write(head + stream_body(req, chat))
        return
    gap = _MODE["token_gap_s"]
    writer.write(head)
    for frame in stream_parts(req, chat):
        writer.write(frame)
        await writer.drain()
        if gap:
            await asyncio.sleep(gap)


def json_body(req: dict[str, Any], chat: bool) -> bytes:
    n = int(req.get("max_tokens") or 16)
    text = TOKEN * n
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
              if chat else {"index": 0, "text": text, "finish_reason": "length"})
    return json.dumps({"id": "cmpl-stub", "object": "chat.completion" if chat else "text_completion",
                       "created": int(time.time()), "model": req.get("model", "stub"), "choices": [choice],
                       "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}).encode()


def _response(status: str, ctype: bytes, body: bytes, *, chunked: bool = False) -> bytes:
    head = b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype + b"\r\n"
    if chunked:
        head += b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
    else:
        head += b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    return head + body


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            lines = head.split(b"\r\n")
            try:
                method, path, _ = lines[0].split(b" ", 2)
            except ValueError:
                return
            length = 0
            close = False
            for h in lines[1:]:
                name, _, value = h.partition(b":")
                lname = name.strip().lower()
                if lname == b"content-length":
                    length = int(value.strip() or 0)
                elif lname == b"connection" and value.strip().lower() == b"close":
                    close = True
            body = await reader.readexactly(length) if length else b""
            path = path.split(b"?", 1)[0]
            if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
                chat = path.endswith(b"/chat/completions")
                try:
                    req = json.loads(body or b"{}")
                except ValueError:
                    writer.write(_response("400 Bad Request", b"application/json",
                                           b'{"error":{"message":"bad json","type":"invalid_request_error"}}'))
                else:
                    if req.get("stream"):
                        await _write_stream(writer, req, chat)
                    else:
                        writer.write(_response("200 OK", b"application/json", json_body(req, chat)))
            elif method == b"POST" and path == b"/v1/traces":  # an OTLP/HTTP sink for the gateway's spans
                writer.write(_response("200 OK", b"application/x-protobuf", b""))
            elif path.endswith(b"/models"):
                writer.write(_response("200 OK", b"application/json",
                                       b'{"object":"list","data":[{"id":"stub","object":"model","owned_by":"baton"}]}'))
            elif path in (b"/health", b"/healthz", b"/"):
                writer.write(_response("200 OK", b"application/json", b"{}"))
            else:
                writer.write(_response("404 Not Found", b"application/json", b'{"error":{"message":"not found"}}'))
            await writer.drain()
            if close:
                return
    finally:
        writer.close()


async def serve(host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Starts the stub on the running loop; the bound port is ``server.sockets[0].getsockname()[1]``."""
    return await asyncio.start_server(_handle, host, port, backlog=1024)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Zero-latency OpenAI-compatible streaming upstream.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9100)
    p.add_argument("--token-gap-ms", type=float, default=1.0,
                   help="Pause between a stream's token writes (each token is its own write).")
    p.add_argument("--batched", action="store_true", help="Write each stream's whole body at once.")
    args = p.parse_args(argv)
    configure(token_gap_ms=args.token_gap_ms, batched=args.batched)

    async def _main() -> None:
        server = await serve(args.host, args.port)
        async with server:
            await server.serve_forever()

    try:
        import uvloop

        uvloop.run(_main())
    except ImportError:
        asyncio.run(_main())


if __name__ == "__main__":
    main()
