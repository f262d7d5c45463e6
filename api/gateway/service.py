"""The gateway's request pipeline, with everything it needs built once per process.

Per request, in order: key -> principal (cached), model grant, parameter checks, prompt length against
the model's context, route to an upstream, rate-limit admission (requests, tokens reserved as
prompt + max_tokens, concurrency), the model's flow-control queue (:mod:`baton.api.gateway.flow`: who
goes upstream next when the pools are full), the upstream call with the tenant's ``cache_salt``, the
relay, and one outcome for metering, for correcting the token reservation and for the queue's counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from baton.api.gateway import spans as gw_spans
from baton.api.gateway.attempts import (
    PoolHealth,
    ResumePolicy,
    open_attempts,
    resumable,
    trace_context,
    transport_error,
    upstream_error,
    upstream_headers,
)
from baton.api.gateway.flow import (
    BATCH_BAND,
    BATCH_CLASS,
    FlowClass,
    FlowController,
    FlowRejected,
    Ticket,
    ViewPublisher,
)
from baton.api.gateway.metering import Outcome, UsageMeter
from baton.api.gateway.metrics import GatewayMetrics
from baton.api.gateway.principals import InvalidationListener, ModelGrant, Principal, PrincipalCache
from baton.api.gateway.ratelimit import (
    DENIED_CONCURRENCY,
    DENIED_TOKENS,
    DENIED_TOO_LARGE,
    Lease,
    RateLimiter,
    retry_after_header,
)
from baton.api.gateway.relay import ResumingRelay, SSERelay, TokenStall, read_usage, sse_headers
from baton.api.gateway.responses import ResponseStore
from baton.api.gateway.routing import Router, Upstream
from baton.api.gateway.schemas import MAX_N, SERVER_FIELDS
from baton.api.gateway.tokens import (
    InvalidTextError,
    PromptCounter,
    count_completion_prompt,
    prompt_count,
    surrogate_path,
    text_of,
)
from baton.api.gateway.upstream import UpstreamClient, UpstreamResponse
from baton.core import errors
from baton.core import models as m
from baton.core import telemetry as t

log = logging.getLogger(__name__)


class ContextLengthError(errors.ValidationError):
    code = "context_length_exceeded"


class RequestTooLargeError(errors.ValidationError):
    """The request asks for more tokens than the key's or its organization's per-request cap."""

    code = "request_too_large"


class UnsupportedParameterError(errors.ValidationError):
    code = "unsupported_parameter"


class ModelNotAvailableError(errors.UnavailableError):
    code = "model_not_available"


class WrongModelKindError(errors.ValidationError):
    code = "model_not_supported"


def check_kind(grant: ModelGrant, endpoint: str) -> None:
    """An embedding model serves ``/v1/embeddings`` only, and a generating model everything else."""
    if grant.kind == "embed" and endpoint != "embeddings":
        raise WrongModelKindError(f"The model `{grant.name}` is an embedding model: call /v1/embeddings.",
                                  param="model")
    if grant.kind != "embed" and endpoint == "embeddings":
        raise WrongModelKindError(f"The model `{grant.name}` does not make embeddings; use an embedding model "
                                  "(GET /v1/models lists yours).", param="model")


def check_tools(grant: ModelGrant, payload: dict[str, Any]) -> None:
    """Calling tools (``tool_choice`` ``auto``, the default when tools are given, ``required`` or a named
    function) needs a tool-call parser on the model's engines; ``none`` does not."""
    if not payload.get("tools") or grant.auto_tools or payload.get("tool_choice") == "none":
        return
    raise UnsupportedParameterError(
        f"The model `{grant.name}` is not set up for tool calls (no tool-call parser is configured for it): "
        'send `tool_choice: "none"`, or ask an operator to set the model\'s tool-call parser.',
        param="tool_choice")


@dataclass(slots=True)
class Call:
    """One validated request, ready to be forwarded."""

    endpoint: str  # "chat/completions" | "completions" | "embeddings"
    payload: dict[str, Any]
    grant: ModelGrant
    prompt_tokens: int
    completion_budget: int  # tokens reserved for the answer (all choices)
    stream: bool


