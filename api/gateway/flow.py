"""Flow control per model: the gateway's queue between admission (rate limits) and the upstream call.

Limits say how much a tenant may send; they say nothing about who is served first once a model's
engines are full. Without a queue of the gateway's own, every admitted request waits alike inside Ray
Serve and vLLM, and one tenant's flood becomes every tenant's TTFT. A :class:`ModelFlow` per model
decides who goes upstream next:

- **Room** comes from a capacity function (:mod:`baton.api.gateway.capacity`: a limit learned from the
  latencies the model's requests measure, held down by what the model's engines report of their own
  queues and KV caches): how many requests the model's pools should hold at once.
  ``None`` (no view yet) turns the queue off for the model: requests go straight upstream as with
  limits only, never an outage.
- **Bands**: a request's band is its tenant's SLO priority (0-100); a higher band always goes first.
- **Fair share inside a band**: the virtual token counter (VTC) of Sheng et al., "Fairness in Serving
  Large Language Models" (OSDI 2024). A tenant's counter grows by the tokens it is served, divided by
  its weight: prompt tokens (``w_p``) when its request goes upstream, generated tokens (``w_q``) as they
  stream (read live from the request's outcome). The backlogged tenant with the smallest counter goes
  next; a tenant that joins the backlog is lifted to the smallest counter among those already waiting
  (or the last dispatched one's), so idle time banks no credit. The paper bounds the service gap of
  two backlogged tenants by about twice the largest request's cost (``w_p * L_in + w_q * L_out``): a
  heavy tenant cannot starve a light one. VTC over deficit round robin or weighted fair queueing
  because those need a request's cost up front, and the generated length is unknown until it ends.
- **Bounds**: at most ``queue_max`` requests wait per model. A full queue makes room for a higher-band
  arrival, and for an arrival whose tenant has fewer requests waiting than its band's longest queue (the
  longest queue drops its newest: :meth:`ModelFlow._place_for`), else turns the arrival away; a request
  that waited ``ttl_s`` leaves, and one that would (its tenant's requests already waiting, at the tenant's
  weighted share of the dispatch rate: :meth:`ModelFlow.predicted_wait_s`) is turned away at once.
  Both are 429 with ``Retry-After`` (back-pressure); 503 only when nothing can serve (no room at all
  for the whole wait).
- **Shedding**: a ``sheddable`` request whose predicted TTFT (the wait ahead of it at the measured
  dispatch rate, plus the measured time to first token upstream) already passes its SLO's TTFT target
  is refused at once (429), before a non-sheddable request is made to wait behind it.
- **Sparse tenants**: a tenant with nothing running or waiting on the model goes at once, with up to a
  burst of such requests in flight beside the limit's (:meth:`ModelFlow._sparse`), so a light tenant's
  request never waits for a heavy one's stream to end, even while a shrinking limit leaves more in flight
  than it allows. Only a light tenant's: its recent service below another recent tenant's of its band,
  its counter not ahead of any waiting there (:meth:`ModelFlow._light`), or a heavy tenant sending one
  long request at a time (nothing in flight between two) would hold the burst with its long streams and
  pass a light tenant's waiting requests each time.

Several processes, one fairness: :class:`ViewPublisher` writes every queue's view to Redis once a
second, off the request path (:data:`baton.core.contracts.FLOW_VIEW_PREFIX`), for the operators' view of
all gateway processes, and reads the other processes' views back. Each queue then counts a tenant's
service in the other processes into its counter (:meth:`ModelFlow.merge_remote`), a tenant that sent to
the model through another process makes the model contended here too, and a band waits while a higher
band waits in another process. Each process learns its own limit; while tenants of one band are
backlogged in several processes, each takes its weighted part of all the processes' limits together
(:meth:`ModelFlow.limit_now`), so two tenants each pinned to its own gateway share by weight too.
What the other processes served is at most about two seconds old;
without Redis each process is fair on its own (the capacity's limits converge without any exchange,
see :mod:`baton.api.gateway.capacity`). The queue is pure asyncio, no I/O; the fast path (nothing
waiting, room upstream) costs a comparison and two counter updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from baton.api.gateway.capacity import Capacities
from baton.core import errors
from baton.core.contracts import (
    ENGINE_LOAD_INDEX,
    FLOW_VIEW_INDEX,
    FLOW_VIEW_TTL_S,
    EngineLoad,
    flow_view_key,
    flow_view_message,
    index_live_from,
    indexed_set,
    parse_engine_load,
    parse_flow_view,
)

log = logging.getLogger(__name__)

#: Seconds of a run of traffic the dispatch rate must rest on before a wait predicted from it refuses a request.
RATE_SETTLED_S = 5.0

#: Prompt and generated tokens' weights in a tenant's counter (VTC's w_p, w_q: a generated token costs
#: the engine about twice a prompt token's time; the paper's own choice).
PROMPT_WEIGHT = 1.0
DECODE_WEIGHT = 2.0


@dataclass(frozen=True, slots=True)
class FlowClass:
    """How one tenant's traffic on one model is queued (from its SLO policy; defaults: no policy)."""

    name: str = "default"
    priority: int = 50  #: the band (0-100, higher first)
    weight: float = 1.0  #: share inside the band, relative to the other tenants' weights
    sheddable: bool = False
    ttft_ms: int | None = None  #: the SLO's TTFT target (shedding predicts against it)
    tpot_ms: int | None = None  #: the SLO's time per output token (SLO attainment)
    max_wait_s: float | None = None  #: the longest a request waits for room (None: the queue's ``ttl_s``)
    max_waiting: int | None = None  #: a tenant's requests that may wait at once (None: only ``queue_max``)


