"""A tiny OpenAI-compatible server used as the gateway's upstream where the engine itself is not the
thing under test. It speaks real HTTP (run by uvicorn) and answers like vLLM's server: chat and text
completions, streaming with one token per chunk, ``stream_options.include_usage``, and embeddings.

Knobs travel in the request body (the gateway passes unknown fields through):
``stub_token_delay`` (seconds between chunks), ``stub_cut_after`` (drop the connection after N
chunks), ``stub_status`` (answer with this HTTP error). ``GET /_last`` returns the last body received.

Run alone: ``python -m tests.integration.gateway.stub_upstream --port 9100``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

PROMPT_TOKENS = 7

_last: dict[str, Any] = {}


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10_000 else default


async def completions(request: Request) -> Response:
    body = await _body(request)
    _last.clear()
    _last.update(body=body, headers=dict(request.headers), path=request.url.path)
    chat = request.url.path.endswith("chat/completions")
    status = body.get("stub_status")
    if isinstance(status, int) and 400 <= status < 600:
        return _json({"error": {"message": "stub refused", "type": "BadRequestError", "param": None,
                                "code": status}}, status)
    n_tokens = min(_int(body.get("max_tokens") or body.get("max_completion_tokens"), 8), 64)
    model = body.get("model", "stub")
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{int(time.time() * 1e6)}"
    usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n_tokens, "total_tokens": PROMPT_TOKENS + n_tokens,
             "prompt_tokens_details": {"cached_tokens": 0}}
    if not body.get("stream"):
        text = "tok " * n_tokens
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        return _json({"id": rid, "object": "chat.completion" if chat else "text_completion",
                      "created": int(time.time()), "model": model, "choices": [choice], "usage": usage})

    delay = body.get("stub_token_delay")
    delay = float(delay) if isinstance(delay, int | float) and 0 <= delay <= 5 else 0.0
    cut = body.get("stub_cut_after")
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choice: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({"id": rid, "object": obj, "created": 0, "model": model,
                                         "choices": [choice]}) + b"\n\n"

    async def events():  # type: ignore[no-untyped-def]
        if chat:
            yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        for i in range(n_tokens):
            if isinstance(cut, int) and i >= cut:
                raise RuntimeError("stub cut the stream")  # uvicorn drops the connection mid-body
            if delay:
                await asyncio.sleep(delay)
            yield chunk({"index": 0, "delta": {"content": "tok "}, "finish_reason": None} if chat
                        else {"index": 0, "text": "tok ", "finish_reason": None})
        yield chunk({"index": 0, "delta": {}, "finish_reason": "length"} if chat
                    else {"index": 0, "text": "", "finish_reason": "length"})
        if include_usage:
            yield b"data: " + orjson.dumps({"id": rid, "object": obj, "created": 0, "model": model, "choices": [],
                                            "usage": usage}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


#: Tokens the stub counts per embedding input, and the dimensions of its vectors.
EMBED_TOKENS_PER_INPUT = 3
EMBED_DIMS = 4


async def embeddings(request: Request) -> Response:
    body = await _body(request)
    _last.clear()
    _last.update(body=body, headers=dict(request.headers), path=request.url.path)
    value = body.get("input")
    inputs = [value] if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)) \
        else value if isinstance(value, list) else []
    tokens = EMBED_TOKENS_PER_INPUT * len(inputs)
    data = [{"object": "embedding", "index": i, "embedding": [0.5] * EMBED_DIMS} for i in range(len(inputs))]
    return _json({"id": f"embd-{int(time.time() * 1e6)}", "object": "list", "created": int(time.time()),
                  "model": body.get("model", "stub"), "data": data,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


async def models(request: Request) -> Response:
    return _json({"object": "list", "data": []})


async def last(request: Request) -> Response:
    return _json(_last)


app = Starlette(routes=[
    Route("/v1/chat/completions", completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/models", models),
    Route("/_last", last),
])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