@dataclass(slots=True)
class BatchLineRef:
    """A request that is a line of a batch (``baton.control.batches``): it runs in the batch band, under
    the line's own request id (a line run twice is metered once), and its usage names the batch. The
    gateway leaves the request's ``outcome`` here: the batch runner writes its usage row with the line's
    result, in one transaction (a gateway killed before its meter flushed would lose it otherwise)."""

    batch_id: str
    request_id: uuid.UUID
    outcome: Outcome | None = None


@dataclass(slots=True)
class _Admitted:
    """What admission settled for one request."""

    upstream: Upstream
    lease: Lease | None
    headers: dict[str, str]  # the rate limits' headers
    body: bytes
    client_usage: bool  # the client asked for usage in the stream
    can_resume: bool
    client_ids: bool  # the client asked for token ids itself


#: Texts up to this many characters are tokenized on the event loop (well under a millisecond); a thread
#: hop costs more than that.
INLINE_TOKENIZE_CHARS = 4096
#: No token of a real vocabulary is longer than this many characters: a text of more than
#: ``context_length * MAX_CHARS_PER_TOKEN`` characters cannot fit the context, and is refused without being
#: tokenized (a 4 MB prompt would hold a tokenizer thread for seconds before the same answer).
MAX_CHARS_PER_TOKEN = 32

#: Parameters Baton does not serve, with the reason a client gets.
UNSUPPORTED: dict[str, str] = {
    "audio": "Audio output is not supported.",
    "prediction": "Predicted outputs are not supported.",
    "web_search_options": "Web search is not supported.",
    "background": "Background responses are not supported.",
}


def check_parameters(payload: dict[str, Any]) -> None:
    """Rejects what Baton does not serve (OpenAI error, 400), before any upstream work."""
    for name, why in UNSUPPORTED.items():
        if payload.get(name) is not None:
            raise UnsupportedParameterError(why, param=name)
    modalities = payload.get("modalities")
    if isinstance(modalities, list) and any(x != "text" for x in modalities):
        raise UnsupportedParameterError("Only text output is supported.", param="modalities")
    if payload.get("store"):
        raise UnsupportedParameterError("Baton does not store completions; omit `store`.", param="store")
    n = payload.get("n")
    if n is not None and n > MAX_N:
        raise UnsupportedParameterError(f"At most {MAX_N} choices per request.", param="n")


#: The longest one background part may take to stop (the usage meter drains for up to 10 s of it).
STOP_LIMIT_S = 15.0


