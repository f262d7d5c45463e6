"""Decode-failure recovery in the gateway: retry before the first token, resume after it.

Engine-agnostic (aggregated and P/D alike). A resumable streaming request is sent with vLLM's
``return_token_ids``: the first chunk then carries the prompt's token ids (chat: top level;
completions: on the choice) and every chunk the ids of the tokens it carries. :class:`ResumingRelay`
keeps both, strips them from what the client sees (unless the client asked for them) and, when the
upstream stream breaks (connection error, an SSE ``error`` event, an ``{"error": ...}`` chunk, or an
end without ``finish_reason``), resubmits to the same deployment as ``/completions`` with
``prompt = prompt ids + ids already sent``, the same sampling settings, ``max_tokens`` reduced by what
was sent and the same ``cache_salt`` (an LMCache tier that still holds the prefix KV saves the
re-prefill). The continuation is re-framed in the client's original format (same id, created and
model), so the client's stream simply goes on: no repeated, missing or reordered tokens; usage counts
the original prompt and each completion token once.

Attempts are bounded by :class:`ResumePolicy` (count, and time per recovery: each break gets
``budget_s`` from the moment it is seen; exponential backoff while Ray routes around or replaces a dead
replica). An upstream that goes silent (no answer for the gateway's ``stream_stall_s``, or, once tokens
flow, a silence long for the stream's own pace: :class:`TokenStall`, a stalled replica) counts as broken
too: its read timeout ends the attempt. Where the ladder runs out the client gets an
SSE ``error`` event and the request record keeps the steps taken (``Outcome.recovery_steps``) and why
it failed.

Not resumed (a break after the first token ends with the SSE error as before): ``n > 1``, several
prompts, logprobs, echo, and constrained output (tools, ``response_format``, structured outputs),
whose state a plain token continuation cannot carry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.types import Send

from baton.api.gateway.metering import Outcome
from baton.api.gateway.proxy import SSERelay, read_usage
from baton.api.gateway.sse import EVENT_END, SSEFrames
from baton.api.gateway.upstream import Opener, UpstreamResponse
from baton.core import errors
from baton.core.contracts import STEP_AGGREGATED_FALLBACK, STEP_DECODE_RESUME

#: Upstream statuses worth another attempt (the replica died, Ray is replacing it, a timeout).
RETRY_STATUSES = frozenset({500, 502, 503, 504})

#: Request fields whose state a token continuation cannot carry.
NOT_RESUMABLE = ("tools", "functions", "response_format", "structured_outputs", "guided_json", "guided_regex",
                 "guided_choice", "guided_grammar", "logprobs", "top_logprobs", "echo", "best_of",
                 "prompt_logprobs", "suffix")

#: Sampling (and server) fields a continuation keeps from the original request.
CARRIED = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "length_penalty", "logit_bias", "ignore_eos",
           "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "bad_words",
           "allowed_token_ids", "user", "cache_salt", "kv_transfer_params", "priority", "vllm_xargs")

@dataclass(frozen=True, slots=True)
class TokenStall:
    """When a running stream's silence means its replica stalled: a watchdog relative to the stream's own
    pace. After ``min_gaps`` gaps between tokens, a silence longer than ``multiple`` times the longest gap
    the stream has had so far breaks it (resumed like any break), within ``[floor_s, ceiling_s]``; before
    that, ``ceiling_s``. The floor keeps a step that is slow for a reason (a long prefill chunk joining the
    batch on an aggregated engine, hundreds of milliseconds on a CPU host) from breaking streams that
    have only met fast steps: a false break is never wrong (the continuation is exact) but costs a
    re-prefill, which on a loaded engine makes the next steps slower still."""

    ceiling_s: float = 10.0
    floor_s: float = 1.0
    multiple: float = 4.0
    min_gaps: int = 8

    def timeout(self, longest_gap_s: float, gaps: int) -> float:
        if gaps < self.min_gaps:
            return self.ceiling_s
        return min(max(self.multiple * longest_gap_s, self.floor_s), self.ceiling_s)


class StreamBrokenError(errors.UpstreamError):
    code = "upstream_stream_broken"
    title = "The model's stream broke and could not be resumed. Try again."


@dataclass(frozen=True, slots=True)
class ResumePolicy:
    attempts: int = 6
    budget_s: float = 30.0
    backoff_s: float = 0.1
    backoff_max_s: float = 2.0

    def delay(self, retry: int) -> float:
        """Wait before retry number ``retry`` (1-based): none for the first, then doubling."""
        return 0.0 if retry <= 1 else min(self.backoff_s * 2 ** (retry - 2), self.backoff_max_s)


def resumable(endpoint: str, payload: dict[str, Any]) -> bool:
    """Whether a streaming request can be continued from its token ids after a break."""
    if (payload.get("n") or 1) != 1:
        return False
    if any(payload.get(name) not in (None, False) for name in NOT_RESUMABLE):
        return False
    if endpoint == "completions":
        prompt = payload.get("prompt")
        single_ids = isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)
        return isinstance(prompt, str) or single_ids
    return endpoint == "chat/completions"


def completion_limit(endpoint: str, payload: dict[str, Any]) -> int | None:
    """The completion-token limit of the original request (vLLM's completions default: 16)."""
    if endpoint == "chat/completions":
        value = payload.get("max_completion_tokens") or payload.get("max_tokens")
    else:
        value = payload.get("max_tokens", 16)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def continuation_body(endpoint: str, payload: dict[str, Any], prompt_ids: list[int],
                      sent_ids: list[int]) -> dict[str, Any] | None:
    """The ``/completions`` body that continues after ``sent_ids``; None when nothing is left to generate."""
    body: dict[str, Any] = {k: payload[k] for k in CARRIED if k in payload}
    body.update(model=payload["model"], prompt=[*prompt_ids, *sent_ids], stream=True,
                stream_options={"include_usage": True}, return_token_ids=True)
    limit = completion_limit(endpoint, payload)
    if limit is not None:
        if limit - len(sent_ids) <= 0:
            return None
        body["max_tokens"] = limit - len(sent_ids)
    min_tokens = payload.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool):
        body["min_tokens"] = max(min_tokens - len(sent_ids), 0)
    return body


