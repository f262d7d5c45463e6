"""Opening a request's upstream call: the headers that carry its ids, the attempts, and what a refusal means
to the client.

:class:`Attempts` makes the request's upstream calls. Before the first token a call that fails (an error
status in :data:`RETRY_STATUSES`, a connection error, no answer within the stall timeout) is retried, by
:class:`ResumePolicy` (count, time per recovery, exponential backoff while Ray routes around or replaces a
dead replica); after it, :class:`~baton.api.gateway.relay.ResumingRelay` calls :meth:`Attempts.again` with a
continuation (:func:`continuation_body`). A deployment with a fallback pool (a P/D deployment's
aggregated path) races it against the primary after a short wait (:class:`FailoverOpener`), and a pool
that just failed goes to the fallback first for a while (:class:`PoolHealth`). A reply other than 200 is
the client's error in OpenAI's shape (:func:`upstream_error`, :func:`transport_error`): an engine's 4xx
message reduced to what a client may read, a 503 with ``Retry-After`` while the model's app is starting.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from baton.api.gateway.engine_text import client_text
from baton.api.gateway.metering import Outcome
from baton.api.gateway.routing import Upstream
from baton.api.gateway.upstream import Opener, UpstreamClient, UpstreamResponse
from baton.core import errors
from baton.core.contracts import STEP_AGGREGATED_FALLBACK, STEP_DECODE_RESUME


class UpstreamTimeoutError(errors.UpstreamError):
    status = 504
    code = "upstream_timeout"
    title = "The model took too long to answer"


def _hex(s: str, n: int) -> bool:
    return len(s) == n and all(c in "0123456789abcdef" for c in s)


def trace_context(incoming: str | None) -> tuple[str, str]:
    """(traceparent to send upstream, trace id). Keeps a valid W3C ``traceparent``; starts one otherwise.

    The gateway does not create spans here; OpenTelemetry instrumentation replaces this function's
    body (a child span id under the same trace) without touching its callers."""
    if incoming:
        parts = incoming.strip().lower().split("-")
        if (len(parts) >= 4 and _hex(parts[0], 2) and parts[0] != "ff" and _hex(parts[1], 32)
                and parts[1] != "0" * 32 and _hex(parts[2], 16) and parts[2] != "0" * 16 and _hex(parts[3], 2)):
            return "-".join(parts[:4]), parts[1]
    trace_id = secrets.token_hex(16)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


def upstream_headers(request_id: str, traceparent: str, *, stream: bool) -> dict[str, str]:
    """The headers of every upstream call: the one seam for propagation (tracing, request ids)."""
    return {
        "content-type": "application/json",
        "accept": "text/event-stream" if stream else "application/json",
        "traceparent": traceparent,
        "x-request-id": request_id,
    }


#: Said when the model's Serve app is not there (yet) or has no ready replica: deploying, restarting, or
#: not deployed on this Ray cluster. The gateway has already checked the model exists and is granted.
STARTING_MESSAGE = "The model is starting or has no ready replica right now. Retry shortly."


STARTING_RETRY_AFTER_S = 5


def upstream_error(status: int, content: bytes) -> errors.BatonError:
    """An engine's error reply as a client error (4xx: its message is for the client), a 503 while the
    model's app is not serving (Serve's ingress answers 404 for an app it does not have, 503 without a
    ready replica), or a 502."""
    if status in (404, 503):
        return errors.UnavailableError(STARTING_MESSAGE, headers={"retry-after": str(STARTING_RETRY_AFTER_S)})
    if status >= 500 or status < 400:
        return errors.UpstreamError("The model failed to answer. Try again.")
    message = "The model rejected the request."
    code: str | None = None
    param: str | None = None
    try:
        data = orjson.loads(content)
        err = data.get("error") if isinstance(data, dict) else None
        src = err if isinstance(err, dict) else data if isinstance(data, dict) else {}
        if isinstance(src.get("message"), str) and src["message"]:
            message = client_text(src["message"])
        if isinstance(src.get("param"), str):
            param = src["param"]
        if isinstance(src.get("code"), str):
            code = src["code"]
    except orjson.JSONDecodeError:
        pass
    if status == 429:
        return errors.RateLimitedError("The model is overloaded right now. Retry shortly.",
                                       headers={"retry-after": "1"})
    exc = errors.ValidationError(message, param=param)
    if code:
        exc.extra["openai_code"] = code
    return exc


def transport_error(exc: httpx.HTTPError) -> errors.BatonError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeoutError()
    if isinstance(exc, httpx.ConnectError):
        return errors.UnavailableError("The model is not reachable right now. Try again shortly.")
    return errors.UpstreamError("The model failed to answer. Try again.")


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

    @property
    def on_decode_pool(self) -> bool:
        """Whether the call now streaming is a P/D deployment's decode pool's (not its prefill pool's, which
        the recovery ladder falls back to, nor an aggregated deployment's)."""
        return isinstance(self.opener, FailoverOpener) and self.opener.last == "primary"

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


def open_attempts(client: UpstreamClient, upstream: Upstream, endpoint: str, body: bytes, headers: dict[str, str],
                  *, stream: bool, read_timeout: float | None, policy: ResumePolicy | None, health: PoolHealth,
                  outcome: Outcome) -> Attempts:
    """The request's upstream calls: to its deployment's pool, raced against the fallback pool if it has one.
    ``read_timeout``: a stream's wait for the answer and between chunks (a stalled replica ends the attempt)."""
    opener = _opener(client, f"{upstream.base_url}/", headers, stream=stream, read_timeout=read_timeout)
    if upstream.fallback_url:
        fallback = _opener(client, f"{upstream.fallback_url}/", headers, stream=stream, read_timeout=read_timeout)
        opener = FailoverOpener(opener, fallback, health, upstream.base_url, outcome)
    return Attempts(opener, endpoint, body, policy=policy, outcome=outcome)


def _opener(client: UpstreamClient, base: str, headers: dict[str, str], *, stream: bool,
            read_timeout: float | None) -> Opener:
    """``opener(endpoint, body)``: one upstream call of the request (retries and resumes call it again)."""

    def call(endpoint: str, content: bytes) -> Awaitable[UpstreamResponse]:
        return client.post(base + endpoint, content, headers, stream=stream, read_timeout=read_timeout)

    return call