class Gateway:
    """Built once per process by the app's lifespan; the routes call :meth:`forward`."""

    def __init__(
        self,
        *,
        principals: PrincipalCache,
        listener: InvalidationListener | None,
        limiter: RateLimiter,
        meter: UsageMeter,
        router: Router,
        client: UpstreamClient,
        prompts: PromptCounter | None = None,
        default_completion_budget: int = 1024,
        max_embedding_input_tokens: int = 300_000,
        resume: ResumePolicy | None = None,
        stream_stall_s: float | None = None,
        token_stall: TokenStall | None = None,
        tracing: t.Tracing | None = None,
        metrics: GatewayMetrics | None = None,
        responses: ResponseStore | None = None,
        flow: FlowController | None = None,
        flow_views: ViewPublisher | None = None,
    ) -> None:
        self.principals = principals
        #: Flow control per model (None: off, requests go upstream as soon as the limits admit them).
        self.flow = flow
        self.flow_views = flow_views
        #: Stored ``/v1/responses`` answers (None: ``store`` and ``previous_response_id`` answer 503).
        self.responses = responses
        self.listener = listener
        self.limiter = limiter
        self.meter = meter
        self.router = router
        self.client = client
        self.prompts = prompts or PromptCounter()
        self.default_completion_budget = default_completion_budget
        self.max_embedding_input_tokens = max_embedding_input_tokens
        self.metrics = metrics
        #: None when tracing is off: then the hot path creates no span at all.
        self.tracer = tracing.tracer if tracing is not None and tracing.provider is not None else None
        self.resume = resume  # None: no retries, a broken stream ends with an SSE error
        #: Which upstream pools failed a call just now (their calls go to the fallback pool first for a while).
        self.pool_health = PoolHealth()
        #: Read timeout of streaming upstream calls (the wait for the answer and between chunks); None: the
        #: client's own. A stalled replica then ends the attempt instead of holding the request.
        self.stream_stall_s = stream_stall_s
        #: ... and once a resumable stream's tokens flow, the watchdog on the gaps between its chunks.
        self.token_stall = token_stall

    async def start(self) -> None:
        await self.meter.start()
        await self.principals.start()
        await self.limiter.start()
        if self.listener is not None:
            await self.listener.start()
        if self.flow_views is not None:
            await self.flow_views.start()

    async def stop(self) -> None:
        """Stops the background parts in turn, each given at most ``STOP_LIMIT_S`` (the meter its drain
        too): a part stuck on a dead connection is logged and left behind, shutdown never hangs."""
        parts: list[tuple[str, Any]] = []
        if self.listener is not None:
            parts.append(("key invalidation listener", self.listener.stop()))
        if self.flow_views is not None:
            parts.append(("flow view publisher", self.flow_views.stop()))
        parts += [("rate limiter", self.limiter.stop()), ("usage meter", self.meter.stop()),
                  ("key last-use recorder", self.principals.stop())]
        for name, stop in parts:
            task = asyncio.ensure_future(stop)
            done, _ = await asyncio.wait({task}, timeout=STOP_LIMIT_S)
            if not done:
                task.cancel()
                log.error("gateway shutdown: the %s did not stop within %.0f s; left behind", name, STOP_LIMIT_S)
            elif not task.cancelled() and task.exception() is not None:
                log.error("gateway shutdown: the %s failed to stop (%s)", name, type(task.exception()).__name__)

    # -- the entrance ---------------------------------------------------------------------------

    async def serve(self, endpoint: str, principal: Principal, payload: dict[str, Any], *,
                    traceparent: str | None, auth_ns: tuple[int, int] | None = None,
                    line: BatchLineRef | None = None) -> Response:
        """The pipeline's one entrance (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``; the
        route and :class:`~baton.api.gateway.fastpath.FastPath` alike), for an authenticated ``principal`` and a
        body valid against the endpoint's schema: validate it against the model and the key (:meth:`prepare_chat`
        and its siblings), then :meth:`forward` it."""
        if endpoint == "chat/completions":
            call = await self.prepare_chat(principal, payload)
        elif endpoint == "completions":
            call = await self.prepare_completion(principal, payload)
        else:
            call = await self.prepare_embeddings(principal, payload)
        return await self.forward(principal, call, traceparent=traceparent, auth_ns=auth_ns, line=line)

    # -- validation ---------------------------------------------------------------------------

    async def prepare_chat(self, principal: Principal, payload: dict[str, Any]) -> Call:
        grant = principal.model(payload["model"])
        check_kind(grant, "chat/completions")
        check_parameters(payload)
        check_tools(grant, payload)
        text, overhead = self.prompts.chat_text(payload["messages"])
        with text_of(payload):
            prompt = await self._count(text, grant, overhead)
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        return self._call("chat/completions", payload, grant, prompt, limit, choices=payload.get("n") or 1,
                          cap=principal.max_request_tokens)

    async def prepare_completion(self, principal: Principal, payload: dict[str, Any]) -> Call:
        grant = principal.model(payload["model"])
        check_kind(grant, "completions")
        check_parameters(payload)
        prompt_value = payload["prompt"]
        with text_of(payload):
            if isinstance(prompt_value, str):
                prompt = await self._count(prompt_value, grant, 0)
            else:
                prompt = count_completion_prompt(prompt_value, self.prompts, source=grant.source,
                                                 context_length=grant.context_length)
        choices = (payload.get("n") or 1) * prompt_count(prompt_value)
        return self._call("completions", payload, grant, prompt, payload.get("max_tokens") or 16, choices=choices,
                          cap=principal.max_request_tokens)

    async def prepare_embeddings(self, principal: Principal, payload: dict[str, Any]) -> Call:
        """Each input must fit the model's context; the request is metered (and limited) by its input tokens."""
        grant = principal.model(payload["model"])
        check_kind(grant, "embeddings")
        value = payload["input"]
        inputs: list[str | list[int]] = [value] if isinstance(value, str) or isinstance(value[0], int) else value
        total = 0
        with text_of(payload):
            for item in inputs:
                n = len(item) if isinstance(item, list) else await self._count(item, grant, 0)
                if n > grant.context_length:
                    raise ContextLengthError(
                        f"This model's maximum context length is {grant.context_length} tokens. However, an input "
                        f"has about {n} tokens. Please shorten it.", param="input")
                total += n
                if principal.max_request_tokens is not None and total > principal.max_request_tokens:
                    raise RequestTooLargeError(
                        f"This key may send at most {principal.max_request_tokens:,} input tokens per request; "
                        "this one has more. Split the inputs over several requests.", param="input")
                if total > self.max_embedding_input_tokens:
                    raise errors.ValidationError(
                        f"An embeddings request may hold at most {self.max_embedding_input_tokens:,} input tokens "
                        f"in all; this one has more. Split the inputs over several requests.", param="input")
        return Call("embeddings", payload, grant, total, 0, False)

    async def _count(self, text: str, grant: ModelGrant, overhead: int) -> int:
        """Prompt tokens. Counted on the event loop when that is cheap: the estimate (the prompt is short
        against the context: ``PromptCounter.count`` decides), or a real tokenization of a text of at most
        :data:`INLINE_TOKENIZE_CHARS` with the tokenizer already loaded; otherwise in a worker thread."""
        count = self.prompts.count
        n, ctx = len(text), grant.context_length
        if n > ctx * MAX_CHARS_PER_TOKEN:
            return n // MAX_CHARS_PER_TOKEN + 1  # fewer tokens than this is impossible: more than the context
        if (n * 8 < ctx or (n * 2 < ctx and text.isascii())  # an estimate is enough (as ``count`` decides)
                or (n <= INLINE_TOKENIZE_CHARS and self.prompts.loaded(grant.source))):
            return count(text, source=grant.source, context_length=ctx, overhead=overhead)[0]
        tokens, _ = await asyncio.to_thread(count, text, source=grant.source, context_length=ctx, overhead=overhead)
        return tokens

    def _call(self, endpoint: str, payload: dict[str, Any], grant: ModelGrant, prompt: int,
              max_tokens: int | None, *, choices: int, cap: int | None = None) -> Call:
        ctx = grant.context_length
        if cap is not None:
            max_tokens = _within_cap(endpoint, payload, prompt, max_tokens, choices=max(choices, 1), cap=cap,
                                     context=ctx)
        if prompt + (max_tokens or 0) > ctx:
            raise ContextLengthError(
                f"This model's maximum context length is {ctx} tokens. However, you requested about "
                f"{prompt + (max_tokens or 0)} tokens ({prompt} in the messages, {max_tokens or 0} in the "
                "completion). Please reduce the length of the messages or completion.",
                param="messages" if endpoint == "chat/completions" else "prompt",
            )
        budget = max_tokens if max_tokens is not None else min(max(ctx - prompt, 1), self.default_completion_budget)
        return Call(endpoint, payload, grant, prompt, budget * max(choices, 1), bool(payload.get("stream")))

    # -- forwarding ---------------------------------------------------------------------------

    async def forward(self, principal: Principal, call: Call, *, traceparent: str | None,
                      auth_ns: tuple[int, int] | None = None, line: BatchLineRef | None = None) -> Response:
        """The request's path: admit (route, limits), open the upstream (retrying), relay its answer.
        ``auth_ns``: unix-ns start and end of the key check (the ``gateway.auth`` span); ``line``: the batch
        line it runs (None: a client's own request)."""
        if not self.meter.accepting:
            raise errors.UnavailableError("The gateway is busy. Retry shortly.", headers={"retry-after": "1"})
        request_id = line.request_id if line is not None else uuid.uuid4()
        span = None
        if self.tracer is not None:
            span = gw_spans.start_request(
                self.tracer, traceparent=traceparent, start_ns=auth_ns[0] if auth_ns else time.time_ns(),
                request_id=request_id.hex, endpoint=call.endpoint, model=call.grant.name,
                tenant_id=principal.tenant_id, key_id=principal.key_id, stream=call.stream,
                max_tokens=call.payload.get("max_tokens"))
            if auth_ns:
                gw_spans.child(self.tracer, span, t.SPAN_GATEWAY_AUTH, *auth_ns)
        try:
            admitted = await self._admit(principal, call, request_id.hex, span)
        except BaseException as exc:
            if span is not None:
                gw_spans.rejected(span, exc)
            raise
        if self.metrics is not None:
            self.metrics.admitted(call.grant.name)
        outcome, tp = self._outcome(principal, call, request_id, admitted.upstream, span=span,
                                    traceparent=traceparent)
        headers = {"x-request-id": f"req-{request_id.hex}", **admitted.headers}
        cls, alone = principal.flow_class(call.grant.name), True
        if line is not None:
            cls, outcome.batch_id, line.outcome = BATCH_CLASS, line.batch_id, outcome
            if span is not None:
                span.set_attribute(t.ATTR_BATCH, line.batch_id)
        if self.flow is not None:
            alone = (await self._queue(principal, cls, call, outcome, admitted.lease)).alone
        if call.endpoint != "embeddings":
            admitted.body = with_priority(admitted.body, engine_priority(cls.priority, alone=alone))
        attempts = open_attempts(self.client, admitted.upstream, call.endpoint, admitted.body,
                                 upstream_headers(request_id.hex, tp, stream=call.stream), stream=call.stream,
                                 read_timeout=self.stream_stall_s if call.stream else None, policy=self.resume,
                                 health=self.pool_health, outcome=outcome)
        lease = admitted.lease
        try:
            response, open_exc = await attempts.first()
        except BaseException:
            self._end(outcome, lease, m.RequestStatus.CANCELLED, 499, "client_disconnected")
            raise
        if response is None:
            err = (transport_error(open_exc) if open_exc is not None
                   else errors.UpstreamError("The model failed to answer. Try again."))
            self._end(outcome, lease, m.RequestStatus.FAILED, err.status, err.code)
            raise err from None
        if response.status_code != 200:
            raise await self._refused(response, outcome, lease)
        if not call.stream:
            return self._answer(response, outcome, lease, headers)
        done = lambda o: self._finish(o, lease)  # noqa: E731 - the relay's end of the request
        if admitted.can_resume and self.resume is not None:
            return ResumingRelay(response, outcome, strip_usage=not admitted.client_usage,
                                 headers=sse_headers(headers), done=done, attempts=attempts, payload=call.payload,
                                 client_ids=admitted.client_ids, stall=self.token_stall)
        return SSERelay(response, outcome, strip_usage=not admitted.client_usage, headers=sse_headers(headers),
                        done=done)

    async def _queue(self, principal: Principal, cls: FlowClass, call: Call, outcome: Outcome,
                     lease: Lease | None) -> Ticket:
        """Waits for the model's room in its flow-control queue (the ``flow.queue`` span); a refusal (429, or
        503 when nothing can serve) or a client that left ends the request here, recorded. Returns the
        request's place, now upstream."""
        assert self.flow is not None
        flow = self.flow.model(call.grant.name)
        ticket = Ticket(principal.tenant_id, cls, call.prompt_tokens, live_tokens=lambda: outcome.completion_tokens)
        outcome.flow_class, outcome.flow_band = cls.name, cls.priority
        outcome.slo_ttft_ms, outcome.slo_tpot_ms = cls.ttft_ms, cls.tpot_ms
        start_ns = time.time_ns() if outcome.span is not None else 0
        q0 = time.perf_counter()
        refused: errors.BatonError | None = None
        try:
            await flow.enter(ticket)
        except errors.BatonError as exc:
            refused = exc
        except BaseException:
            outcome.queue_ms = (time.perf_counter() - q0) * 1000
            self._end(outcome, lease, m.RequestStatus.CANCELLED, 499, "client_disconnected")
            raise
        finally:
            if outcome.span is not None and self.tracer is not None:
                gw_spans.child(self.tracer, outcome.span, t.SPAN_FLOW_QUEUE, start_ns, time.time_ns(), attributes={
                    t.ATTR_FLOW_CLASS: cls.name, t.ATTR_FLOW_BAND: cls.priority,
                    t.ATTR_FLOW_OUTCOME: ticket.state if refused is None else getattr(refused, "reason", refused.code)})
        outcome.queue_ms = (time.perf_counter() - q0) * 1000
        if refused is not None:
            if self.metrics is not None:
                self.metrics.flow_rejected_by(principal.tenant_id, call.grant.name,
                                           refused.reason if isinstance(refused, FlowRejected) else "unavailable")
            self._end(outcome, lease, m.RequestStatus.FAILED, refused.status, refused.code)
            raise refused
        outcome.dispatch_pc = time.perf_counter()
        outcome.ticket = ticket
        return ticket

    async def _refused(self, response: UpstreamResponse, outcome: Outcome, lease: Lease | None) -> errors.BatonError:
        """The client's error for an upstream answer other than 200 (the request ends failed)."""
        err = upstream_error(response.status_code, await response.drain())
        self._end(outcome, lease, m.RequestStatus.FAILED, err.status, err.code)
        return err

    async def _admit(self, principal: Principal, call: Call, rid: str, span: Any) -> _Admitted:
        """Where the request goes, what is sent there, and the rate limiter's decision (raised if refused)."""
        upstream = await self.router.resolve(call.grant.name)
        if upstream is None:
            raise ModelNotAvailableError(f"The model `{call.grant.name}` is not being served right now.",
                                         headers={"retry-after": "5"})
        can_resume = self.resume is not None and call.stream and resumable(call.endpoint, call.payload)
        client_ids = bool(call.payload.get("return_token_ids"))
        if can_resume:
            call.payload["return_token_ids"] = True
        body, client_usage = upstream_body(call, principal.cache_salt)
        rl_start = time.time_ns() if span is not None else 0
        decision = await self.limiter.admit(rid, principal.limit_scopes, call.prompt_tokens + call.completion_budget)
        if span is not None and self.tracer is not None:
            gw_spans.child(self.tracer, span, t.SPAN_GATEWAY_RATELIMIT, rl_start, time.time_ns(),
                             attributes={"baton.ratelimit.allowed": decision.allowed})
        if not decision.allowed:
            raise _limited(decision.reason, decision.retry_after_s, decision.headers)
        return _Admitted(upstream, decision.lease, decision.headers, body, client_usage, can_resume, client_ids)

    def _outcome(self, principal: Principal, call: Call, request_id: uuid.UUID, upstream: Upstream, *, span: Any,
                 traceparent: str | None) -> tuple[Outcome, str]:
        """The request's outcome (what metering records) and the ``traceparent`` sent upstream."""
        if span is None:
            tp, trace_id = trace_context(traceparent)
        else:
            if upstream.deployment:
                span.set_attribute(t.ATTR_DEPLOYMENT, upstream.deployment)
            tp = t.traceparent_of(span)
            trace_id = tp[3:35]
        outcome = Outcome(
            request_id=request_id, tenant_id=principal.tenant_id, api_key_id=principal.key_id,
            model=call.grant.name, endpoint=call.endpoint, stream=call.stream, started=time.time(),
            deployment=upstream.deployment, trace_id=trace_id, prompt_tokens=call.prompt_tokens,
            start_pc=time.perf_counter(),
        )
        if span is not None:
            outcome.span = span
            outcome.span_id = tp[36:52]
        return outcome, tp

    def _answer(self, response: UpstreamResponse, outcome: Outcome, lease: Lease | None,
                headers: dict[str, str]) -> Response:
        """A whole (not streamed) answer, metered from its usage."""
        content = response.content
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            self._end(outcome, lease, m.RequestStatus.FAILED, 502, "upstream_error")
            raise errors.UpstreamError("The model failed to answer. Try again.") from None
        read_usage(data.get("usage") if isinstance(data, dict) else None, outcome)
        outcome.metered = True
        outcome.end_pc = outcome.first_token = time.perf_counter()
        self._finish(outcome, lease)
        return Response(content, status_code=200, headers=headers, media_type="application/json")

    def _end(self, outcome: Outcome, lease: Lease | None, status: m.RequestStatus, http_status: int,
             code: str | None) -> None:
        outcome.status = status
        outcome.http_status = http_status
        outcome.error_code = code
        outcome.end_pc = time.perf_counter()
        self._finish(outcome, lease)

    def _finish(self, outcome: Outcome, lease: Lease | None) -> None:
        """The one end of every admitted request: meter it, correct and release its lease, end its span."""
        self.meter.record(outcome)
        if self.metrics is not None:
            self.metrics.finished(outcome.model)
        actual = outcome.prompt_tokens + outcome.completion_tokens if outcome.metered else 0
        self.limiter.finish(lease, actual)
        ticket = outcome.ticket
        if ticket is not None and self.flow is not None:
            outcome.ticket = None
            self._left_queue(outcome, ticket)
        span = outcome.span
        if span is not None and self.tracer is not None:
            try:
                gw_spans.finish_request(self.tracer, span, outcome)
                outcome.span = None
            except Exception:  # tracing never breaks serving
                log.debug("span of %s not finished", outcome.request_id, exc_info=True)

    def _left_queue(self, outcome: Outcome, ticket: Ticket) -> None:
        """The request's room goes back to its model's queue, its tokens to its tenant's counter, and a
        completed stream's latencies after dispatch to the model's learned limit."""
        assert self.flow is not None
        flow = self.flow.model(outcome.model)
        flow.leave(ticket, outcome.completion_tokens)
        if (outcome.status is not m.RequestStatus.COMPLETED or not outcome.stream or outcome.dispatch_pc is None
                or outcome.recovery_steps):  # a recovered request's latency measures the failure, not the load
            return  # ``leave`` dispatched what its room lets go
        ttft_s = outcome.first_token - outcome.dispatch_pc if outcome.first_token is not None else None
        tpot_s = None
        if outcome.first_token is not None and outcome.completion_tokens > 1:
            tpot_s = (outcome.end_pc - outcome.first_token) / (outcome.completion_tokens - 1)
        if ttft_s is not None:
            flow.first_token(ttft_s)
        limit = self.flow.capacities.model(outcome.model)
        before = limit.limit()
        limit.observe(prompt_tokens=outcome.prompt_tokens, ttft_s=ttft_s, tpot_s=tpot_s)
        if limit.limit() != before:  # a grown limit lets more go now
            flow.poke()