DEFAULT_CLASS = FlowClass()
#: The band of batch lines (docs/batch.md): below every SLO band (0-100), so a line goes upstream only when
#: no interactive request waits; it never takes the sparse burst, and holds at most :func:`batch_limit`.
BATCH_BAND = -1
#: Batch lines wait for room as long as it takes (the runner holds only a few at a time).
BATCH_CLASS = FlowClass(name="batch", priority=BATCH_BAND, max_wait_s=3600.0)


def batch_limit(limit: int, *, interactive: bool) -> int:
    """A batch line goes upstream only while fewer requests than this (all bands together) are in flight on
    the model, of a learned ``limit``. With no interactive request on the model lately, all but one slot
    (which an arrival then finds free); with interactive traffic, a quarter of it (at least one): every line
    running shares the engines' steps with an interactive request's prefill, and on a small host each one
    costs it TTFT (``baton bench batch`` measures the interactive TTFT beside a batch against alone)."""
    if interactive:
        return max(limit // 4, 1)
    return max(limit - 1, 1)


@dataclass(frozen=True, slots=True)
class FlowSettings:
    queue_max: int = 256  #: requests waiting per model, all bands together
    ttl_s: float = 30.0  #: the longest a request waits for room
    #: A sparse tenant's burst over the limit, as a share of it (at least one request; 0: none).
    sparse_burst: float = 0.25
    #: The burst is for tenants served less than another tenant that sent to the model this recently.
    recent_s: float = 5.0
    prompt_weight: float = PROMPT_WEIGHT
    decode_weight: float = DECODE_WEIGHT


class FlowRejected(errors.RateLimitedError):
    """Back-pressure: the queue is full, the wait passed its TTL, or the SLO cannot be met (429)."""

    code = "model_overloaded"
    title = "The model is overloaded"

    def __init__(self, message: str, *, reason: str, retry_after_s: float) -> None:
        super().__init__(message, headers={"retry-after": str(max(1, math.ceil(retry_after_s)))})
        self.reason = reason


class FlowUnavailable(errors.UnavailableError):
    """Nothing could serve for the whole wait (no room at all): 503."""

    code = "model_unavailable"


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place: in a band's queue, then upstream until :meth:`ModelFlow.leave`."""

    tenant: uuid.UUID
    cls: FlowClass
    prompt_tokens: int
    live_tokens: Callable[[], int] = lambda: 0  #: tokens generated so far (the outcome's live count)
    enqueued: float = 0.0
    waited_s: float = 0.0
    state: str = "new"  # new | waiting | running | rejected | done
    charged_decode: int = 0
    alone: bool = False  #: its tenant had nothing else running on the model when it went upstream
    sparse: bool = False  #: it went at once as a sparse tenant's, beside the limit
    #: its tenant had nothing running or waiting on the model when it arrived (may go beside the limit)
    new_flow: bool = False
    _future: asyncio.Future[None] | None = field(default=None, repr=False)


class _Band:
    __slots__ = ("last_counter", "priority", "queues")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.queues: dict[uuid.UUID, deque[Ticket]] = {}
        self.last_counter = 0.0

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def weight(self) -> float:
        """The weights of the tenants waiting in the band, summed."""
        return sum(q[0].cls.weight for q in self.queues.values() if q)


class _Rate:
    """An exponentially weighted rate of events per second (the queue's dispatches). A gap of more than
    ``idle_s`` starts it afresh: the rate of a model coming out of an idle spell is its new traffic's, not
    an average dragged down by the spell (which would read a flood's first seconds as a trickle)."""

    __slots__ = ("_t", "half_life_s", "idle_s", "since", "value")

    def __init__(self, half_life_s: float = 10.0, idle_s: float = 30.0) -> None:
        self.half_life_s = half_life_s
        self.idle_s = idle_s
        self.value: float | None = None
        self.since: float | None = None  #: the first event of the current run of traffic
        self._t: float | None = None

    def event(self, now: float) -> None:
        if self._t is None or now - self._t > self.idle_s:
            self._t = self.since = now
            self.value = None
            return
        dt = max(now - self._t, 1e-3)
        self._t = now
        a = 1 - 0.5 ** (dt / self.half_life_s)
        inst = 1.0 / dt
        self.value = inst if self.value is None else self.value + a * (inst - self.value)

    def settled(self, now: float, min_s: float) -> float | None:
        """The rate, once it rests on at least ``min_s`` of the current traffic (else None)."""
        if self.value is None or self.since is None or now - self.since < min_s:
            return None
        return self.value


class _FractionalSlot:
    """A limit of ``x`` requests where ``x`` is not a whole number: ``floor(x)`` slots always, and one more
    slot kept busy for ``x - floor(x)`` of the time. A request holds its slot until it ends, so the slot
    is not opened and closed on a clock (a request started in an open moment would hold it for its whole
    length): a credit, in seconds, grows by the fraction every second and shrinks by one every second the
    slot is in use, and the slot takes a request only while the credit is positive. A request of ``d``
    seconds in the slot is then followed by about ``d x (1 - f) / f`` seconds without one: busy ``f`` of
    the time. The credit stays within [-:data:`DEBT_S`, :data:`CREDIT_S`]: idle time banks at most a
    moment, and one very long request does not close the slot for minutes."""

    CREDIT_S = 1.0
    DEBT_S = 30.0

    __slots__ = ("_at", "_fraction", "_whole", "credit")

    def __init__(self) -> None:
        self.credit = 0.0
        self._at: float | None = None
        self._whole = 0
        self._fraction: float | None = None  # None: no fractional limit in force

    def reset(self) -> None:
        self.credit, self._at, self._fraction = 0.0, None, None

    def tick(self, now: float, in_flight: int) -> None:
        """Accounts for the time since the last tick, over which ``in_flight`` requests were upstream."""
        if self._at is not None and self._fraction is not None:
            used = 1.0 if in_flight > self._whole else 0.0
            self.credit += (self._fraction - used) * max(now - self._at, 0.0)
            self.credit = min(max(self.credit, -self.DEBT_S), self.CREDIT_S)
        self._at = now

    def limit(self, x: float, now: float, in_flight: int) -> int:
        """The whole requests ``x`` allows now (``in_flight`` upstream)."""
        self.tick(now, in_flight)
        self._whole = int(x)
        self._fraction = x - self._whole
        return self.peek(x)

    def peek(self, x: float) -> int:
        """What :meth:`limit` would answer for ``x``, with nothing accounted (for the operators' view)."""
        whole = int(x)
        return whole + 1 if x > whole and self.credit > 0 else whole


class ModelFlow:
    """One model's queue in this process. ``capacity()``: requests the pools should hold now, or None."""

    def __init__(self, model: str, capacity: Callable[[], int | None], settings: FlowSettings | None = None,
                 *, clock: Callable[[], float] = time.monotonic, saturated: Callable[[], None] | None = None) -> None:
        self.model = model
        self.capacity = capacity
        #: Told each time the limit holds a request back (the capacity's evidence that its limit is in use).
        self._saturated = saturated or (lambda: None)
        self.settings = settings or FlowSettings()
        self.clock = clock
        self.in_flight = 0
        self.sparse_in_flight = 0  #: of in_flight, requests that went at once as sparse tenants'
        self.waiting = 0
        self._bands: dict[int, _Band] = {}
        self._running: dict[uuid.UUID, list[Ticket]] = {}
        self._counters: dict[uuid.UUID, float] = {}
        self._dispatch_rate = _Rate()
        self.ttft_s: float | None = None  #: measured upstream time to first token (EWMA)
        # per-tenant figures, read by the metrics and the console
        self.shed: dict[tuple[uuid.UUID, str], int] = {}
        self.served_tokens: dict[uuid.UUID, list[int]] = {}  # tenant -> [prompt, decode]
        self.queued_s: dict[uuid.UUID, float] = {}  # tenant -> seconds its started requests waited, summed
        self._seen: dict[uuid.UUID, float] = {}  # tenant -> when it last sent a request to the model
        self._interactive_at = -math.inf  # when an interactive (not batch) request last arrived
        self._band_of: dict[uuid.UUID, int] = {}  # tenant -> the band of its last request
        self._served: dict[uuid.UUID, float] = {}  # tenant -> weighted cost served here (no lifts), for the others
        self._recent: dict[uuid.UUID, tuple[float, float]] = {}  # tenant -> (decayed service, as of when)
        # the other gateway processes, as of their last views: weighted cost served, when last seen (this clock)
        self._remote_served: dict[uuid.UUID, float] = {}
        self._remote_seen: dict[uuid.UUID, float] = {}
        self._remote_top: int | None = None  # the highest band with requests waiting in another process
        self._remote_limits = 0  # the other processes' learned limits for the model, summed
        self._remote_backlog: dict[int, float] = {}  # band -> weights of the tenants waiting there, summed
        self._part = _FractionalSlot()  # the last slot of this process's part of the processes' limits
        # Jain's index over the tenants backlogged since the last reading: their weighted service then
        self._window_service: dict[uuid.UUID, float] = {}
        self._window_backlog: dict[uuid.UUID, int] = {}  # tenant -> band

    # -- the request path ---------------------------------------------------------------------

    async def enter(self, ticket: Ticket) -> None:
        """Returns once the request may go upstream; raises :class:`FlowRejected` (429) or
        :class:`FlowUnavailable` (503). A cancelled wait (the client left) gives its place back."""
        self._seen[ticket.tenant] = now = self.clock()
        self._band_of[ticket.tenant] = ticket.cls.priority
        ticket.new_flow = ticket.tenant not in self._running and not any(
            ticket.tenant in b.queues for b in self._bands.values())
        limit = self.limit_now(ticket.cls.priority, arriving=ticket)
        if ticket.cls.priority > BATCH_BAND:
            self._interactive_at = now
        elif limit is not None:
            limit = self._batch_limit(limit)
        if limit is None or (self.waiting == 0 and self.in_flight < limit and not self._held(ticket.cls.priority)):
            self._start(ticket, waited_s=0.0)
            return
        if self._sparse(ticket, limit):
            self._start(ticket, waited_s=0.0, sparse=True)
            return
        self._saturated()
        self._admit_to_queue(ticket)
        loop = asyncio.get_running_loop()
        fut = ticket._future = loop.create_future()
        self._dispatch()
        if ticket.state == "running":
            return
        ttl_s = self.ttl_s(ticket.cls)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=ttl_s)
        except TimeoutError:
            if ticket.state == "running":  # dispatched in the same tick as the timeout
                return
            self._remove(ticket)
            self._rejected(ticket, "ttl")
            if not self.capacity():
                raise FlowUnavailable(f"The model `{self.model}` has no capacity to serve right now. Retry shortly.",
                                      headers={"retry-after": "5"}) from None
            raise FlowRejected(
                f"The model `{self.model}` is overloaded: the request waited {ttl_s:g} s for room. "
                "Retry later.", reason="ttl", retry_after_s=self.retry_after_s()) from None
        except asyncio.CancelledError:
            if ticket.state == "running":
                self.leave(ticket)
            else:
                self._remove(ticket)
            raise
        # the future carries a rejection when a higher band took the place (queue full)
        fut.result()

    def leave(self, ticket: Ticket, completion_tokens: int | None = None) -> None:
        """The request ended (any way): its generated tokens are charged and its room goes to the next."""
        if ticket.state != "running":
            return
        ticket.state = "done"
        self._part.tick(self.clock(), self.in_flight)
        self.in_flight -= 1
        if ticket.sparse:
            self.sparse_in_flight -= 1
        running = self._running.get(ticket.tenant)
        if running is not None:
            with contextlib.suppress(ValueError):
                running.remove(ticket)
            if not running:
                del self._running[ticket.tenant]
        tokens = ticket.live_tokens() if completion_tokens is None else completion_tokens
        self._charge_decode(ticket, tokens)
        self._dispatch()

    def contended(self, within_s: float) -> bool:
        """Two or more tenants sent requests to the model in the last ``within_s`` seconds."""
        since = self.clock() - within_s
        recent = [t for t, at in self._seen.items() if at >= since]
        if len(self._seen) > 2 * len(recent) + 64:  # forget tenants long gone
            self._seen = {t: self._seen[t] for t in recent}
            self._band_of = {t: self._band_of[t] for t in recent if t in self._band_of}
            faded = self.clock() - 20 * self.settings.recent_s  # a service decayed below e^-20 of itself
            self._recent = {t: v for t, v in self._recent.items() if v[1] >= faded}
        if len(recent) >= 2:
            return True
        remote = {t for t, at in self._remote_seen.items() if at >= since}
        return len(remote | set(recent)) >= 2

    def merge_remote(self, remote: RemoteFigures) -> None:
        """What the other gateway processes report for this model: each tenant's weighted service there
        (added to its counter here), how long ago it last sent there (for :meth:`contended`), and the bands
        that wait there (a lower band here waits for them, as it would in one process)."""
        now = self.clock()
        self._remote_served = remote.served
        self._remote_seen = {t: now - ago for t, ago in remote.seen_s_ago.items()}
        self._remote_top = max((band for band, n in remote.waiting.items() if n > 0), default=None)
        self._remote_limits = sum(remote.limits)
        self._remote_backlog = dict(remote.backlog)
        self._dispatch()  # a higher band elsewhere may have drained, or this process's share grown

    def limit_now(self, band: int | None = None, *, arriving: Ticket | None = None) -> int | None:
        """The requests this process may have upstream now: its learned limit, or, while tenants of ``band``
        (default: the highest band waiting here) are backlogged both here and in other processes, its
        weighted part of every process's limits together: ``sum of limits x W_here / (W_here + W_there)``,
        W the weights of the tenants waiting in the band (here: with an ``arriving`` request's tenant).
        Two tenants each pinned to its own gateway then share the model by weight as they would in one
        process, and the engines see the same total. A part that is not a whole number of requests is held
        as whole requests plus one slot used for the fraction of the time (:class:`_FractionalSlot`): limits
        of 1 to 3 requests, as on a CPU host, split 2:1 as well as limits of tens. While no other process has
        a backlog in the band (or there is no view of the others), the learned limit alone."""
        part = self.part_now(band, arriving=arriving)
        if part is None or isinstance(part, int):
            self._part.reset()
            return part
        return self._part.limit(part, self.clock(), self.in_flight)

    def part_now(self, band: int | None = None, *, arriving: Ticket | None = None) -> int | float | None:
        """What :meth:`limit_now` holds to: the learned limit (an int), or this process's weighted part of
        every process's limits (a float), or None (no view)."""
        own = self.capacity()
        if own is None or not self._remote_limits:
            return own
        if band is None:
            band = max((b.priority for b in self._bands.values() if b.queues), default=None)
            if band is None:
                return own
        there = self._remote_backlog.get(band, 0.0)
        mine = self._bands.get(band)
        here = mine.weight() if mine is not None else 0.0
        if arriving is not None and (mine is None or arriving.tenant not in mine.queues):
            here += arriving.cls.weight
        if there <= 0 or here <= 0:
            return own
        return (own + self._remote_limits) * here / (here + there)

    def first_token(self, ttft_s: float) -> None:
        """The upstream's measured time to first token of a request (for the predicted TTFT)."""
        self.ttft_s = ttft_s if self.ttft_s is None else self.ttft_s + 0.1 * (ttft_s - self.ttft_s)

    def poke(self) -> None:
        """Room may have grown (a fresher capacity view): dispatch what fits."""
        self._dispatch()

    # -- figures --------------------------------------------------------------------------------

    def counter(self, tenant: uuid.UUID) -> float:
        """The tenant's virtual counter now: what it was served, live tokens of its running requests included."""
        c = self._counters.get(tenant, 0.0) + self._remote_served.get(tenant, 0.0)
        for t in self._running.get(tenant, ()):
            c += max(t.live_tokens() - t.charged_decode, 0) * self.settings.decode_weight / t.cls.weight
        return c

    def retry_after_s(self) -> float:
        rate = self._dispatch_rate.value
        if not rate:
            return 1.0
        return min(max(self.waiting / rate, 1.0), self.settings.ttl_s)

    def predicted_ttft_s(self, ahead: int) -> float | None:
        """Wait behind ``ahead`` requests at the measured dispatch rate, plus the upstream TTFT."""
        rate = self._dispatch_rate.value
        if not rate or self.ttft_s is None:
            return None
        return ahead / rate + self.ttft_s

    def ttl_s(self, cls: FlowClass) -> float:
        """The longest a request of ``cls`` waits for room: its policy's, else the queue's setting."""
        return cls.max_wait_s if cls.max_wait_s is not None else self.settings.ttl_s

    def _waiting_of(self, ticket: Ticket) -> int:
        band = self._bands.get(ticket.cls.priority)
        return len(band.queues.get(ticket.tenant, ())) if band is not None else 0

    def predicted_wait_s(self, ticket: Ticket) -> float | None:
        """How long ``ticket`` would wait behind its own tenant's requests already waiting in its band, at the
        tenant's weighted share of the measured dispatch rate (its weight over the weights waiting in the band,
        its own included); None when its tenant has nothing waiting (its first request goes by its counter's
        turn) or the rate does not yet rest on ``RATE_SETTLED_S`` of the current traffic (a model coming out of
        an idle spell is not judged on its first dispatches). Higher bands only make the wait longer: this is a
        lower bound, so a refused request would not have started in time."""
        band = self._bands.get(ticket.cls.priority)
        mine = self._waiting_of(ticket)
        rate = self._dispatch_rate.settled(self.clock(), RATE_SETTLED_S)
        if not mine or not rate or band is None:
            return None
        share = ticket.cls.weight / max(band.weight(), ticket.cls.weight)
        return (mine + 1) / (rate * share)

    def waiting_by_band(self) -> dict[int, int]:
        """Requests waiting in each band the model has seen (a band is kept once made)."""
        return {b.priority: b.waiting() for b in self._bands.values()}

    def snapshot(self) -> dict[str, Any]:
        """The queue now, as the operator's view shows it: plain JSON values."""
        tenants: dict[uuid.UUID, dict[str, Any]] = {}

        def of(tenant: uuid.UUID) -> dict[str, Any]:
            row = tenants.get(tenant)
            if row is None:
                row = tenants[tenant] = {"tenant_id": str(tenant), "running": 0, "waiting": 0, "prompt_tokens": 0,
                                         "completion_tokens": 0, "queued_s": 0.0, "rejected": {}}
            return row

        for tenant, running in self._running.items():
            of(tenant)["running"] = len(running)
        for band in self._bands.values():
            for tenant, queue in band.queues.items():
                of(tenant)["waiting"] += len(queue)
        for tenant, (prompt, completion) in self.served_tokens.items():
            row = of(tenant)
            row["prompt_tokens"], row["completion_tokens"] = prompt, completion
        for tenant, secs in self.queued_s.items():
            of(tenant)["queued_s"] = round(secs, 3)
        now = self.clock()
        for tenant, cost in self._served.items():
            of(tenant)["served_cost"] = round(cost, 1)
        for tenant, at in self._seen.items():
            of(tenant)["seen_s_ago"] = round(now - at, 3)
        for (tenant, reason), n in self.shed.items():
            of(tenant)["rejected"][reason] = n
        backlog = {str(b.priority): b.weight() for b in self._bands.values() if b.queues}
        part = self.part_now()
        limit_now, shown = (self._part.peek(part), round(part, 2)) if isinstance(part, float) else (part, None)
        return {"model": self.model, "limit": self.capacity(), "limit_now": limit_now, "part": shown,
                "running": self.in_flight, "waiting": self.waiting,
                "bands": {str(b.priority): b.waiting() for b in self._bands.values()},
                "backlog_weight": backlog,
                "dispatch_per_s": self._dispatch_rate.value, "upstream_ttft_s": self.ttft_s,
                "tenants": sorted(tenants.values(), key=lambda r: r["tenant_id"])}

    def fairness(self) -> dict[int, float]:
        """Jain's index per band over the tenants backlogged since the last call, of their weighted service
        in that time (1: shares exactly by weight; 1/n: one tenant got everything); starts a new window."""
        bands: dict[int, list[float]] = {}
        for tenant, band in self._window_backlog.items():
            bands.setdefault(band, []).append(self._window_service.get(tenant, 0.0))
        self._window_backlog = {t: b.priority for b in self._bands.values() for t in b.queues}
        self._window_service = {}
        out = {}
        for band, xs in bands.items():
            if len(xs) >= 2 and any(xs):
                out[band] = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
        return out

    # -- inside ---------------------------------------------------------------------------------

    def _sparse(self, ticket: Ticket, limit: int) -> bool:
        """A tenant with nothing running or waiting on the model goes at once, with up to a burst of such
        requests in flight beside the limit's (FQ-CoDel's sparse flows, RFC 8290): a light tenant never waits
        behind a heavy one's backlog, nor for a limit that just shrank below the requests in flight, and a
        heavy tenant alone still uses the whole limit. Never ahead of a higher band that waits; only a light
        tenant (:meth:`_light`)."""
        if (not ticket.new_flow or ticket.cls.priority <= BATCH_BAND or not self._burst_room(limit)
                or self._held(ticket.cls.priority)):
            return False
        if any(b.queues and b.priority > ticket.cls.priority for b in self._bands.values()):
            return False
        return self._light(ticket, self._bands.get(ticket.cls.priority))

    def _light(self, ticket: Ticket, band: _Band | None) -> bool:
        """``ticket`` may use the burst: its tenant's recent service (:meth:`service`), with this request's
        prompt charged, stays below that of another tenant of its band that sent to the model within
        ``recent_s`` (or none did: lightness is a matter inside a band, bands go by priority), and its
        counter is not ahead of any tenant waiting in ``band`` (going now keeps the band's VTC order).

        Having nothing running or waiting is not enough: a heavy tenant that sends one long request at a
        time has nothing in flight between two of them, as a light one has, and its long streams on the
        burst would keep the light tenant's requests waiting for them (RFC 8290 moves a flow that empties
        onto the old list for the same reason). Light is judged on the recent service, not on the counter:
        a tenant's lift on joining the queue makes its counter equal to the heavy tenant's, and a counter
        holds all of its past."""
        tenant = ticket.tenant
        mine = self.counter(tenant)
        waiting = [self.counter(t) for t in band.queues if t != tenant] if band is not None else []
        if waiting and mine > min(waiting):
            return False
        since = self.clock() - self.settings.recent_s
        band_of, priority = self._band_of, ticket.cls.priority
        others = [t for t, at in self._seen.items() if at >= since and t != tenant and band_of.get(t) == priority]
        if not others:
            return True
        cost = ticket.prompt_tokens * self.settings.prompt_weight / ticket.cls.weight
        return self.service(tenant) + cost < max(self.service(t) for t in others)

    def service(self, tenant: uuid.UUID) -> float:
        """The weighted service the tenant was given here lately: what it was served, decayed with a time
        constant of ``recent_s`` (so a tenant's past does not make it heavy today), plus the live tokens of its
        running requests not yet charged. A steady rate R of weighted tokens per second reads about R x
        ``recent_s``."""
        value, at = self._recent.get(tenant, (0.0, 0.0))
        value *= math.exp((at - self.clock()) / self.settings.recent_s)
        for t in self._running.get(tenant, ()):
            value += max(t.live_tokens() - t.charged_decode, 0) * self.settings.decode_weight / t.cls.weight
        return value

    def _admit_to_queue(self, ticket: Ticket) -> None:
        cls = ticket.cls
        ahead = sum(b.waiting() for p, b in self._bands.items() if p >= cls.priority)
        if cls.sheddable and cls.ttft_ms is not None:
            predicted = self.predicted_ttft_s(ahead + 1)
            if predicted is not None and predicted * 1000 > cls.ttft_ms:
                self._rejected(ticket, "slo")
                raise FlowRejected(
                    f"The model `{self.model}` is overloaded: a request of class `{cls.name}` would wait past its "
                    f"TTFT target ({cls.ttft_ms} ms). Retry later.", reason="slo", retry_after_s=self.retry_after_s())
        ttl_s = self.ttl_s(cls)
        mine = self._waiting_of(ticket)
        if cls.max_waiting is not None and mine >= cls.max_waiting:
            self._rejected(ticket, "queue_full")
            raise FlowRejected(
                f"The model `{self.model}` is overloaded: {mine} of this tenant's requests are waiting, as many as "
                f"its class `{cls.name}` allows. Retry later.", reason="queue_full",
                retry_after_s=self.retry_after_s())
        wait = self.predicted_wait_s(ticket)
        if wait is not None and wait > ttl_s:
            self._rejected(ticket, "backlog")
            raise FlowRejected(
                f"The model `{self.model}` is overloaded: this tenant's requests already waiting would keep this one "
                f"waiting about {wait:.0f} s, past the queue's limit of {ttl_s:g} s. Retry later.",
                reason="backlog", retry_after_s=min(max(wait - ttl_s, 1.0), ttl_s))
        if self.waiting >= self.settings.queue_max:
            victim = self._place_for(ticket)
            if victim is None:
                self._rejected(ticket, "queue_full")
                raise FlowRejected(
                    f"The model `{self.model}` is overloaded: {self.waiting} requests are waiting. Retry later.",
                    reason="queue_full", retry_after_s=self.retry_after_s())
            self._remove(victim)
            self._rejected(victim, "queue_full")
            if victim._future is not None and not victim._future.done():
                victim._future.set_exception(FlowRejected(
                    f"The model `{self.model}` is overloaded: its queue is full, and this request gave its place to "
                    "a request of a higher priority or of a tenant with fewer requests waiting. Retry later.",
                    reason="queue_full", retry_after_s=self.retry_after_s()))
        band = self._bands.get(cls.priority)
        if band is None:
            band = self._bands[cls.priority] = _Band(cls.priority)
        queue = band.queues.get(ticket.tenant)
        if queue is None:
            # VTC's lift: a tenant joining the backlog starts at the smallest counter of those waiting
            others = [self.counter(t) for t in band.queues]
            floor = min(others) if others else band.last_counter
            self._counters[ticket.tenant] = max(self._counters.get(ticket.tenant, 0.0),
                                                floor - self._remote_served.get(ticket.tenant, 0.0))
            queue = band.queues[ticket.tenant] = deque()
            self._window_backlog[ticket.tenant] = band.priority
        queue.append(ticket)
        ticket.enqueued = self.clock()
        ticket.state = "waiting"
        self.waiting += 1

    def _batch_limit(self, limit: int) -> int:
        """:func:`batch_limit` of ``limit``, with interactive traffic if a request arrived within ``recent_s``."""
        return batch_limit(limit, interactive=self.clock() - self._interactive_at < self.settings.recent_s)

    def _held(self, priority: int) -> bool:
        """A higher band waits in another gateway process: this band waits too."""
        return self._remote_top is not None and self._remote_top > priority

    def _burst_room(self, limit: int) -> bool:
        """Room for one more sparse request beside the limit: a burst of ``sparse_burst`` of it, at least one."""
        burst = self.settings.sparse_burst
        return burst > 0 and self.sparse_in_flight < max(1, int(limit * burst))

    def _dispatch(self) -> None:
        while self.waiting:
            band = max((b for b in self._bands.values() if b.queues), key=lambda b: b.priority)
            if self._held(band.priority):
                return
            limit = self.limit_now(band.priority)
            if band.priority <= BATCH_BAND and limit is not None and self.in_flight >= self._batch_limit(limit):
                return  # batch lines never go beside the limit
            sparse = limit is not None and self.in_flight >= limit
            if not sparse:
                tenant = min(band.queues, key=self.counter)
            else:
                # full: only a light tenant with nothing running may go beside the limit now: one that found
                # the burst spent, or whose one request waiting came while its previous one still ran. A
                # backlogged tenant never does, even while none of its own runs: its weight decides its turn
                # (across processes, its part of the limits holds it back for a part of the time)
                idle = [t for t, q in band.queues.items()
                        if t not in self._running and (q[0].new_flow or len(q) == 1)]
                if not idle or limit is None or not self._burst_room(limit):
                    self._saturated()
                    return
                tenant = min(idle, key=self.counter)
                if not self._light(band.queues[tenant][0], band):
                    self._saturated()
                    return
            queue = band.queues[tenant]
            ticket = queue.popleft()
            if not queue:
                del band.queues[tenant]
            band.last_counter = self.counter(tenant)
            self.waiting -= 1
            self._start(ticket, waited_s=self.clock() - ticket.enqueued, sparse=sparse)
            if ticket._future is not None and not ticket._future.done():
                ticket._future.set_result(None)

    def _start(self, ticket: Ticket, *, waited_s: float, sparse: bool = False) -> None:
        self._part.tick(self.clock(), self.in_flight)
        ticket.state = "running"
        ticket.waited_s = waited_s
        ticket.sparse = sparse
        self.in_flight += 1
        self.sparse_in_flight += sparse
        running = self._running.setdefault(ticket.tenant, [])
        ticket.alone = not running
        running.append(ticket)
        self._serve(ticket.tenant, ticket.prompt_tokens * self.settings.prompt_weight / ticket.cls.weight)
        self.served_tokens.setdefault(ticket.tenant, [0, 0])[0] += ticket.prompt_tokens
        if waited_s:
            self.queued_s[ticket.tenant] = self.queued_s.get(ticket.tenant, 0.0) + waited_s
        self._dispatch_rate.event(self.clock())  # every start, queued or not: one event each

    def _charge_decode(self, ticket: Ticket, tokens: int) -> None:
        extra = max(tokens - ticket.charged_decode, 0)
        ticket.charged_decode += extra
        self._serve(ticket.tenant, extra * self.settings.decode_weight / ticket.cls.weight)
        self.served_tokens.setdefault(ticket.tenant, [0, 0])[1] += extra

    def _serve(self, tenant: uuid.UUID, cost: float) -> None:
        self._counters[tenant] = self._counters.get(tenant, 0.0) + cost
        self._served[tenant] = self._served.get(tenant, 0.0) + cost
        now = self.clock()
        value, at = self._recent.get(tenant, (0.0, now))
        self._recent[tenant] = (value * math.exp((at - now) / self.settings.recent_s) + cost, now)
        self._window_service[tenant] = self._window_service.get(tenant, 0.0) + cost

    def _place_for(self, ticket: Ticket) -> Ticket | None:
        """With the queue full, the waiting request an arrival takes the place of, or None (the arrival is
        turned away). The lowest band with requests waiting gives up one if it is below the arrival's; in the
        arrival's own band, the tenant with the most requests waiting gives one up while it has more than the
        arrival's tenant would then have (the longest queue drops first, as in fair queueing: a tenant that
        floods fills the queue with its own requests, and another tenant's arrival still finds a place).
        Either way the request given up is its tenant's newest."""
        lowest = min((b for b in self._bands.values() if b.queues), key=lambda b: b.priority)
        if lowest.priority > ticket.cls.priority:
            return None
        tenant, queue = max(lowest.queues.items(), key=lambda kv: (len(kv[1]), self.counter(kv[0])))
        if lowest.priority == ticket.cls.priority:
            mine = len(lowest.queues.get(ticket.tenant, ()))
            if tenant == ticket.tenant or len(queue) <= mine + 1:
                return None
        return queue[-1]

    def _remove(self, ticket: Ticket) -> None:
        if ticket.state != "waiting":
            return
        band = self._bands.get(ticket.cls.priority)
        queue = band.queues.get(ticket.tenant) if band is not None else None
        if band is None or queue is None:
            return
        try:
            queue.remove(ticket)
        except ValueError:
            return
        if not queue:
            del band.queues[ticket.tenant]
        self.waiting -= 1
        ticket.state = "rejected"
        self._dispatch()

    def _rejected(self, ticket: Ticket, reason: str) -> None:
        ticket.state = "rejected"
        key = (ticket.tenant, reason)
        self.shed[key] = self.shed.get(key, 0) + 1


