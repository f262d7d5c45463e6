"""Relaying the upstream's answer to the client, and resuming it where it breaks.

Streams are relayed chunk by chunk as they arrive (whole SSE events, :mod:`baton.api.gateway.sse`; a
partial event waits for its end), never re-buffered or re-serialised; a chunk is only parsed when it
carries the engine's usage report, which the gateway always asks for (``stream_options.include_usage``)
and removes again when the client did not (:class:`SSERelay`). Every request ends in exactly one
:class:`~baton.api.gateway.metering.Outcome` (completed, failed or cancelled), whatever happens: upstream
errors, a cut stream (the client then gets an SSE ``error`` event, never a silently short 200), or the
client going away (noticed at once by watching ``http.disconnect``, not only at the next write).

Resuming (:class:`ResumingRelay`, engine-agnostic: aggregated and P/D alike). A resumable streaming
request is sent with vLLM's ``return_token_ids``: the first chunk then carries the prompt's token ids
(chat: top level; completions: on the choice) and every chunk the ids of the tokens it carries. The
relay keeps both, strips them from what the client sees (unless the client asked for them) and, when
the upstream stream breaks (connection error, an SSE ``error`` event, an ``{"error": ...}`` chunk, an end
without ``finish_reason``, or a silence long for the stream's own pace: :class:`TokenStall`, a stalled
replica), resubmits to the same deployment as ``/completions`` with ``prompt = prompt ids + ids already
sent``, the same sampling settings, ``max_tokens`` reduced by what was sent and the same ``cache_salt``
(an LMCache tier that still holds the prefix KV saves the re-prefill), through the request's
:class:`~baton.api.gateway.attempts.Attempts`. The continuation is re-framed in the client's original
format (same id, created and model), so the client's stream simply goes on: no repeated, missing or
reordered tokens; usage counts the original prompt and each completion token once. Where the ladder
runs out the client gets an SSE ``error`` event and the request record keeps the steps taken
(``Outcome.recovery_steps``) and why it failed.

Not resumed (a break after the first token ends with the SSE error as before): ``n > 1``, several
prompts, logprobs, echo, and constrained output (tools, ``response_format``, structured outputs),
whose state a plain token continuation cannot carry (:func:`~baton.api.gateway.attempts.resumable`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from baton.api.errors import openai_error_body
from baton.api.gateway.attempts import Attempts, continuation_body, transport_error
from baton.api.gateway.engine_text import client_text
from baton.api.gateway.metering import Outcome
from baton.api.gateway.sse import EVENT_END, SSEFrames
from baton.api.gateway.upstream import UpstreamResponse
from baton.core import errors
from baton.core import models as m
from baton.core.contracts import STEP_DECODE_RESUME

log = logging.getLogger(__name__)


_DONE = b"data: [DONE]"


_USAGE = b'"usage":{'


def read_usage(usage: Any, outcome: Outcome) -> None:
    if not isinstance(usage, dict):
        return
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        outcome.cached_tokens = int(details.get("cached_tokens") or 0)


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


@dataclass(frozen=True, slots=True)
class TokenStall:
    """When a running stream's silence means its replica stalled: a watchdog relative to the stream's own
    pace. After ``min_gaps`` gaps between tokens, a silence longer than ``multiple`` times the longest gap
    the stream has had so far breaks it (resumed like any break), within ``[floor_s, ceiling_s]``; before
    that, ``ceiling_s``. The floor keeps a step that is slow for a reason (a long prefill chunk joining the
    batch on an aggregated engine, hundreds of milliseconds on a CPU host) from breaking streams that
    have only met fast steps: a false break is never wrong (the continuation is exact) but costs a
    re-prefill, which on a loaded engine makes the next steps slower still.

    A stream from a P/D deployment's decode pool is held to ``decode_floor_s`` instead: a decode engine
    prefills nothing (its prompts' KV arrives over NIXL), so none of its steps is long for that reason,
    and a stalled decode replica is noticed that much sooner."""

    ceiling_s: float = 10.0
    floor_s: float = 1.0
    multiple: float = 4.0
    min_gaps: int = 8
    decode_floor_s: float | None = None  # None: ``floor_s`` for every pool

    def timeout(self, longest_gap_s: float, gaps: int, *, decode_pool: bool = False) -> float:
        if gaps < self.min_gaps:
            return self.ceiling_s
        floor = self.decode_floor_s if decode_pool and self.decode_floor_s is not None else self.floor_s
        return min(max(self.multiple * longest_gap_s, floor), self.ceiling_s)


class StreamBrokenError(errors.UpstreamError):
    code = "upstream_stream_broken"
    title = "The model's stream broke and could not be resumed. Try again."


@dataclass(slots=True)
class _Stream:
    """What the client has been sent so far."""

    prompt_ids: list[int] | None = None
    sent: list[int] = field(default_factory=list)
    held: list[bytes] = field(default_factory=list)  # chunks of tokens whose text the engine holds back
    held_ids: list[int] = field(default_factory=list)  # their token ids (not sent yet)
    started: bool = False  # any event reached the client
    ids_ok: bool = True  # every token-bearing chunk carried its ids
    resumed: bool = False  # the relay reads a continuation now
    finished: bool = False  # the choice's finish_reason reached the client
    done: bool = False  # [DONE] seen on the current upstream stream
    usage: dict[str, Any] | None = None
    usage_event: dict[str, Any] | None = None
    id: str | None = None
    created: int | None = None
    model: str | None = None


_IDS = b',"token_ids":['


_CHAT_TEXT = b'"content":"'


_TEXT = b'"text":"'


def _data(ev: bytes) -> bytes | None:
    for line in ev.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


class ResumingRelay(SSERelay):
    """:class:`SSERelay` that resumes a broken stream instead of failing it (see the module doc)."""

    def __init__(self, response: UpstreamResponse, outcome: Outcome, *, strip_usage: bool,
                 headers: list[tuple[bytes, bytes]], done: Callable[[Outcome], None], attempts: Attempts,
                 payload: dict[str, Any], client_ids: bool, stall: TokenStall | None = None) -> None:
        super().__init__(response, outcome, strip_usage=strip_usage, headers=headers, done=done)
        self._stall = stall
        #: the longest gap between two tokens of this stream so far (a resume's gap not counted), and how many
        self._longest_gap = 0.0
        self._n_gaps = 0
        self._attempts = attempts
        self._endpoint = attempts.endpoint
        self._payload = payload
        self._client_ids = client_ids
        self._chat = attempts.endpoint == "chat/completions"
        self._last_pc = outcome.start_pc
        #: (index of the resume's step, when the client got its last token before the break): the client's
        #: gap is noted on that step once the first token after the break is relayed
        self._gap_from: tuple[int, float] | None = None

    async def _relay(self, send: Send) -> None:
        st = _Stream()
        outcome = self._outcome
        while True:
            failure = await self._pump(self._response, send, st)
            if failure is None or st.finished:
                break
            t0 = time.perf_counter()
            old = self._response
            asyncio.get_running_loop().create_task(old.aclose())
            st.held.clear()  # never sent: the continuation generates them again
            st.held_ids.clear()
            if not st.started:  # nothing reached the client: the original request again
                endpoint, body = self._endpoint, self._attempts.body
                st.id = None
            elif st.prompt_ids is None or not st.ids_ok:
                outcome.step(STEP_DECODE_RESUME, t0, "failed", f"{failure}; token ids unknown, cannot resume")
                await self._broken(send, st)
                return
            else:
                cont = continuation_body(self._endpoint, self._payload, st.prompt_ids, st.sent)
                if cont is None:  # every allowed token was sent; only the finish chunk was lost
                    await self._emit(send, self._finish_chunk(st, "length"))
                    st.finished = True
                    outcome.step(STEP_DECODE_RESUME, t0, "recovered", f"{failure}; length reached, finish sent")
                    break
                endpoint, body = "completions", orjson.dumps(cont)
            response, why = await self._attempts.again(endpoint, body)  # each break gets its own budget
            if response is not None and response.status_code != 200:
                await response.aclose()
                response = None
            if response is None:
                outcome.step(STEP_DECODE_RESUME, t0, "failed", f"{failure}; {why}")
                await self._broken(send, st)
                return
            self._response = response
            st.resumed = st.started
            st.done = False
            outcome.step(STEP_DECODE_RESUME, t0, "recovered",
                         f"{failure}; {'resumed after' if st.started else 'retried before'} "
                         f"{len(st.sent)} tokens")
            if st.sent:
                self._gap_from = (len(outcome.recovery_steps) - 1, self._last_pc)
        self._account(st)
        if not self._strip:
            event = st.usage_event if not st.resumed and st.usage_event is not None else self._usage_chunk(st)
            await self._emit(send, event)
        outcome.metered = True
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        self._ending = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _broken(self, send: Send, st: _Stream) -> None:
        self._account(st)
        await self._fail(send, StreamBrokenError())

    def _account(self, st: _Stream) -> None:
        outcome = self._outcome
        if not st.resumed and st.usage is not None:
            read_usage(st.usage, outcome)
            return
        if st.prompt_ids is not None:
            outcome.prompt_tokens = len(st.prompt_ids)
        if st.ids_ok:
            outcome.completion_tokens = len(st.sent)

    async def _emit(self, send: Send, obj: dict[str, Any]) -> None:
        await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(obj) + b"\n\n",
                    "more_body": True})

    async def _pump(self, response: UpstreamResponse, send: Send, st: _Stream) -> str | None:
        """Relays one upstream stream; returns None when it completed, else why it broke."""
        frames = SSEFrames()
        read_timeout: float | None = None
        decode_pool = self._attempts.on_decode_pool  # the pool serving this upstream stream, for all of it
        try:
            async for received in response.aiter_raw():
                now = time.perf_counter()
                whole = frames.feed(received)
                if not whole:
                    continue
                out: list[bytes] = []
                failure: str | None = None
                for ev in whole.split(EVENT_END):
                    if not ev.strip():
                        continue
                    piece, failure = self._event(ev, st, now)
                    if piece:
                        out.append(piece)
                    if failure is not None:
                        break
                if out:
                    if self._stall is not None:
                        # The stream runs: a stalled replica is noticed after a token gap relative to the
                        # stream's own pace, not the wait for a first answer.
                        timeout = self._stall.timeout(self._longest_gap, self._n_gaps, decode_pool=decode_pool)
                        if timeout != read_timeout:
                            response.set_read_timeout(timeout)
                            read_timeout = timeout
                    st.started = True
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                if failure is not None:
                    return failure
        except httpx.HTTPError as exc:
            return f"upstream {type(exc).__name__}"
        if (pending := frames.pending).strip():
            piece, failure = self._event(pending, st, time.perf_counter())
            if piece:
                st.started = True
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            if failure is not None:
                return failure
        if not st.finished:
            return "stream ended without finish_reason" if st.done else "stream ended early"
        return None

    def _event(self, ev: bytes, st: _Stream, now: float) -> tuple[bytes | None, str | None]:
        """One upstream SSE event -> (bytes for the client, failure)."""
        passed = self._pass(ev, st, now)
        if passed is not None:
            return passed, None
        obj, choice, failure = self._parse(ev, st)
        if obj is None or choice is None:
            return None, failure
        ids = self._take_ids(obj, choice, st)
        # a continuation is a /completions stream whatever the client asked: its text is the choice's `text`
        text = choice.get("text") if not self._chat or st.resumed else (choice.get("delta") or {}).get("content")
        finish = choice.get("finish_reason")
        if isinstance(ids, list) and ids and not text and finish is None and st.ids_ok:
            # The engine's detokenizer holds this token's text back (part of a character); the relay holds
            # the chunk back too, so a break here resumes before the token (it is generated again). A break
            # after a chunk of several tokens whose last one is held back is resumed after it: Baton's
            # replicas prime such a continuation as the undisturbed stream was (baton.dataplane.detokenize).
            if st.resumed:
                obj = self._reframe(obj, choice, st, ids if self._client_ids else None)
            st.held.append(b"data: " + orjson.dumps(obj) + b"\n\n")
            st.held_ids.extend(ids)
            return None, None
        held, n_held = b"".join(st.held), len(st.held_ids)
        st.sent.extend(st.held_ids)
        st.held.clear()
        st.held_ids.clear()
        self._count(ids, bool(text), n_held, st, now)
        if finish is not None:
            st.finished = True
        if st.resumed:
            obj = self._reframe(obj, choice, st, ids if self._client_ids else None)
        return held + b"data: " + orjson.dumps(obj) + b"\n\n", None

    def _pass(self, ev: bytes, st: _Stream, now: float) -> bytes | None:
        """The common event, relayed by scanning its bytes instead of decoding and re-encoding it: a token
        chunk of an undisturbed stream after its first (one choice, with text and its token ids, no finish,
        usage or error). Only the ids are cut out (unless the client asked for them). None: the event needs
        the full parse (:meth:`_event`)."""
        if st.resumed or st.held or not st.ids_ok or st.prompt_ids is None or not ev.startswith(b"data: {"):
            return None
        if b'"finish_reason":null' not in ev or b'"usage"' in ev or b'"error"' in ev or b"prompt_token_ids" in ev:
            return None  # quotes inside a JSON string are escaped: these match structure only (n is 1 here)
        start = ev.find(_IDS)
        end = ev.find(b"]", start)
        if start < 0 or end < 0 or ev.find(_IDS, end) >= 0:
            return None
        marker = _CHAT_TEXT if self._chat else _TEXT
        text = ev.find(marker)
        if text < 0 or ev[text + len(marker)] == 34:  # no text, or "" (a held-back token's)
            return None
        try:
            ids = [int(x) for x in ev[start + len(_IDS):end].split(b",")]
        except ValueError:
            return None
        self._count(ids, True, 0, st, now)
        return (ev if self._client_ids else ev[:start] + ev[end + 1:]) + b"\n\n"

    def _parse(self, ev: bytes, st: _Stream) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]:
        """An event's chunk and its first choice, or (None, None, why it breaks the stream or None). Notes
        ``[DONE]`` and the engine's usage; a usage-only chunk is kept for the end, not relayed now."""
        if ev.lstrip().startswith(b"event: error") or b"\nevent: error" in ev:
            return None, None, "upstream error event"
        raw = _data(ev)
        if raw is None:
            return None, None, None
        if raw == b"[DONE]":
            st.done = True
            return None, None, None
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None, None, "malformed upstream event"
        if not isinstance(obj, dict):
            return None, None, "malformed upstream event"
        if "error" in obj or obj.get("object") == "error":
            return None, None, "upstream error in stream"
        choices = obj.get("choices")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            st.usage = usage
        if not choices:
            if isinstance(usage, dict):
                obj.pop("prompt_token_ids", None)
                st.usage_event = obj
            return None, None, None
        choice = choices[0] if isinstance(choices, list) and isinstance(choices[0], dict) else None
        if choice is None:
            return None, None, "malformed upstream event"
        return obj, choice, None

    def _take_ids(self, obj: dict[str, Any], choice: dict[str, Any], st: _Stream) -> Any:
        """The chunk's token ids (and, first, the prompt's), removed from what the client gets unless it asked
        for them; the engine's usage removed where the relay writes its own."""
        if st.resumed:
            obj.pop("prompt_token_ids", None)
            choice.pop("prompt_token_ids", None)
        else:
            if st.id is None:
                st.id, st.created, st.model = obj.get("id"), obj.get("created"), obj.get("model")
            prompt_ids = obj.get("prompt_token_ids") if self._chat else choice.get("prompt_token_ids")
            if isinstance(prompt_ids, list) and st.prompt_ids is None:
                st.prompt_ids = prompt_ids
                self._outcome.prompt_tokens = len(prompt_ids)
            if not self._client_ids:
                obj.pop("prompt_token_ids", None)
                choice.pop("prompt_token_ids", None)
        ids = choice.get("token_ids")
        if not self._client_ids:
            choice.pop("token_ids", None)
        if isinstance(obj.get("usage"), dict) and (self._strip or st.resumed):
            obj.pop("usage", None)
        return ids

    def _count(self, ids: Any, has_text: bool, n_held: int, st: _Stream, now: float) -> None:
        """Counts the tokens this chunk (and those held back before it) brings to the client: the outcome's
        completion tokens, first-token time and inter-token gaps."""
        if isinstance(ids, list):
            n = len(ids) + n_held
            st.sent.extend(ids)
        else:
            n = 1 if has_text else 0
            if n:
                st.ids_ok = False
        if not n:
            return
        outcome = self._outcome
        if outcome.first_token is None:
            outcome.first_token = now
        else:
            gap = now - self._last_pc
            outcome.gaps.append(gap)
            if self._gap_from is None:  # a resume's gap is the fault's, not the stream's pace
                self._n_gaps += 1
                self._longest_gap = max(self._longest_gap, gap)
        if self._gap_from is not None:
            index, since = self._gap_from
            outcome.client_gap(index, now - since)
            self._gap_from = None
        self._last_pc = now
        outcome.completion_tokens = len(st.sent) if st.ids_ok else outcome.completion_tokens + n

    def _reframe(self, obj: dict[str, Any], choice: dict[str, Any], st: _Stream,
                 ids: list[int] | None) -> dict[str, Any]:
        """A continuation (``/completions``) chunk in the original request's format."""
        if not self._chat:
            obj.update(id=st.id, created=st.created, model=st.model)
            return obj
        out: dict[str, Any] = {"index": 0, "delta": {"content": choice.get("text") or ""}, "logprobs": None,
                               "finish_reason": choice.get("finish_reason")}
        if choice.get("stop_reason") is not None:
            out["stop_reason"] = choice["stop_reason"]
        if ids is not None:
            out["token_ids"] = ids
        return {"id": st.id, "object": "chat.completion.chunk", "created": st.created, "model": st.model,
                "choices": [out]}

    def _finish_chunk(self, st: _Stream, reason: str) -> dict[str, Any]:
        if self._chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": reason}
            return {"id": st.id, "object": "chat.completion.chunk", "created": st.created, "model": st.model,
                    "choices": [choice]}
        return {"id": st.id, "object": "text_completion", "created": st.created, "model": st.model,
                "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": reason}]}

    def _usage_chunk(self, st: _Stream) -> dict[str, Any]:
        outcome = self._outcome
        return {"id": st.id, "object": "chat.completion.chunk" if self._chat else "text_completion",
                "created": st.created, "model": st.model, "choices": [],
                "usage": {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
                          "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}}