def engine_priority(band: int, *, alone: bool) -> int:
    """vLLM's request ``priority`` (the engines run the priority scheduling policy: a lower value goes
    first): a higher band first, and inside a band a request whose tenant had nothing else running on the
    model ahead of a backlogged tenant's, so the engines' own queues favour light tenants as the gateway's
    does (band 100 alone -> 0, band 0 backlogged -> 201, a batch line 202 or 203)."""
    return 2 * (100 - min(max(band, BATCH_BAND), 100)) + (0 if alone else 1)


def with_priority(body: bytes, priority: int) -> bytes:
    """``body`` (a JSON object from :func:`upstream_body`, which strips any client ``priority``) with the
    engine priority as its first member."""
    return b'{"priority":%d,' % priority + body[1:]


def upstream_body(call: Call, salt: str) -> tuple[bytes, bool]:
    """The engine's request body and whether the client itself asked for stream usage.

    Server-controlled fields are replaced (the tenant's ``cache_salt``; the ``priority`` is added once the
    request leaves its queue: :func:`with_priority`), stream usage is always requested. Integers beyond 64
    bits (which orjson refuses) are written by the standard library; anything JSON cannot carry at all is
    the client's error (400), before any limit is spent."""
    payload = call.payload
    for name in SERVER_FIELDS:
        payload.pop(name, None)
    if call.endpoint != "embeddings":  # an embedding engine keeps no prefix cache to partition
        payload["cache_salt"] = salt
    client_usage = True
    if call.stream:
        options = payload.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        client_usage = bool(options.get("include_usage"))
        options["include_usage"] = True
        payload["stream_options"] = options
    try:
        return orjson.dumps(payload), client_usage
    except TypeError:
        bad = surrogate_path(payload)  # orjson refuses lone surrogates; no engine could read them either
        if bad is not None:
            raise InvalidTextError(bad) from None
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode(), client_usage
    except (TypeError, ValueError):
        raise errors.ValidationError("The request holds a value that JSON cannot represent.") from None