class FlowController:
    """The process's queues, one per model, made on first use, each with its model's learned limit."""

    def __init__(self, capacities: Capacities, settings: FlowSettings | None = None) -> None:
        self.capacities = capacities
        self.settings = settings or FlowSettings()
        self.models: dict[str, ModelFlow] = {}

    def model(self, name: str) -> ModelFlow:
        flow = self.models.get(name)
        if flow is None:
            lim = self.capacities.model(name)
            flow = self.models[name] = ModelFlow(name, lim.limit, self.settings, saturated=lim.saturated)
            lim.contended = lambda: flow.contended(lim.settings.contended_s)
        return flow

    def view(self) -> list[dict[str, Any]]:
        """Every model's queue in this process, with its learned limit's evidence."""
        out = []
        for name, flow in sorted(self.models.items()):
            snap = flow.snapshot()
            lim = self.capacities.models.get(name)
            if lim is not None:
                snap["gradient"] = lim.gradient
                snap["engine_pressure"] = lim.engine_pressure
                snap["tpot_floor_s"] = lim.tpot.floor.value if lim.tpot.current is not None else None
                snap["tpot_s"] = lim.tpot.current
            out.append(snap)
        return out


class ViewPublisher:
    """Writes this process's :meth:`FlowController.view` to Redis every ``interval_s`` (expiring, so a
    stopped process drops out); a failed write is logged once and tried again at the next tick."""

    def __init__(self, redis: Any, flow: FlowController, *, interval_s: float = 1.0,
                 process: str | None = None) -> None:
        self.redis = redis
        self.flow = flow
        self.interval_s = interval_s
        self.process = process or f"{socket.gethostname()}:{os.getpid()}"
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="flow-view-publisher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def publish(self) -> None:
        """Writes this process's view, then reads the others' back into the queues (:meth:`merge_remote`)."""
        if not self.flow.models:
            return
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            indexed_set(pipe, FLOW_VIEW_INDEX, flow_view_key(self.process),
                        flow_view_message(self.process, self.flow.view()), FLOW_VIEW_TTL_S, now=now)
            pipe.zrangebyscore(FLOW_VIEW_INDEX, index_live_from(now), "+inf")
            keys = (await pipe.execute())[-1]
        mine = flow_view_key(self.process)
        others = [k for k in keys if (k.decode() if isinstance(k, bytes) else k) != mine]
        views = [parse_flow_view(raw) for raw in (await self.redis.mget(others) if others else [])]
        figures = remote_figures(v for view in views if view is not None for v in view[1])
        for name, flow in self.flow.models.items():
            flow.merge_remote(figures.get(name) or RemoteFigures())  # none: the others are gone or idle
        loads = await read_engine_loads(self.redis)
        for name in self.flow.models:
            lim = self.flow.capacities.models.get(name)
            if lim is not None:
                lim.engine_view(loads.get(name, ()))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.publish()
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the operators' view is stale, serving goes on
                if not self._failing:
                    log.warning("flow view not published (%s); retrying every %.0f s", type(exc).__name__,
                                self.interval_s)
                self._failing = True