class PoolHealth:
    """Upstream pools that failed a call just now, per base URL, as the gateway saw them.

    A pool is taken as down for ``hold_s`` after a failed call (no answer, or a 502/503/504 from Serve's
    ingress: no live replica behind it); meanwhile calls go to the fallback first. Any answer from it
    again clears the mark."""

    def __init__(self, hold_s: float = 2.0) -> None:
        self.hold_s = hold_s
        self._down_until: dict[str, float] = {}

    def down(self, pool: str) -> bool:
        until = self._down_until.get(pool)
        if until is None:
            return False
        if time.monotonic() >= until:
            self._down_until.pop(pool, None)
            return False
        return True

    def failed(self, pool: str) -> None:
        self._down_until[pool] = time.monotonic() + self.hold_s

    def answered(self, pool: str) -> None:
        self._down_until.pop(pool, None)


class FailoverOpener:
    """An :data:`Opener` over a deployment's pool and its fallback pool (the aggregated fallback of the
    recovery ladder: a P/D deployment's prefill engine is a whole engine and decodes too).

    A replica that died does not make its pool fail fast: Serve's HAProxy sends the call to Serve's
    own proxy, which holds it until Ray has replaced the replica (tens of seconds on CPU hosts). So the
    pool is judged by how it answers, live:

    - a request's first call goes to the primary pool; if that gives no answer or a 502/503/504, the
      same call goes at once to the fallback, and if the primary has not answered within ``hedge_s``
      the fallback is asked too;
    - a later call (a retry before the first token, the rest of a broken stream) and any call while the
      primary failed just now (:class:`PoolHealth`) go to both pools at once.

    The first usable answer wins; the other call is cancelled (the same greedy continuation from either
    pool: the client's stream does not tell them apart). Each call the fallback wins is an
    ``aggregated_fallback`` step of the request, which ``/metrics`` counts (``baton_recovery_events``).
    When both fail, the primary's failure is what the caller sees (retries and budgets stay the caller's)."""

    def __init__(self, primary: Opener, fallback: Opener, health: PoolHealth, pool: str, outcome: Outcome,
                 *, hedge_s: float = 2.0) -> None:
        self._primary = primary
        self._fallback = fallback
        self._health = health
        self._pool = pool
        self._outcome = outcome
        self._hedge_s = hedge_s
        self._calls = 0
        self.last = "primary"

    async def __call__(self, endpoint: str, body: bytes) -> UpstreamResponse:
        self._calls += 1
        t0 = time.perf_counter()
        down = self._health.down(self._pool)
        delay = self._hedge_s if self._calls == 1 and not down else 0.0
        primary: asyncio.Future[UpstreamResponse | _NoAnswer] = asyncio.ensure_future(
            self._try(self._primary, endpoint, body))
        fallback: asyncio.Future[UpstreamResponse | _NoAnswer] | None = None
        failed: _NoAnswer | None = None
        try:
            if delay > 0:
                first, _ = await asyncio.wait({primary}, timeout=delay)
                if primary in first:
                    answer = primary.result()
                    if not isinstance(answer, _NoAnswer):
                        return self._served_by_primary(answer)
                    failed = answer
            fallback = asyncio.ensure_future(self._try(self._fallback, endpoint, body))
            pending: set[asyncio.Future[UpstreamResponse | _NoAnswer]] = {fallback}
            if failed is None:
                pending.add(primary)
            fallback_failed: _NoAnswer | None = None
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda f: f is not primary):  # the primary wins a tie
                    answer = task.result()
                    if isinstance(answer, _NoAnswer):
                        if task is primary:
                            failed = answer
                        else:
                            fallback_failed = answer
                        continue
                    for other in done - {task}:
                        _close_answer(other)
                    if task is primary:
                        return self._served_by_primary(answer)
                    self._health.failed(self._pool)
                    why = (f"decode pool: {failed.why}" if failed is not None else
                           "the decode pool failed a call just now" if down else
                           "the decode pool had not answered" if self._calls == 1 else
                           "the decode pool raced after a break")
                    return self._served_by_fallback(answer, t0, why)
            self._health.failed(self._pool)
            assert failed is not None
            fallback_why = fallback_failed.why if fallback_failed is not None else "no answer"
            self._outcome.step(STEP_AGGREGATED_FALLBACK, t0, "failed",
                               f"decode pool: {failed.why}; fallback: {fallback_why}")
            self.last = "primary"
            return failed.reraise()
        finally:
            for call in (primary, fallback):
                if call is not None and not call.done():
                    call.cancel()
                    call.add_done_callback(_close_answer)

    def _served_by_primary(self, response: UpstreamResponse) -> UpstreamResponse:
        self._health.answered(self._pool)
        self.last = "primary"
        return response

    async def _try(self, opener: Opener, endpoint: str, body: bytes) -> UpstreamResponse | _NoAnswer:
        """The answer, or why there was none (a 502/503/504 answer is read, closed and counts as none)."""
        try:
            response = await opener(endpoint, body)
        except httpx.HTTPError as exc:
            return _NoAnswer(f"upstream {type(exc).__name__}", error=exc)
        if response.status_code not in FAILOVER_STATUSES:
            return response
        content = await response.drain()
        return _NoAnswer(f"upstream status {response.status_code}", status=response.status_code, content=content)

    def _served_by_fallback(self, response: UpstreamResponse, t0: float, why: str) -> UpstreamResponse:
        self.last = "fallback"
        self._outcome.step(STEP_AGGREGATED_FALLBACK, t0, "recovered" if response.status_code == 200 else "failed",
                           f"{why}; served by the prefill pool's engine")
        return response


