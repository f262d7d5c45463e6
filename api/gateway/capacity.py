"""How many requests a model's pools should hold at once, learned from what its requests measure.

The flow-control queue (:mod:`baton.api.gateway.flow`) dispatches while a model has room; this module
says how much room there is. A fixed number would be wrong on every other machine, model and prompt
mix, and the engines' own limits (``max_num_seqs``, KV blocks) are far above the point where latency
suffers: a vLLM engine admits a request into its running batch long after every step has become slow,
so "the engine still accepts" is not "the engine has room".

The limit is a **gradient concurrency limit**, the algorithm of Netflix's ``concurrency-limits``
(Gradient2; TCP Vegas is its ancestor): a pool whose latency is at its floor can take more, one whose
latency grew has too much in flight. What is measured is where the engines' work shows, per request
dispatched by this gateway:

- the **time per output token** (the decode pool's step time, shared by every sequence in its batch);
- the **time to first token after dispatch**, per prompt-length class (the prefill pool's queue and
  compute; a 4,000-token prompt is not compared with a 40-token one).

Each has a **floor**, the smallest value seen in the last two windows of ``window_s`` (so a floor from
another load pattern ages out), and a smoothed current value. The gradient is
``min(1, tolerance * (floor + slack) / current)`` of the worse of the two (each with its own tolerance:
``tolerance`` for the decode step, the looser ``ttft_tolerance`` for the first token). Over ``tolerance``
times the floor the limit shrinks at once in proportion (``limit * gradient``); at the floor it grows by
``growth * sqrt(limit)`` per update (grow slowly, shrink fast). Updates come once per ``update_every``
completed requests, and only while the limit was actually used (requests were waiting or the pool was
full), so an idle model keeps its limit instead of growing it without evidence.

**Two limits, one in force.** The *shared* limit heeds both latencies; a *lone* tenant's limit heeds only
the decode step's, so a tenant alone on a model keeps the pools' throughput (its prefills waiting for each
other cost it nothing it did not send itself). The shared limit is in force from the first request of a
second tenant (seen in this process or reported by another within ``contended_s``): it learns all along,
so the second tenant's first requests meet it at once, not the lone tenant's batch while a limit learned
alone shrinks only after their slow first tokens come back.

Staleness and absence: the view is as fresh as the last completed request (it is this gateway's own
measure, no scrape); before ``min_samples`` requests have completed on a model the limit is ``None``,
which the queue reads as "no view": requests go straight upstream, as with limits only. A model whose
engines are all gone fails its requests upstream (the recovery ladder's business), never here.

Several gateway processes each keep their own limit against the same engines. Their latencies are the
same signal, so each shrinks when the pools are over the tolerance and grows when under: the additive
increase, multiplicative decrease of Chiu and Jain (1989) that converges to equal shares of the
capacity without any exchange between the processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from baton.core.contracts import EngineLoad


@dataclass(frozen=True, slots=True)
class CapacitySettings:
    initial: int = 8  #: the limit a model starts with once it has a view
    min_limit: int = 1
    max_limit: int = 256
    tolerance: float = 1.3  #: time per output token over this multiple of its floor shrinks the limit
    #: ... and time to first token over this multiple of its floor, for the shared limit: a prefill waits for
    #: the others in flight, which costs a lone tenant nothing it did not send itself but another tenant its
    #: TTFT; the shared limit trades pool throughput for the other tenant's latency
    ttft_tolerance: float = 1.3
    #: Another tenant sent to the model this recently: the shared limit is in force (see :meth:`AdaptiveLimit.limit`)
    contended_s: float = 5.0
    window_s: float = 300.0  #: a floor is the smallest value of the last two such windows
    min_samples: int = 8  #: completed requests before the model has a view at all
    update_every: int = 4  #: completed requests between two updates of the limit
    #: At the floor the limit grows by this share of its square root per update. Updates come per completed
    #: requests, so short requests would otherwise let a limit leap (3 to 17 in two seconds was seen at a
    #: flood's onset, before the first long streams' latencies came back to shrink it): grow slowly, shrink
    #: at once (Gradient2 smooths its limit by 0.2 for the same reason).
    growth: float = 0.25
    smoothing: float = 0.3  #: weight of a new sample in the current (EWMA) latency
    #: Latency this close to its floor is at the floor whatever the ratio: a floor of a few milliseconds
    #: (a tiny model, a stub) would otherwise read the event loop's jitter as overload.
    slack_s: float = 0.005
    #: An engine report older than this (wall clock, the writer's) is not evidence: the engine stopped
    #: stepping (idle, or gone) since, or the clocks of two hosts disagree by that much.
    engine_fresh_s: float = 2.0
    #: A pool whose engines hold at least this many requests waiting (their mean over a report's time) runs
    #: fewer than it holds: the limit comes down to the share that runs.
    engine_queue: float = 1.0
    #: KV-cache usage from which an engine is about to preempt (vLLM recomputes a preempted request):
    #: the limit shrinks by ``engine_kv_backoff`` per report.
    engine_kv_high: float = 0.9
    engine_kv_backoff: float = 0.9


class _Floor:
    """The smallest value of the current and the previous window."""

    __slots__ = ("_cur", "_prev", "_t0", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._cur = math.inf
        self._prev = math.inf
        self._t0: float | None = None

    def add(self, value: float, now: float) -> None:
        if self._t0 is None:
            self._t0 = now
        elif now - self._t0 >= self.window_s:
            self._prev = self._cur if now - self._t0 < 2 * self.window_s else math.inf
            self._cur = math.inf
            self._t0 = now
        self._cur = min(self._cur, value)

    @property
    def value(self) -> float:
        return min(self._cur, self._prev)


class _Signal:
    """One latency: its floor and its smoothed current value."""

    __slots__ = ("current", "floor", "smoothing")

    def __init__(self, window_s: float, smoothing: float) -> None:
        self.floor = _Floor(window_s)
        self.current: float | None = None
        self.smoothing = smoothing

    def add(self, value: float, now: float) -> None:
        self.floor.add(value, now)
        self.current = value if self.current is None else self.current + self.smoothing * (value - self.current)

    def ratio(self, slack_s: float) -> float | None:
        """Current over floor plus ``slack_s`` (<= 1: at the floor), or None without a measure."""
        floor = self.floor.value
        if self.current is None or not math.isfinite(floor) or floor <= 0:
            return None
        return self.current / (floor + slack_s)


def _prompt_class(prompt_tokens: int) -> int:
    """Prompts within a factor of two of each other are compared (their prefill costs are alike)."""
    return max(prompt_tokens, 1).bit_length()


class AdaptiveLimit:
    """One model's limit in this process. :meth:`limit` is the queue's capacity function."""

    def __init__(self, settings: CapacitySettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = s = settings or CapacitySettings()
        self.clock = clock
        self.estimate = float(s.initial)  #: the shared limit: decode steps and first tokens within tolerance
        self.alone = float(s.initial)  #: a lone tenant's limit: decode steps only
        #: Whether another tenant uses the model now (the queue's :meth:`ModelFlow.contended`); set by the
        #: flow controller. Until then: always shared.
        self.contended: Callable[[], bool] = lambda: True
        self.samples = 0
        self._since_update = 0
        self._saturated = False  #: the shared limit held a request back since the last update
        self._saturated_alone = False  #: ... the lone tenant's limit did
        self.tpot = _Signal(s.window_s, s.smoothing)
        self._ttft: dict[int, _Signal] = {}
        self._last_ttft: _Signal | None = None  #: the prompt class of the latest request
        self.gradient = 1.0  #: the last update's gradient (1: at the floor), for the metrics
        #: Why the engines' latest fresh reports hold the limit back (None: they do not)
        self.engine_pressure: str | None = None
        self._engine_seen: dict[str, float] = {}  #: engine -> the time of its report already acted on

    def limit(self) -> int | None:
        """The limit in force: the shared one while another tenant uses the model (it takes effect with that
        tenant's first request), else the lone tenant's; None before ``min_samples`` completed requests."""
        if self.samples < self.settings.min_samples:
            return None
        return int(self.estimate if self.contended() else max(self.alone, self.estimate))

    def saturated(self) -> None:
        """The queue had to hold a request back (the limit in force is in use): the next update may grow it.
        Only the limit in force grows on that evidence: the other one's room was never tried (a lone
        tenant's limit that went on growing through a contended hour would let a flood into the engines
        the moment the second tenant left)."""
        if self.contended():
            self._saturated = True
        else:
            self._saturated_alone = True

    def observe(self, *, prompt_tokens: int, ttft_s: float | None, tpot_s: float | None) -> None:
        """One completed request's measures after dispatch (None where it had none: an error, one token)."""
        if ttft_s is None and tpot_s is None:
            return
        s, now = self.settings, self.clock()
        if tpot_s is not None and tpot_s > 0:
            self.tpot.add(tpot_s, now)
        if ttft_s is not None and ttft_s > 0:
            cls = _prompt_class(prompt_tokens)
            sig = self._ttft.get(cls)
            if sig is None:
                sig = self._ttft[cls] = _Signal(s.window_s, s.smoothing)
            sig.add(ttft_s, now)
            self._last_ttft = sig
        self.samples += 1
        self._since_update += 1
        if self._since_update >= s.update_every:
            self._since_update = 0
            self._update()

    def _update(self) -> None:
        s = self.settings
        # each latency over its own tolerance; for each limit the worse of those it heeds decides
        tpot = self.tpot.ratio(s.slack_s)
        ttft = self._last_ttft.ratio(s.slack_s) if self._last_ttft is not None else None
        tpot = None if tpot is None else tpot / s.tolerance
        ttft = None if ttft is None else ttft / s.ttft_tolerance
        worst = max((r for r in (tpot, ttft) if r is not None), default=None)
        if worst is None:
            return
        calm = self.engine_pressure is None  # else no evidence that more would do
        grow, grow_alone = self._saturated and calm, self._saturated_alone and calm
        self._saturated = self._saturated_alone = False
        self.gradient = min(1.0, 1.0 / max(worst, 1e-9))
        self.estimate = self._moved(self.estimate, self.gradient, grow)
        if tpot is not None:
            self.alone = self._moved(self.alone, min(1.0, 1.0 / max(tpot, 1e-9)), grow_alone)

    def _moved(self, limit: float, gradient: float, grow: bool) -> float:
        s = self.settings
        if gradient < 1.0:
            new = limit * gradient  # over the tolerance: shrink at once, in proportion
        elif grow:
            new = limit + s.growth * math.sqrt(limit)  # at the floor and in use: grow, a step at a time
        else:
            return limit
        return min(max(new, float(s.min_limit)), float(s.max_limit))


    def engine_view(self, loads: Iterable[EngineLoad], now: float | None = None) -> None:
        """The model's engines' latest reports (:class:`~baton.core.contracts.EngineLoad`, ``now``: wall clock).

        Each pool (prefill, decode, or aggregated engines) is judged on its own and the worse one decides.
        A pool whose engines hold requests waiting (``engine_queue`` or more, the mean over the report's
        time) runs fewer than it was sent: the limit comes down in proportion, to the share that runs
        (``running / (running + waiting)``). An engine whose KV cache is ``engine_kv_high`` full is about to
        preempt: the limit shrinks by ``engine_kv_backoff``. Either holds growth back until a report says
        otherwise. Each report moves the limit once, however often it is read; reports older than
        ``engine_fresh_s`` are no evidence, and without any the limit is the latencies' alone."""
        s = self.settings
        now = time.time() if now is None else now
        fresh = [x for x in loads if now - x.at <= s.engine_fresh_s]
        pools: dict[str, list[EngineLoad]] = {}
        for x in fresh:
            pools.setdefault(x.role, []).append(x)
        pressure, factor = None, 1.0  # the worst pool's, and the factor its new reports apply
        for role, xs in sorted(pools.items()):
            running, waiting = sum(x.running for x in xs), sum(x.waiting for x in xs)
            kv = max(x.kv_usage for x in xs)
            f, why = 1.0, None
            if waiting >= s.engine_queue:
                f = running / (running + waiting) if running > 0 else 0.5
                why = f"{role} engines queue {waiting:.1f} beside {running:.1f} running"
            if kv >= s.engine_kv_high and s.engine_kv_backoff < f:
                f, why = s.engine_kv_backoff, f"{role} engines' KV cache {kv:.0%} full"
            if why is None:
                continue
            pressure = pressure or why
            if any(self._engine_seen.get(x.engine) != x.at for x in xs) and f < factor:
                pressure, factor = why, f
        self._engine_seen = {x.engine: x.at for x in fresh}
        self.engine_pressure = pressure
        if factor < 1.0 and self.samples >= s.min_samples:
            self.estimate = max(float(s.min_limit), self.estimate * factor)
            self.alone = max(float(s.min_limit), self.alone * factor)


class Capacities:
    """Every model's limit in this process, made on first use."""

    def __init__(self, settings: CapacitySettings | None = None) -> None:
        self.settings = settings or CapacitySettings()
        self.models: dict[str, AdaptiveLimit] = {}

    def model(self, name: str) -> AdaptiveLimit:
        lim = self.models.get(name)
        if lim is None:
            lim = self.models[name] = AdaptiveLimit(self.settings)
        return lim

    def limit(self, name: str) -> int | None:
        lim = self.models.get(name)
        return None if lim is None else lim.limit()