def _limited(reason: int, retry_after: float, headers: dict[str, str]) -> errors.BatonError:
    all_headers = {**headers, **retry_after_header(retry_after)}
    if reason == -1:
        return errors.UnavailableError("Rate limits cannot be checked right now. Retry shortly.",
                                       headers=all_headers)
    if reason == DENIED_TOO_LARGE:
        return errors.RateLimitedError(
            "Request too large: its prompt and max_tokens exceed your tokens-per-minute limit. "
            "Reduce max_tokens or the prompt.", headers=all_headers, openai_type="tokens")
    if reason == DENIED_TOKENS:
        return errors.RateLimitedError(
            f"Rate limit reached for tokens per minute. Please try again in {retry_after:.1f}s.",
            headers=all_headers, openai_type="tokens")
    if reason == DENIED_CONCURRENCY:
        return errors.RateLimitedError("Too many concurrent requests. Please try again shortly.",
                                       headers=all_headers, openai_type="requests")
    return errors.RateLimitedError(
        f"Rate limit reached for requests per minute. Please try again in {retry_after:.1f}s.",
        headers=all_headers, openai_type="requests")


def _within_cap(endpoint: str, payload: dict[str, Any], prompt: int, max_tokens: int | None, *, choices: int,
                cap: int, context: int) -> int | None:
    """The completion limit of a request under a per-request token cap (``cap`` tokens for the prompt and
    every choice's completion together). A request that asks for more is refused; one that names no limit
    gets what the cap leaves (within the model's context), sent to the engine as its limit, so that the cap
    holds for what it generates too."""
    chat = endpoint == "chat/completions"
    if prompt >= cap:
        raise RequestTooLargeError(
            f"This key allows at most {cap:,} tokens per request, prompt and completion together; the prompt "
            f"alone has about {prompt:,}. Shorten it.", param="messages" if chat else "prompt")
    if max_tokens is None:
        if prompt >= context:
            return None  # the context check refuses it, in its own words
        limit = min((cap - prompt) // choices, context - prompt)
        if limit < 1:
            raise RequestTooLargeError(
                f"This key allows at most {cap:,} tokens per request, prompt and completion together: too few "
                f"are left for {choices} choices. Ask for fewer (`n`) or shorten the prompt.", param="n")
        payload["max_completion_tokens" if chat else "max_tokens"] = limit
        return limit
    if prompt + max_tokens * choices > cap:
        name = "max_completion_tokens" if chat and payload.get("max_completion_tokens") else "max_tokens"
        raise RequestTooLargeError(
            f"This key allows at most {cap:,} tokens per request, prompt and completion together; this one asks "
            f"for about {prompt + max_tokens * choices:,} ({prompt:,} in the prompt, {max_tokens:,} x {choices} "
            f"in the completion). Lower `{name}` to {max(cap - prompt, 0) // choices:,} or less.", param=name)
    return max_tokens