async def read_engine_loads(redis: Any) -> dict[str, list[EngineLoad]]:
    """Model -> its engines' latest reports (``redis``: an asyncio client), found through their index; reports
    that expired, or do not parse, are left out."""
    keys = await redis.zrangebyscore(ENGINE_LOAD_INDEX, index_live_from(time.time()), "+inf")
    out: dict[str, list[EngineLoad]] = {}
    for raw in (await redis.mget(keys) if keys else []):
        load = parse_engine_load(raw)
        if load is not None:
            out.setdefault(load.model, []).append(load)
    return out


@dataclass(slots=True)
class RemoteFigures:
    """What the other gateway processes' views say of one model."""

    served: dict[uuid.UUID, float] = field(default_factory=dict)  #: tenant -> weighted service, summed
    seen_s_ago: dict[uuid.UUID, float] = field(default_factory=dict)  #: tenant -> its latest request, seconds ago
    waiting: dict[int, int] = field(default_factory=dict)  #: band -> requests waiting, summed
    limits: list[int] = field(default_factory=list)  #: each process's learned limit (those that have one)
    backlog: dict[int, float] = field(default_factory=dict)  #: band -> weights of the tenants waiting, summed


def remote_figures(views: Iterable[dict[str, Any]]) -> dict[str, RemoteFigures]:
    """Model -> what other processes' model views (:meth:`ModelFlow.snapshot`) say of it; rows that do not
    parse are left out."""
    out: dict[str, RemoteFigures] = {}
    for view in views:
        name = view.get("model")
        rows = view.get("tenants")
        if not isinstance(name, str) or not isinstance(rows, list):
            continue
        fig = out.setdefault(name, RemoteFigures())
        bands = view.get("bands")
        for band, n in (bands.items() if isinstance(bands, dict) else ()):
            with contextlib.suppress(TypeError, ValueError):
                fig.waiting[int(band)] = fig.waiting.get(int(band), 0) + int(n)
        limit = view.get("limit")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            fig.limits.append(limit)
        backlog = view.get("backlog_weight")
        for band, w in (backlog.items() if isinstance(backlog, dict) else ()):
            with contextlib.suppress(TypeError, ValueError):
                if float(w) > 0:
                    fig.backlog[int(band)] = fig.backlog.get(int(band), 0.0) + float(w)
        for row in rows:
            try:
                tenant = uuid.UUID(str(row["tenant_id"]))
            except (KeyError, TypeError, ValueError):
                continue
            cost, ago = row.get("served_cost"), row.get("seen_s_ago")
            if isinstance(cost, int | float):
                fig.served[tenant] = fig.served.get(tenant, 0.0) + float(cost)
            if isinstance(ago, int | float):
                fig.seen_s_ago[tenant] = min(fig.seen_s_ago.get(tenant, math.inf), float(ago))
    return out
