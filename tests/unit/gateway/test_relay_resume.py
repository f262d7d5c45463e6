"""Decode-failure recovery in the gateway's relay, against a real scripted HTTP upstream.

The upstream (uvicorn in a thread) answers like vLLM with ``return_token_ids``: a deterministic "model"
whose next token depends on every token before it, so a continuation from the wrong point (a lost,
repeated or reordered token) changes everything after it. The script cuts streams at chosen points in
the ways a dying replica does: a dropped connection, an ``{"error": ...}`` chunk, an SSE ``error``
event, an end without ``finish_reason``, a 503 before the stream.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from baton.api.gateway.attempts import Attempts, FailoverOpener, PoolHealth, ResumePolicy, continuation_body, resumable
from baton.api.gateway.metering import Outcome
from baton.api.gateway.relay import ResumingRelay, TokenStall, _Stream
from baton.api.gateway.upstream import Opener, UpstreamClient, UpstreamResponse
from baton.core import models as m

# -- the scripted upstream -----------------------------------------------------------------------

#: One entry per upstream request, in order: (mode, after) with mode in "ok", "drop", "error_chunk",
#: "error_event", "eof", "no_finish", "status503"; `after` = tokens sent before the cut.
SCRIPT: list[tuple[str, int]] = []
#: How long "silent" and "stall" keep the upstream quiet (the relay's read timeout is far shorter).
STALL_S = 6.0
BODIES: list[dict[str, Any]] = []
PATHS: list[str] = []  # the path of each upstream request, in order
FALLBACK_SCRIPT: list[tuple[str, int]] = []  # the same, for calls to the fallback pool (default: "ok")
PACE_S = [0.0]  # the upstream's wait between tokens (a model generates them one by one)


def next_token(ids: list[int]) -> int:
    h = 7
    for t in ids:
        h = (h * 31 + t) % 1_000_003
    return 100 + h % 900


def generate(prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(next_token(prompt + out))
    return out


def tokenize(text: str) -> list[int]:
    return [1, *text.encode()]


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _serve(request: Request) -> Response:
    body = orjson.loads(await request.body())
    BODIES.append(body)
    PATHS.append(request.url.path)
    script = FALLBACK_SCRIPT if request.url.path.startswith("/fallback/") else SCRIPT
    mode, after = script.pop(0) if script else ("ok", 0)
    if mode == "status503":
        return Response(b'{"error":{"message":"no replica","code":503}}', status_code=503)
    if mode in ("silent", "held503"):  # a stalled replica, or a call held by Serve's proxy: no answer for long
        await asyncio.sleep(STALL_S)
        if mode == "held503":
            return Response(b'{"error":{"message":"no replica","code":503}}', status_code=503)
    chat = request.url.path.endswith("chat/completions")
    if chat:
        prompt = tokenize("".join(msg["content"] for msg in body["messages"]))
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 12
    else:
        p = body["prompt"]
        prompt = tokenize(p) if isinstance(p, str) else list(p)
        limit = body.get("max_tokens", 16)
    ids_on = bool(body.get("return_token_ids"))
    tokens = generate(prompt, limit)
    rid, created = f"up-{uuid.uuid4().hex[:8]}", int(time.time())

    def chunk(tok: int | None, *, first: bool = False, finish: str | None = None,
              text: str | None = None) -> dict[str, Any]:
        text = f"<{tok}>" if text is None else text
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if tok is None else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if ids_on and tok is not None:
                choice["token_ids"] = [tok]
            obj: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created,
                                   "model": body["model"], "choices": [choice]}
            if ids_on and first:
                obj["prompt_token_ids"] = prompt
            return obj
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if ids_on:
            choice["token_ids"] = [tok]
            if first:
                choice["prompt_token_ids"] = prompt
        return {"id": rid, "object": "text_completion", "created": created, "model": body["model"],
                "choices": [choice]}

    async def events() -> AsyncIterator[bytes]:
        if chat:
            yield _sse(chunk(None, first=True))
        for i, tok in enumerate(tokens):
            if mode == "held_drop" and i == after - 1:
                # a detokenizer holding this token's text back (half a character): ids, no text yet
                yield _sse(chunk(tok, first=not chat and i == 0, text=""))
                continue
            if mode == "held_drop" and i == after:
                raise RuntimeError("replica died")
            if mode == "stall" and i == after:
                await asyncio.sleep(STALL_S)  # then it would go on: a SIGSTOPped replica continued
            elif mode not in ("ok", "silent", "stall", "held_drop") and i == after:
                if mode == "drop":
                    raise RuntimeError("replica died")
                if mode == "error_chunk":
                    yield _sse({"error": {"message": "actor died", "code": 500}})
                    yield b"data: [DONE]\n\n"
                elif mode == "error_event":
                    yield b"event: error\ndata: " + orjson.dumps({"error": {"message": "x"}}) + b"\n\n"
                elif mode == "no_finish":
                    yield b"data: [DONE]\n\n"
                return  # "eof": a clean end in the middle
            yield _sse(chunk(tok, first=not chat and i == 0, finish="length" if i == len(tokens) - 1 else None))
            await asyncio.sleep(PACE_S[0])
        yield _sse({"id": rid, "object": "x", "created": created, "model": body["model"], "choices": [],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                              "total_tokens": len(prompt) + len(tokens)}})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


APP = Starlette(routes=[Route("/v1/chat/completions", _serve, methods=["POST"]),
                        Route("/v1/completions", _serve, methods=["POST"]),
                        # a deployment's fallback pool (a P/D deployment's prefill engine)
                        Route("/fallback/v1/chat/completions", _serve, methods=["POST"]),
                        Route("/fallback/v1/completions", _serve, methods=["POST"])])


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(APP, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(5)


@pytest.fixture(autouse=True)
def _clean() -> None:
    SCRIPT.clear()
    BODIES.clear()
    PATHS.clear()
    FALLBACK_SCRIPT.clear()
    PACE_S[0] = 0.0


# -- driving the relay ---------------------------------------------------------------------------

POLICY = ResumePolicy(attempts=4, budget_s=10, backoff_s=0.01)


async def _relay(base: str, endpoint: str, payload: dict[str, Any], *, policy: ResumePolicy = POLICY,
                 client_usage: bool = True, client_ids: bool = False, read_timeout: float = 10,
                 fallback: str | None = None, health: PoolHealth | None = None,
                 stall: TokenStall | None = None,
                 sends: list[bytes] | None = None) -> tuple[list[dict[str, Any]], bytes, Outcome]:
    """One streamed request through the gateway's own parts: its upstream client, the first call with its
    retries (:class:`Attempts`) and the relay."""
    payload = {**payload, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
               "cache_salt": "salt-1"}
    body = orjson.dumps(payload)
    outcome = Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model="m",
                      endpoint=endpoint, stream=True, started=time.time(), start_pc=time.perf_counter())
    client = UpstreamClient(timeout_s=read_timeout)
    try:
        opener: Opener = _opener(client, base, read_timeout)
        if fallback is not None:
            opener = FailoverOpener(opener, _opener(client, fallback, read_timeout), health or PoolHealth(), base,
                                    outcome)
        attempts = Attempts(opener, endpoint, body, policy=policy, outcome=outcome)
        first, _ = await attempts.first()
        assert first is not None and first.status_code == 200
        done: list[Outcome] = []
        relay = ResumingRelay(first, outcome, strip_usage=not client_usage, headers=[], done=done.append,
                              attempts=attempts, payload=payload, client_ids=client_ids, stall=stall)
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if sends is not None:
                sends.append(message.get("body", b""))

        await relay({"type": "http"}, receive, send)
        await asyncio.sleep(0.01)
    finally:
        await client.aclose()
    assert len(done) == 1 and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    raw = b"".join(msg.get("body", b"") for msg in sent)
    events = [orjson.loads(ev[6:]) for ev in raw.split(b"\n\n") if ev.startswith(b"data: {")]
    return events, raw, done[0]


def _opener(client: UpstreamClient, url: str, read_timeout: float = 10) -> Opener:
    def call(ep: str, content: bytes) -> Awaitable[UpstreamResponse]:
        return client.post(f"{url}/{ep}", content, {"content-type": "application/json"}, stream=True,
                           read_timeout=read_timeout)
    return call


def _tokens(events: list[dict[str, Any]], chat: bool) -> list[int]:
    out: list[int] = []
    for ev in events:
        for c in ev.get("choices") or []:
            text = (c.get("delta") or {}).get("content") if chat else c.get("text")
            out.extend(int(p) for p in (text or "").replace(">", "").split("<") if p)
    return out


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12,
        "temperature": 0.7, "seed": 5, "stop": ["zz"]}
COMPLETION = {"model": "m", "prompt": "once upon", "max_tokens": 10, "temperature": 0}


def test_an_undisturbed_stream_is_relayed_with_token_ids_stripped(upstream: str) -> None:
    events, raw, o = asyncio.run(_relay(upstream, "chat/completions", CHAT))
    expected = generate(tokenize("hello there"), 12)
    assert _tokens(events, chat=True) == expected
    assert b"token_ids" not in raw and raw.endswith(b"data: [DONE]\n\n") and b"error" not in raw
    assert events[-1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 12, "total_tokens": 24}
    assert o.status is m.RequestStatus.COMPLETED and o.recovery_steps == [] and len(BODIES) == 1


@pytest.mark.parametrize("mode", ["drop", "error_chunk", "error_event", "eof", "no_finish"])
@pytest.mark.parametrize("after", [0, 1, 5, 11])
def test_a_chat_stream_cut_anywhere_resumes_with_the_exact_tokens(upstream: str, mode: str, after: int) -> None:
    SCRIPT.append((mode, after))
    events, raw, o = asyncio.run(_relay(upstream, "chat/completions", CHAT))
    prompt = tokenize("hello there")
    assert _tokens(events, chat=True) == generate(prompt, 12)  # no token lost, repeated or reordered
    assert b"token_ids" not in raw and b"error" not in raw and raw.count(b"[DONE]") == 1
    # The client's stream keeps one id, one role chunk, one finish and one usage report.
    assert {ev["id"] for ev in events} == {events[0]["id"]} and {ev["object"] for ev in events} == {
        "chat.completion.chunk"}
    assert sum(1 for ev in events for c in ev["choices"] if "role" in c["delta"]) == 1
    assert [c["finish_reason"] for ev in events for c in ev["choices"] if c["finish_reason"]] == ["length"]
    assert events[-1]["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 12,
                                   "total_tokens": len(prompt) + 12}
    assert (o.status, o.prompt_tokens, o.completion_tokens) == (m.RequestStatus.COMPLETED, len(prompt), 12)
    # The continuation: /completions on prompt + sent ids, same sampling and salt, fewer tokens.
    resumed = BODIES[1]
    assert resumed["prompt"] == prompt + generate(prompt, after) and resumed["max_tokens"] == 12 - after
    assert (resumed["temperature"], resumed["seed"], resumed["stop"], resumed["cache_salt"]) == (
        0.7, 5, ["zz"], "salt-1")
    assert [(s["step"], s["outcome"]) for s in o.recovery_steps] == [("decode_resume", "recovered")]
    assert {"at_ms", "duration_ms", "detail"} <= set(o.recovery_steps[0])


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_resumed_stream_relays_each_token_as_it_comes(upstream: str, endpoint: str) -> None:
    # The continuation is a /completions stream whatever the client asked: a relay that looked for a chat
    # chunk's text where a completion has none held every resumed token back until the finish, and the
    # client saw the rest of its answer in one burst at the end (a stall of the whole continuation's time).
    chat = endpoint == "chat/completions"
    PACE_S[0] = 0.02
    SCRIPT.append(("drop", 3))
    sends: list[bytes] = []
    events, _, o = asyncio.run(_relay(upstream, endpoint, CHAT if chat else COMPLETION, sends=sends))
    n = 12 if chat else 10
    assert len(_tokens(events, chat=chat)) == n and o.recovery_steps[0]["outcome"] == "recovered"
    carrying = [body for body in sends if b'"finish_reason":null' in body]
    assert len(carrying) >= n - 2, [len(b) for b in sends]  # the tokens went out one by one, resumed ones too
    resumed_first = next(i for i, body in enumerate(sends) if i > 3 and b'"finish_reason":null' in body)
    finish = next(i for i, body in enumerate(sends) if b'"finish_reason":"length"' in body)
    assert resumed_first < finish
    # the request record says what the client waited across the break (last token before, first after)
    [resume] = [s for s in o.recovery_steps if s["step"] == "decode_resume"]
    assert resume["client_gap_ms"] > 0


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
@pytest.mark.parametrize("after", [1, 4])
def test_a_token_whose_text_is_held_back_is_not_sent_before_its_text(upstream: str, endpoint: str,
                                                                       after: int) -> None:
    # The engine holds a token's text back (half a character) and dies before the next one: the relay
    # had not sent that token either, so the continuation starts before it (never inside a character).
    chat = endpoint == "chat/completions"
    SCRIPT.append(("held_drop", after))
    events, raw, o = asyncio.run(_relay(upstream, endpoint, CHAT if chat else COMPLETION, client_ids=True))
    prompt = tokenize("hello there" if chat else "once upon")
    n = 12 if chat else 10
    assert _tokens(events, chat=chat) == generate(prompt, n)
    ids = [t for ev in events for c in ev["choices"] for t in c.get("token_ids") or []]
    assert ids == generate(prompt, n)  # no id twice: the held chunk never reached the client
    if chat or after > 1:
        assert BODIES[1]["prompt"] == prompt + generate(prompt, after - 1)
        assert BODIES[1]["max_tokens"] == n - (after - 1)
    else:  # nothing had reached the client: the original request again
        assert BODIES[1]["prompt"] == "once upon"
    assert o.status is m.RequestStatus.COMPLETED and o.completion_tokens == n
    assert b"error" not in raw and raw.count(b"[DONE]") == 1


def test_a_completion_cut_twice_resumes_twice(upstream: str) -> None:
    SCRIPT.extend([("drop", 3), ("error_chunk", 2)])
    events, raw, o = asyncio.run(_relay(upstream, "completions", COMPLETION))
    prompt = tokenize("once upon")
    assert _tokens(events, chat=False) == generate(prompt, 10)
    assert {ev["id"] for ev in events} == {events[0]["id"]} and b"token_ids" not in raw
    assert BODIES[2]["prompt"] == prompt + generate(prompt, 5) and BODIES[2]["max_tokens"] == 5
    assert events[-1]["usage"]["completion_tokens"] == 10 and events[-1]["usage"]["prompt_tokens"] == len(prompt)
    assert len(o.recovery_steps) == 2 and o.status is m.RequestStatus.COMPLETED


def test_token_ids_stay_when_the_client_asked_for_them(upstream: str) -> None:
    SCRIPT.append(("drop", 4))
    events, _, _ = asyncio.run(_relay(upstream, "completions", COMPLETION, client_ids=True))
    ids = [t for ev in events for c in ev["choices"] for t in c.get("token_ids") or []]
    assert ids == generate(tokenize("once upon"), 10)


def test_usage_is_not_sent_to_a_client_that_did_not_ask(upstream: str) -> None:
    SCRIPT.append(("drop", 4))
    _events, raw, o = asyncio.run(_relay(upstream, "completions", COMPLETION, client_usage=False))
    assert b"usage" not in raw and o.completion_tokens == 10


def test_a_failure_before_the_first_token_retries_the_original_request(upstream: str) -> None:
    SCRIPT.extend([("status503", 0), ("drop", 0)])  # refused, then dropped before any event
    events, _, o = asyncio.run(_relay(upstream, "completions", COMPLETION))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 10)
    assert BODIES[2]["prompt"] == "once upon" and o.status is m.RequestStatus.COMPLETED


def test_an_upstream_that_does_not_answer_in_time_is_asked_again(upstream: str) -> None:
    SCRIPT.append(("silent", 0))
    events, _, o = asyncio.run(_relay(upstream, "completions", COMPLETION, read_timeout=2.0))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 10)
    assert len(BODIES) == 2 and BODIES[1]["prompt"] == "once upon" and o.status is m.RequestStatus.COMPLETED


@pytest.mark.parametrize("after", [1, 6])
def test_a_stream_that_stalls_mid_way_resumes_on_a_new_call(upstream: str, after: int) -> None:
    SCRIPT.append(("stall", after))
    events, raw, o = asyncio.run(_relay(upstream, "chat/completions", CHAT, read_timeout=2.0))
    prompt = tokenize("hello there")
    assert _tokens(events, chat=True) == generate(prompt, 12)  # the stalled stream's late tokens never arrive
    assert b"error" not in raw and raw.count(b"[DONE]") == 1
    assert BODIES[1]["prompt"] == prompt + generate(prompt, after) and BODIES[1]["max_tokens"] == 12 - after
    assert o.status is m.RequestStatus.COMPLETED and o.completion_tokens == 12
    assert [s["step"] for s in o.recovery_steps] == ["decode_resume"]
    assert "ReadTimeout" in o.recovery_steps[0]["detail"]


def test_once_tokens_flow_a_short_gap_breaks_a_stalled_stream(upstream: str) -> None:
    """A replica that stops mid-stream (SIGSTOP) is noticed after the stall ceiling, not after the long wait
    allowed for a first answer; the stream resumes with the exact tokens."""
    SCRIPT.append(("stall", 4))
    events, _, o = asyncio.run(_relay(upstream, "completions", COMPLETION, read_timeout=30.0,
                                      stall=TokenStall(ceiling_s=0.5)))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 10)
    assert [s["step"] for s in o.recovery_steps] == ["decode_resume"]
    assert "ReadTimeout" in o.recovery_steps[0]["detail"] and "after 4 tokens" in o.recovery_steps[0]["detail"]


def test_a_stall_is_judged_against_the_streams_own_pace(upstream: str) -> None:
    """After its first gaps, a stream is held to a silence of a few times its own longest gap: a replica
    that stops after 12 tokens coming every 10 ms is noticed well before the ceiling (here 30 s, longer
    than the stall itself: without the relative watchdog the stream would wait the stall out and finish
    with no recovery step)."""
    PACE_S[0] = 0.01
    SCRIPT.append(("stall", 12))
    payload = {**COMPLETION, "max_tokens": 20}
    events, _, o = asyncio.run(_relay(upstream, "completions", payload, read_timeout=30.0,
                                      stall=TokenStall(ceiling_s=30.0, floor_s=0.2, multiple=4.0)))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 20)
    assert [s["step"] for s in o.recovery_steps] == ["decode_resume"]
    assert "ReadTimeout" in o.recovery_steps[0]["detail"]


def test_a_stalled_decode_replica_is_held_to_the_decode_pools_floor(upstream: str) -> None:
    """A P/D deployment's decode pool prefills nothing, so its streams are held to a floor of their own: with
    the general floor at the ceiling (longer than the stall: on it alone the stream would wait the stall
    out and finish with no recovery step), the decode pool's floor breaks the stall and the stream resumes
    exactly."""
    PACE_S[0] = 0.01
    SCRIPT.append(("stall", 12))
    payload = {**COMPLETION, "max_tokens": 20}
    events, _, o = asyncio.run(_relay(upstream, "completions", payload, read_timeout=30.0,
                                      fallback=upstream.removesuffix("/v1") + "/fallback/v1",
                                      stall=TokenStall(ceiling_s=30.0, floor_s=30.0, multiple=4.0,
                                                       decode_floor_s=0.2)))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 20)
    assert [s["step"] for s in o.recovery_steps][:1] == ["decode_resume"]
    assert "ReadTimeout" in o.recovery_steps[0]["detail"] and "after 12 tokens" in o.recovery_steps[0]["detail"]


def test_a_steady_stream_is_not_broken_by_the_relative_watchdog(upstream: str) -> None:
    PACE_S[0] = 0.02
    payload = {**COMPLETION, "max_tokens": 30}
    events, _, o = asyncio.run(_relay(upstream, "completions", payload,
                                      stall=TokenStall(ceiling_s=30.0, floor_s=0.5, multiple=4.0)))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 30)
    assert o.recovery_steps == [] and len(BODIES) == 1


@pytest.mark.parametrize(("longest", "gaps", "expected"), [
    (0.01, 3, 10.0),   # too few gaps to judge the pace: the ceiling
    (0.01, 8, 1.0),    # fast tokens: the floor
    (0.5, 8, 2.0),     # the multiple of the longest gap
    (5.0, 20, 10.0),   # never past the ceiling
])
def test_the_stall_timeout_follows_the_streams_longest_gap(longest: float, gaps: int, expected: float) -> None:
    assert TokenStall(ceiling_s=10.0, floor_s=1.0, multiple=4.0).timeout(longest, gaps) == pytest.approx(expected)


@pytest.mark.parametrize(("longest", "gaps", "decode_pool", "expected"), [
    (0.01, 8, True, 0.2),    # a decode pool's fast tokens: its own floor
    (0.01, 8, False, 1.0),   # an aggregated engine's (or the prefill pool's fallback): the general floor
    (0.1, 8, True, 0.4),     # the multiple of the longest gap, above the decode floor
    (0.01, 3, True, 10.0),   # too few gaps to judge the pace: the ceiling, whatever the pool
])
def test_a_decode_pools_stream_has_a_floor_of_its_own(longest: float, gaps: int, decode_pool: bool,
                                                      expected: float) -> None:
    stall = TokenStall(ceiling_s=10.0, floor_s=1.0, multiple=4.0, decode_floor_s=0.2)
    assert stall.timeout(longest, gaps, decode_pool=decode_pool) == pytest.approx(expected)


def test_when_the_budget_runs_out_the_stream_ends_with_an_error_event(upstream: str) -> None:
    SCRIPT.extend([("drop", 3)] + [("status503", 0)] * 10)
    events, raw, o = asyncio.run(_relay(upstream, "chat/completions", CHAT,
                                        policy=ResumePolicy(attempts=3, budget_s=10, backoff_s=0.01)))
    assert _tokens(events, chat=True) == generate(tokenize("hello there"), 3)  # what was sent stays sent
    assert b"event: error" in raw and raw.endswith(b"data: [DONE]\n\n")
    assert o.status is m.RequestStatus.FAILED and o.error_code == "upstream_stream_broken"
    assert o.completion_tokens == 3 and o.metered
    assert o.recovery_steps[-1]["outcome"] == "failed" and "503" in o.recovery_steps[-1]["detail"]
    assert len(BODIES) == 4  # the original, then 3 attempts


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on: connection refused, as a dead replica's
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def test_a_stream_whose_pool_is_gone_resumes_at_once_on_the_fallback_pool(upstream: str) -> None:
    """After the break, the decode pool answers 503 (Serve's ingress with no live replica): the rest comes
    from the fallback pool, exact; the steps are on the request."""
    SCRIPT.extend([("drop", 4), ("status503", 0)])
    events, _, outcome = asyncio.run(_relay(upstream, "chat/completions", CHAT,
                                            fallback=upstream.removesuffix("/v1") + "/fallback/v1"))
    assert _tokens(events, chat=True) == generate(tokenize("hello there"), 12)
    # one continuation, asked of both pools at once (no retry round, no backoff)
    assert sorted(PATHS) == ["/fallback/v1/completions", "/v1/chat/completions", "/v1/completions"]
    steps = [(s["step"], s["outcome"]) for s in outcome.recovery_steps]
    assert steps == [("aggregated_fallback", "recovered"), ("decode_resume", "recovered")]
    assert outcome.completion_tokens == 12


def test_a_pool_that_holds_the_call_loses_the_race_to_the_fallback(upstream: str) -> None:
    """A dead replica's calls are held by Serve's proxy until Ray replaces it: the continuation does not
    wait for the decode pool's answer, the fallback's comes first and the held call is dropped."""
    SCRIPT.extend([("drop", 5), ("held503", 0)])
    events, _, outcome = asyncio.run(_relay(upstream, "completions", COMPLETION,
                                            fallback=upstream.removesuffix("/v1") + "/fallback/v1"))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 10)
    fallback = [s for s in outcome.recovery_steps if s["step"] == "aggregated_fallback"]
    assert len(fallback) == 1 and fallback[0]["outcome"] == "recovered"
    assert "raced" in fallback[0]["detail"] and "status" not in fallback[0]["detail"]  # not after its 503


def test_a_first_call_the_pool_does_not_answer_soon_is_asked_of_the_fallback_too(upstream: str) -> None:
    SCRIPT.append(("held503", 0))

    async def run() -> tuple[bytes, Outcome]:
        outcome = Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model="m",
                          endpoint="completions", stream=False, started=time.time(), start_pc=time.perf_counter())
        client = UpstreamClient(timeout_s=10)
        try:
            fallback = _opener(client, upstream.removesuffix("/v1") + "/fallback/v1")
            opener = FailoverOpener(_opener(client, upstream), fallback, PoolHealth(), upstream, outcome, hedge_s=0.2)
            response = await opener("completions", orjson.dumps({**COMPLETION, "stream": True}))
            assert response.status_code == 200 and opener.last == "fallback"
            return await response.aread(), outcome
        finally:
            await client.aclose()

    body, outcome = asyncio.run(run())
    assert b"[DONE]" in body
    assert [s["detail"] for s in outcome.recovery_steps] == [
        "the decode pool had not answered; served by the prefill pool's engine"]


def test_while_a_pool_is_down_calls_go_to_both_pools_then_back(upstream: str) -> None:
    health = PoolHealth(hold_s=60)
    dead = _dead_url()
    fallback = upstream.removesuffix("/v1") + "/fallback/v1"
    events, _, outcome = asyncio.run(_relay(dead, "completions", COMPLETION, fallback=fallback, health=health))
    assert _tokens(events, chat=False) == generate(tokenize("once upon"), 10)
    assert health.down(dead)
    assert [s["step"] for s in outcome.recovery_steps] == ["aggregated_fallback"]
    assert "refused" in str(outcome.recovery_steps) or "ConnectError" in str(outcome.recovery_steps)
    _, _, outcome = asyncio.run(_relay(dead, "completions", COMPLETION, fallback=fallback, health=health))
    assert [(s["step"], s["outcome"]) for s in outcome.recovery_steps] == [("aggregated_fallback", "recovered")]
    health.answered(dead)  # the mark clears once the pool answers again
    assert not health.down(dead)


def test_when_both_pools_fail_the_primarys_answer_is_what_the_caller_sees(upstream: str) -> None:
    async def run() -> UpstreamResponse:
        outcome = Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model="m",
                          endpoint="completions", stream=True, started=time.time(), start_pc=time.perf_counter())
        client = UpstreamClient(timeout_s=10)
        try:
            async def fallback(ep: str, content: bytes) -> UpstreamResponse:
                raise httpx.ConnectError("refused")

            opener = FailoverOpener(_opener(client, upstream), fallback, PoolHealth(), upstream, outcome)
            response = await opener("completions", orjson.dumps({**COMPLETION, "stream": True}))
            assert [(s["step"], s["outcome"]) for s in outcome.recovery_steps] == [("aggregated_fallback", "failed")]
            return response
        finally:
            await client.aclose()

    SCRIPT.append(("status503", 0))
    response = asyncio.run(run())
    assert response.status_code == 503 and b"no replica" in response.content


def test_what_cannot_be_resumed_is_recognised() -> None:
    assert resumable("chat/completions", CHAT) and resumable("completions", COMPLETION)
    assert resumable("completions", {"prompt": [1, 2, 3]})
    assert not resumable("completions", {"prompt": ["a", "b"]})
    assert not resumable("chat/completions", {**CHAT, "n": 2})
    assert not resumable("chat/completions", {**CHAT, "tools": [{"type": "function"}]})
    assert not resumable("chat/completions", {**CHAT, "logprobs": True})
    assert resumable("chat/completions", {**CHAT, "logprobs": False})
    assert continuation_body("completions", COMPLETION, [1], list(range(10))) is None  # nothing left
    body = continuation_body("chat/completions", {**CHAT, "min_tokens": 4, "max_tokens": None,
                                                  "max_completion_tokens": 9}, [1, 2], [3])
    assert body is not None and body["max_tokens"] == 8 and body["min_tokens"] == 3 and body["prompt"] == [1, 2, 3]


def _bare_relay(chat: bool, client_ids: bool) -> tuple[ResumingRelay, Outcome]:
    outcome = Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model="m",
                      endpoint="chat/completions" if chat else "completions", stream=True, started=time.time(),
                      start_pc=time.perf_counter())

    async def never(ep: str, content: bytes) -> UpstreamResponse:
        raise AssertionError("no upstream call expected")

    attempts = Attempts(never, outcome.endpoint, b"{}", policy=POLICY, outcome=outcome)
    relay = ResumingRelay(UpstreamResponse.read(200, b""), outcome, strip_usage=True, headers=[],
                          done=lambda o: None, attempts=attempts, payload={}, client_ids=client_ids)
    return relay, outcome


def _vllm_event(chat: bool, text: str, ids: list[int] | None, finish: str | None = None) -> bytes:
    """A chunk as vLLM writes it (pydantic's compact JSON, fields in its order)."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        obj: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
                               "choices": [choice]}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m", "choices": [choice]}
    if ids is not None:
        choice["token_ids"] = ids
    return b"data: " + orjson.dumps(obj)


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("client_ids", [True, False])
def test_token_events_relayed_by_scanning_equal_the_parsed_ones(chat: bool, client_ids: bool) -> None:
    """Mid-stream token chunks skip the JSON round trip; what the client gets and what is counted are the
    same as through the full parse, and every other kind of event still takes the full parse."""
    events = [_vllm_event(chat, " tok", [17]), _vllm_event(chat, 'say "error": \\n é', [18, 19]),
              _vllm_event(chat, "x", [20])]
    parsed_only = [_vllm_event(chat, "", [21]), _vllm_event(chat, " y", None), _vllm_event(chat, " z", [22], "stop"),
                   b'data: {"error":{"message":"x","code":500}}']

    def run(scan: bool) -> tuple[list[bytes | None], list[int], int, int]:
        relay, outcome = _bare_relay(chat, client_ids)
        st = _Stream(prompt_ids=[1, 2], id="x", created=5, model="m")
        scanned = 0
        if not scan:
            relay._pass = lambda ev, st, now: None  # type: ignore[method-assign]
        out = []
        for ev in events:
            if scan and relay._pass(ev, _Stream(prompt_ids=[1, 2], id="x"), 0.0) is not None:
                scanned += 1
            out.append(relay._event(ev, st, time.perf_counter())[0])
        for ev in parsed_only:
            assert relay._pass(ev, _Stream(prompt_ids=[1, 2], id="x"), 0.0) is None
        return out, st.sent, outcome.completion_tokens, scanned

    fast, fast_sent, fast_tokens, scanned = run(scan=True)
    slow, slow_sent, slow_tokens, _ = run(scan=False)
    assert scanned == len(events)
    assert [orjson.loads(b[6:]) for b in fast if b] == [orjson.loads(b[6:]) for b in slow if b]
    assert fast_sent == slow_sent == [17, 18, 19, 20] and fast_tokens == slow_tokens == 4
    assert all((b"token_ids" in b) == client_ids for b in fast if b)