def _close_answer(task: asyncio.Future[Any]) -> None:
    """Closes the answer of a call that lost the race (or was cancelled after it answered)."""
    if task.cancelled() or task.exception() is not None:
        return
    answer = task.result()
    if not isinstance(answer, _NoAnswer):
        closing = asyncio.ensure_future(answer.aclose())
        _closing.add(closing)
        closing.add_done_callback(_closing.discard)


_closing: set[asyncio.Future[Any]] = set()


#: Statuses of a pool that cannot take the call now (Serve's ingress with no live replica, a replica dying).
FAILOVER_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True, slots=True)
class _NoAnswer:
    why: str
    error: httpx.HTTPError | None = None
    status: int = 0
    content: bytes = b""

    def reraise(self) -> UpstreamResponse:
        """What the caller sees of the primary's failure: its error, or its (already read) answer."""
        if self.error is not None:
            raise self.error
        return UpstreamResponse.read(self.status, self.content)


class Attempts:
    """Every upstream call of one request, in one place: the first call, its retries before the first token
    and the resumed streams after it share one count (``policy.attempts``); each recovery gets
    ``policy.budget_s`` from the failure that started it, with the policy's backoff between calls. Without
    a policy a request has its one call and nothing is retried."""

    __slots__ = ("body", "endpoint", "opener", "outcome", "policy", "used")

    def __init__(self, opener: Opener, endpoint: str, body: bytes, *, policy: ResumePolicy | None,
                 outcome: Outcome) -> None:
        self.opener = opener
        self.endpoint = endpoint
        self.body = body  # the original request as the upstream gets it
        self.policy = policy
        self.outcome = outcome
        self.used = 0  # retries and resumes so far

    async def first(self) -> tuple[UpstreamResponse | None, httpx.HTTPError | None]:
        """The request's first call; with a policy, transport errors (a stall included) and 5xx are retried
        (nothing was sent yet). Returns (the answer, None), or (None, the last transport error, or None when
        the last failure was a 5xx answer)."""
        try:
            response = await self.opener(self.endpoint, self.body)
        except httpx.HTTPError as exc:
            if self.policy is None:
                return None, exc
            why = f"upstream {type(exc).__name__}"
            failed: httpx.HTTPError | None = exc
        else:
            if self.policy is None or response.status_code not in RETRY_STATUSES:
                return response, None
            why = f"upstream status {response.status_code}"
            failed = None
            await response.aclose()
        t0 = time.perf_counter()
        retried, more = await self.again(self.endpoint, self.body)
        ok = retried is not None and retried.status_code == 200
        self.outcome.step(STEP_DECODE_RESUME, t0, "recovered" if ok else "failed",
                          f"{why}; {more or 'retried before the first token'}")
        return retried, failed

    async def again(self, endpoint: str, body: bytes) -> tuple[UpstreamResponse | None, str]:
        """Calls until an answer that is not a transport error or a 5xx, within a fresh time budget. Returns
        (an answer with status 200, "") or (None, why); an answer with another status (4xx: the request itself
        is refused) is final at once and returned open, for the caller to read."""
        policy = self.policy
        if policy is None:
            return None, "no retries"
        deadline = time.monotonic() + policy.budget_s
        why = "no attempt left"
        while self.used < policy.attempts:
            now = time.monotonic()
            if now >= deadline:
                return None, f"{why}; time budget spent"
            self.used += 1
            wait = min(policy.delay(self.used), deadline - now)
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                response = await self.opener(endpoint, body)
            except httpx.HTTPError as exc:
                why = f"upstream {type(exc).__name__}"
                continue
            if response.status_code == 200 or response.status_code not in RETRY_STATUSES:
                return response, "" if response.status_code == 200 else f"upstream status {response.status_code}"
            await response.aclose()
            why = f"upstream status {response.status_code}"
        return None, f"{why}; {policy.attempts} attempts used"


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
                        timeout = self._stall.timeout(self._longest_gap, self._n_gaps)
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
