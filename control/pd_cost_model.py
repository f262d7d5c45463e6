"""The P/D planner's cost model (pure functions): "disaggregate this model, and at which ratio?".

Disaggregation pays off only when

    avoided P/D interference + independent scaling  >  KV transfer + extra queueing
                                                       + duplicated weights + pool imbalance,

and the figure that decides is goodput: requests per second per GPU (here: per engine replica) that
meet both the TTFT and the TPOT SLO. The model, per configuration:

* KV bytes of a prompt: ``2 x layers x kv_heads x head_dim x tokens x bytes`` (the seed's formula);
  the handoff takes at least ``bytes / bandwidth`` (:func:`transfer_lower_bound_s`), divided by a
  measured efficiency where one is known.
* Prefill: ``prompt / prefill_tokens_per_s`` of exclusive compute; prompts queue (M/G/1,
  Pollaczek-Khinchine mean wait, exponential tail for the percentile).
* Decode: one step takes ``step_ms + B x ms_per_seq`` for a batch of ``B``; Little's law gives ``B``
  from the arrival rate and the decode time, solved as a fixed point; ``B`` is capped by
  ``max_num_seqs`` and by the KV memory left after the weights.
* Aggregated: prefills stall decode steps on the same replica (interference): a request's TPOT gets the
  prefill time that arrives during its decode, a compound Poisson sum (mean + z x sd for the percentile).
* P/D ``p:d``: prefill replicas see no decode, decode replicas no prefill; TTFT adds the KV transfer and
  its queueing on the link; the prefill replicas' KV memory buys nothing for decode (duplicated
  weights), and the pool that is not the bottleneck idles (imbalance): both show as lower rate per GPU.

Goodput of a configuration is the largest arrival rate per GPU at which the percentile TTFT and TPOT
both meet the SLO (bisection). With an arrival rate, the planner also counts replicas needed (whole
units of ``p + d``), which is where a small load makes P/D's minimum footprint expensive.

:func:`calibrate` fits :class:`Hardware` and :class:`Traffic` to measured request records, and
:func:`render_plot` draws a :class:`Plan`. Nothing here reads the database or the settings:
:mod:`baton.control.planning` is the use case that does and serves plans to the admin API and the
console; ``baton plan`` and the P/D bench call these functions directly.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import io
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from baton.core import contracts

GB = 1e9
DEFAULT_RATIOS: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 3), (3, 2))


# --- the formulas -----------------------------------------------------------------------------------

def kv_bytes(*, num_layers: int, num_kv_heads: int, head_dim: int, dtype: str, tokens: int) -> int:
    """KV cache bytes of ``tokens`` tokens in ``dtype``: the seed's formula (:func:`baton.core.contracts.kv_bytes`)."""
    return contracts.kv_bytes(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                              bytes_per_element=contracts.dtype_bytes(dtype), tokens=tokens)


def transfer_lower_bound_s(nbytes: float, bandwidth_gbps: float) -> float:
    """T_transfer >= bytes / bandwidth (GB/s, 1e9 bytes per second)."""
    return nbytes / (bandwidth_gbps * GB)


# --- inputs -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    params_b: float | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                        dtype=self.dtype, tokens=1)

    @property
    def weight_bytes(self) -> float:
        return (self.params_b or 0.0) * 1e9 * contracts.dtype_bytes(self.dtype)


@dataclass(frozen=True)
class Hardware:
    """One replica's throughput and memory, and the KV link. Configured or :func:`calibrate`-d."""

    prefill_tokens_per_s: float = 20_000.0
    decode_step_ms: float = 5.0
    decode_ms_per_seq: float = 0.3
    max_num_seqs: int = 256
    memory_bytes: float | None = None
    link_bandwidth_gbps: float = 1.9
    transfer_efficiency: float = 1.0


@dataclass(frozen=True)
class Traffic:
    """Samples of prompt and output lengths, and the total arrival rate (req/s) if known."""

    prompt_tokens: Sequence[int]
    output_tokens: Sequence[int]
    arrival_rate: float | None = None

    @classmethod
    def lognormal(cls, *, prompt_mean: float, output_mean: float, cv: float = 0.5, n: int = 400,
                  seed: int = 0, arrival_rate: float | None = None) -> Traffic:
        rng = random.Random(seed)

        def draw(mean: float) -> list[int]:
            if cv <= 0:
                return [max(1, round(mean))] * n
            sigma = math.sqrt(math.log(1 + cv * cv))
            mu = math.log(mean) - sigma * sigma / 2
            return [max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(n)]

        return cls(prompt_tokens=draw(prompt_mean), output_tokens=draw(output_mean), arrival_rate=arrival_rate)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float
    percentile: float = 90.0


# --- outputs ----------------------------------------------------------------------------------------

@dataclass
class Point:
    """The model's prediction at one arrival rate per unit (``p + d`` replicas, or 1 aggregated)."""

    rate: float
    ttft_ms: float
    tpot_ms: float
    batch: float
    ok: bool
    bottleneck: str


@dataclass
class ConfigResult:
    name: str
    prefill: int
    decode: int
    goodput_per_gpu: float
    ttft_ms: float
    tpot_ms: float
    bottleneck: str
    gpus_needed: int | None = None
    curve: list[Point] = field(default_factory=list)
    #: Share of the traffic's requests that meet both targets with no queueing (the best case).
    slo_attainment: float = 0.0

    @property
    def gpus(self) -> int:
        return self.prefill + self.decode if self.prefill else self.decode


@dataclass(frozen=True)
class Remedy:
    """One way to meet an SLO that no configuration meets: ``changes`` (planner inputs, named as the
    plan request names them) that together are enough, checked by planning again with them."""

    changes: dict[str, float]
    text: str
    #: The configuration recommended once the changes are made, its goodput, replicas at the given rate.
    then: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    kv_bytes_per_token: int
    kv_bytes_per_request: float
    kv_bytes_p99: float
    transfer_lower_bound_ms: float
    transfer_expected_ms: float
    weight_bytes: float
    configs: list[ConfigResult]
    #: The recommended configuration's name; None when no configuration meets the SLO.
    recommended: str | None
    reason: str
    inputs: dict[str, Any]
    #: Whether any configuration meets the SLO at some load.
    feasible: bool = True
    #: When none does: the configuration that comes closest (highest attainment), and what would meet it.
    closest: str | None = None
    to_meet: list[Remedy] = field(default_factory=list)

    def config(self, name: str | None) -> ConfigResult | None:
        return next((c for c in self.configs if c.name == name), None) if name else None

    def as_dict(self, *, curves: bool = False) -> dict[str, Any]:
        out = asdict(self)
        for c, src in zip(out["configs"], self.configs, strict=True):
            c["gpus"] = src.gpus
            if not curves:
                c.pop("curve")
        by_name = {c["name"]: c for c in out["configs"]}
        out["recommendation"] = by_name.get(self.recommended) if self.recommended else None
        out["closest"] = by_name.get(self.closest) if self.closest else None
        return out


# --- the model --------------------------------------------------------------------------------------

class _Mix:
    def __init__(self, shape: ModelShape, hw: Hardware, traffic: Traffic, slo: Slo) -> None:
        if not traffic.prompt_tokens or not traffic.output_tokens:
            raise ValueError("traffic needs prompt and output length samples")
        self.shape, self.hw, self.slo = shape, hw, slo
        q = slo.percentile / 100.0
        self.q = min(max(q, 0.5), 0.999)
        self.z = statistics.NormalDist().inv_cdf(self.q)
        p = [t / hw.prefill_tokens_per_s for t in traffic.prompt_tokens]  # seconds of prefill
        self.p = p
        self.p_mean, self.p2 = statistics.fmean(p), statistics.fmean(x * x for x in p)
        self.p_q = _quantile(p, self.q)
        self.o_mean = statistics.fmean(traffic.output_tokens)
        bw = hw.link_bandwidth_gbps * GB * hw.transfer_efficiency
        x = [t * shape.kv_bytes_per_token / bw for t in traffic.prompt_tokens]
        self.x = x
        self.x_mean, self.x2, self.x_q = statistics.fmean(x), statistics.fmean(v * v for v in x), _quantile(x, self.q)
        ctx = statistics.fmean(a + b for a, b in zip(traffic.prompt_tokens, traffic.output_tokens, strict=False))
        per_seq_kv = ctx * shape.kv_bytes_per_token
        cap = hw.max_num_seqs
        if hw.memory_bytes:
            free = hw.memory_bytes - shape.weight_bytes
            cap = min(cap, int(free / per_seq_kv)) if free > 0 else 0
        self.batch_cap = cap

    def step(self, batch: float) -> float:
        return (self.hw.decode_step_ms + self.hw.decode_ms_per_seq * batch) / 1000.0

    def attainment(self, p: int) -> float:
        """Share of requests meeting both targets with no queueing (aggregated: ``p == 0``): TTFT is the
        request's own prefill (+ its KV transfer) + one decode step, TPOT one step of an empty batch (as
        :meth:`aggregated` and :meth:`pd` have them at no load)."""
        if self.batch_cap < 1:
            return 0.0
        step = self.step(0)
        if step * 1000 > self.slo.tpot_ms:
            return 0.0
        ttft_s = self.slo.ttft_ms / 1000
        if p:
            good = sum(1 for a, b in zip(self.p, self.x, strict=True) if a + b + step <= ttft_s)
        else:
            good = sum(1 for a in self.p if a + step <= ttft_s)
        return good / len(self.p)

    def saturation(self, p: int) -> float:
        """Rate per unit at which the prefill compute is fully busy (where the curves stop)."""
        return max(p, 1) / max(self.p_mean, 1e-12)

    def _wait_q(self, lam: float, s_mean: float, s2: float) -> float | None:
        """Percentile wait of an M/G/1 queue (None: overloaded)."""
        rho = lam * s_mean
        if rho >= 1.0:
            return None
        if rho <= 0:
            return 0.0
        w = lam * s2 / (2 * (1 - rho))
        return (w / rho) * math.log(rho / (1 - self.q)) if rho > 1 - self.q else 0.0

    def aggregated(self, lam: float) -> Point:
        rho_p = lam * self.p_mean
        wait = self._wait_q(lam, self.p_mean, self.p2)
        if wait is None:
            return Point(lam, math.inf, math.inf, math.inf, False, "prefill compute")
        tpot = self.step(1)
        batch = 0.0
        for _ in range(60):  # fixed point of B = lam * O * TPOT, TPOT = step(B) / (1 - rho_p)
            batch = lam * self.o_mean * tpot
            new = self.step(batch) / (1 - rho_p)
            if abs(new - tpot) < 1e-9:
                break
            tpot = new
        if not math.isfinite(tpot) or batch > self.batch_cap:
            return Point(lam, math.inf, math.inf, batch, False, "decode batch / KV memory")
        # Tail: prefill time arriving during this request's decode, spread over its tokens.
        life = self.o_mean * tpot
        stall_mean, stall_sd = lam * life * self.p_mean, math.sqrt(lam * life * self.p2)
        tpot_q = self.step(batch) + (stall_mean + self.z * stall_sd) / max(self.o_mean, 1.0)
        ttft_q = wait + self.p_q + self.step(batch)
        return self._point(lam, ttft_q, tpot_q, batch, interference=True)

    def pd(self, lam: float, p: int, d: int) -> Point:
        lam_p, lam_d = lam / p, lam / d
        wait_p = self._wait_q(lam_p, self.p_mean, self.p2)
        if wait_p is None:
            return Point(lam, math.inf, math.inf, math.inf, False, "prefill pool")
        wait_x = self._wait_q(lam_d, self.x_mean, self.x2)
        if wait_x is None:
            return Point(lam, math.inf, math.inf, math.inf, False, "KV link")
        denom = 1 - lam_d * self.o_mean * self.hw.decode_ms_per_seq / 1000.0
        if denom <= 0:
            return Point(lam, math.inf, math.inf, math.inf, False, "decode pool")
        batch = lam_d * self.o_mean * (self.hw.decode_step_ms / 1000.0) / denom
        if batch > self.batch_cap:
            return Point(lam, math.inf, math.inf, batch, False, "decode batch / KV memory")
        tpot_q = self.step(batch)
        ttft_q = wait_p + self.p_q + wait_x + self.x_q + self.step(batch)
        return self._point(lam, ttft_q, tpot_q, batch, interference=False)

    def _point(self, lam: float, ttft_s: float, tpot_s: float, batch: float, *, interference: bool) -> Point:
        ttft_ms, tpot_ms = ttft_s * 1000, tpot_s * 1000
        ok_t, ok_d = ttft_ms <= self.slo.ttft_ms, tpot_ms <= self.slo.tpot_ms
        if ok_t and ok_d:
            bottleneck = "none"
        elif not ok_d:
            bottleneck = "TPOT (prefill interference)" if interference else "TPOT (decode batch)"
        else:
            bottleneck = "TTFT"
        return Point(lam, ttft_ms, tpot_ms, batch, ok_t and ok_d, bottleneck)


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _max_rate(evaluate: Any, hi: float) -> float:
    """Largest rate at which ``evaluate(rate).ok``: bisection (the predicates are monotone in rate)."""
    if not evaluate(1e-9).ok:
        return 0.0
    lo = 1e-9
    while evaluate(hi).ok and hi < 1e9:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if evaluate(mid).ok:
            lo = mid
        else:
            hi = mid
    return lo


def plan(
    shape: ModelShape, hw: Hardware, traffic: Traffic, slo: Slo,
    *, ratios: Iterable[tuple[int, int]] = DEFAULT_RATIOS, curve_points: int = 24, remedies: bool = True,
) -> Plan:
    """Goodput per GPU of aggregated and each P:D ratio under the SLO, and the recommendation. When no
    configuration meets the SLO there is none: ``closest`` and ``to_meet`` say what comes nearest and
    what would meet it (``remedies=False`` leaves ``to_meet`` empty)."""
    ratios = list(ratios)
    mix = _Mix(shape, hw, traffic, slo)
    hi = 2.0 / max(mix.p_mean, 1e-9)
    results: list[ConfigResult] = []

    def finish(name: str, p: int, d: int, evaluate: Any) -> None:
        gpus = p + d if p else d
        best = _max_rate(evaluate, hi)
        at = evaluate(best) if best > 0 else evaluate(1e-9)
        # Past the goodput; when there is none, up to 90% of the prefill compute (a readable load range).
        top = max(best * 1.5, 1e-6) if best > 0 else 0.9 * mix.saturation(p)
        curve = [evaluate(top * (i + 1) / curve_points) for i in range(curve_points)]
        needed = None
        if traffic.arrival_rate and best > 0:
            needed = math.ceil(traffic.arrival_rate / best) * gpus
        results.append(ConfigResult(name, p, d, best / gpus, at.ttft_ms, at.tpot_ms,
                                    "none" if best > 0 else at.bottleneck, needed, curve))

    finish("aggregated", 0, 1, mix.aggregated)
    for p, d in ratios:
        finish(f"pd {p}:{d}", p, d, lambda lam, p=p, d=d: mix.pd(lam, p, d))

    # Where each config breaks just past its goodput: what limits it.
    for r in results:
        per_unit = r.goodput_per_gpu * r.gpus
        nxt = (mix.aggregated(per_unit * 1.05 + 1e-9) if r.prefill == 0
               else mix.pd(per_unit * 1.05 + 1e-9, r.prefill, r.decode))
        r.bottleneck = nxt.bottleneck

    for r in results:
        r.slo_attainment = mix.attainment(r.prefill)
    agg = results[0]
    mean_prompt = statistics.fmean(traffic.prompt_tokens)
    kv_req = mean_prompt * shape.kv_bytes_per_token
    kv_p99 = _quantile(traffic.prompt_tokens, 0.99) * shape.kv_bytes_per_token
    feasible = any(r.goodput_per_gpu > 0 for r in results)
    recommended: str | None
    closest: str | None = None
    to_meet: list[Remedy] = []
    if not feasible:
        near = max(results, key=lambda r: (r.slo_attainment, -r.ttft_ms, -r.gpus))
        recommended, closest = None, near.name
        to_meet = _remedies(shape, hw, traffic, slo, near, ratios=ratios) if remedies else []
        reason = (f"Nothing meets this SLO (TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms at p{slo.percentile:g}),"
                  f" even with no other traffic. The closest is {near.name}: p{slo.percentile:g} TTFT "
                  f"{near.ttft_ms:.4g} ms and TPOT {near.tpot_ms:.3g} ms at no load, "
                  f"{near.slo_attainment * 100:.0f}% of requests within both targets.")
    else:
        if traffic.arrival_rate:
            key = lambda r: (r.gpus_needed if r.gpus_needed is not None else math.inf, -r.goodput_per_gpu)  # noqa: E731
        else:
            key = lambda r: (-r.goodput_per_gpu, r.gpus)  # noqa: E731
        best = min(results, key=key)
        if best is agg or (best.goodput_per_gpu <= agg.goodput_per_gpu * 1.0001 and not traffic.arrival_rate):
            best = agg
            split = _best_pd(results)
            reason = (f"Stay aggregated: {agg.goodput_per_gpu:.3g} req/s per GPU within the SLO; the best split "
                      f"({split.name}) reaches {split.goodput_per_gpu:.3g}: the KV transfer "
                      f"({mix.x_mean * 1000:.3g} ms mean), queueing and the idle pool cost more than the "
                      "interference it avoids.")
        else:
            gain = (f"{(best.goodput_per_gpu / agg.goodput_per_gpu - 1) * 100:+.0f}%" if agg.goodput_per_gpu > 0
                    else "aggregated meets it at no load")
            reason = (f"Disaggregate as {best.name}: {best.goodput_per_gpu:.3g} req/s per GPU within the SLO vs "
                      f"{agg.goodput_per_gpu:.3g} aggregated ({gain}); aggregated is limited by "
                      f"{agg.bottleneck}, and the KV handoff costs {mix.x_mean * 1000:.3g} ms on average.")
            if traffic.arrival_rate:
                reason += (f" At {traffic.arrival_rate:g} req/s it needs {best.gpus_needed} replicas vs "
                           f"{agg.gpus_needed} aggregated.")
        recommended = best.name
    return Plan(
        kv_bytes_per_token=shape.kv_bytes_per_token,
        kv_bytes_per_request=kv_req,
        kv_bytes_p99=kv_p99,
        transfer_lower_bound_ms=transfer_lower_bound_s(kv_req, hw.link_bandwidth_gbps) * 1000,
        transfer_expected_ms=mix.x_mean * 1000,
        weight_bytes=shape.weight_bytes,
        configs=results,
        recommended=recommended,
        reason=reason,
        inputs={"shape": asdict(shape), "hardware": asdict(hw), "slo": asdict(slo),
                "traffic": {"prompt_mean": mean_prompt, "output_mean": mix.o_mean,
                            "samples": len(traffic.prompt_tokens), "arrival_rate": traffic.arrival_rate}},
        feasible=feasible,
        closest=closest,
        to_meet=to_meet,
    )


def _fmt_ms(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def _remedies(shape: ModelShape, hw: Hardware, traffic: Traffic, slo: Slo, near: ConfigResult, *,
              ratios: Iterable[tuple[int, int]]) -> list[Remedy]:
    """What would meet the SLO when nothing does, each checked by planning again with the change:
    looser targets that the closest configuration meets at no load, or a faster engine."""
    ratios = list(ratios)
    options: list[tuple[dict[str, float], str, Slo, Hardware]] = []
    ttft, tpot = slo.ttft_ms, slo.tpot_ms
    changes: dict[str, float] = {}
    words = []
    if near.ttft_ms > slo.ttft_ms:
        ttft = _round_up(near.ttft_ms * 1.2)
        changes["ttft_ms"] = ttft
        words.append(f"a TTFT target of {_fmt_ms(ttft)} or more")
    if near.tpot_ms > slo.tpot_ms:
        tpot = _round_up(near.tpot_ms * 1.2)
        changes["tpot_ms"] = tpot
        words.append(f"a TPOT target of {_fmt_ms(tpot)} or more")
    if changes:
        options.append((changes, " and ".join(words) + f" (p{slo.percentile:g})",
                        Slo(ttft, tpot, slo.percentile), hw))
    if near.ttft_ms > slo.ttft_ms and near.tpot_ms <= slo.tpot_ms:
        factor = near.ttft_ms / slo.ttft_ms * 1.2
        tps = _round_up(hw.prefill_tokens_per_s * factor)
        options.append(({"prefill_tokens_per_s": tps},
                         f"prefill about {factor:.2g}x faster ({tps:g} prompt tokens/s per replica: a faster "
                         "device, or shorter prompts)", slo, Hardware(**{**hw.__dict__, "prefill_tokens_per_s": tps})))
    out = []
    for ch, text, s2, hw2 in options:
        again = plan(shape, hw2, traffic, s2, ratios=ratios, curve_points=4, remedies=False) if _sane(s2) else None
        if again is not None and again.feasible and again.recommended:
            cfg = again.config(again.recommended)
            out.append(Remedy(changes=ch, text=text, then={
                "recommended": again.recommended,
                "goodput_per_gpu": cfg.goodput_per_gpu if cfg else 0.0,
            }))
    return out


def _sane(slo: Slo) -> bool:
    return 0 < slo.ttft_ms <= 3_600_000 and 0 < slo.tpot_ms <= 3_600_000


def _round_up(x: float) -> float:
    """Up to two significant digits (7,312 -> 7,400; 0.0312 -> 0.032)."""
    if x <= 0 or not math.isfinite(x):
        return x
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10**e) * 10**e if e < 0 else float(math.ceil(x / 10**e) * 10**e)


def _best_pd(results: list[ConfigResult]) -> ConfigResult:
    return max((r for r in results if r.prefill), key=lambda r: r.goodput_per_gpu)


# --- calibration from measured request records ------------------------------------------------------

#: A measured TPOT below this cannot be one decode step of a real engine (a 1-token answer's TPOT, or a
#: burst of tokens flushed together): such samples are left out of the calibration.
MIN_TPOT_MS = 0.5
#: Fewest trustworthy records the throughput figures are taken from (else: the settings' figures).
MIN_SAMPLES = 5


@dataclass(frozen=True)
class Calibration:
    """Throughput figures and the traffic mix read from measured requests, and what was left out."""

    hardware: Hardware
    traffic: Traffic
    #: Completed requests with a TTFT that were looked at.
    samples: int
    #: What was left out or kept from the settings, in words (shown next to the plan).
    notes: tuple[str, ...] = ()
    #: How many of them the throughput figures come from (0: the figures are ``base``'s).
    used: int = 0
    #: Left out, by cause: ``coalesced`` (TPOT under :data:`MIN_TPOT_MS`), ``loaded`` (other requests in
    #: flight), ``no_prefill`` (no prefill time left after the handoff).
    rejected: dict[str, int] = field(default_factory=dict)


def _span(r: dict[str, Any]) -> tuple[float, float] | None:
    """A record's ``[start, end)`` in seconds (``finished_at``, else ``started_at + e2e_ms``)."""
    start = r.get("started_at")
    if start is None:
        return None
    end = r.get("finished_at")
    if end is None and r.get("e2e_ms") is not None:
        end = start + dt.timedelta(milliseconds=float(r["e2e_ms"]))
    if end is None:
        return None
    s = start.timestamp()
    return s, max(end.timestamp(), s + 1e-6)


def _others_in_flight(spans: Sequence[tuple[float, float] | None]) -> list[int | None]:
    """For each span, how many of the other spans overlap it (None: the record has no times)."""
    known = [sp for sp in spans if sp is not None]
    starts, ends = sorted(s for s, _ in known), sorted(e for _, e in known)
    return [None if sp is None else bisect.bisect_left(starts, sp[1]) - bisect.bisect_right(ends, sp[0]) - 1
            for sp in spans]


def calibrate(records: Sequence[dict[str, Any]], base: Hardware) -> Calibration | None:
    """Throughput and traffic mix from completed request records (``prompt_tokens``,
    ``completion_tokens``, ``ttft_ms``, ``tpot_ms``, ``handoff_ms``, ``kv_bytes``, ``started_at``, and
    ``finished_at`` or ``e2e_ms`` to tell whether a request ran alone).

    Only records that can measure the engine's service time are used: not one that overlapped another
    request of the set (a loaded box measures queueing and interference, not prefill speed), nor one
    whose TPOT is under :data:`MIN_TPOT_MS` (its tokens arrived in one burst, so its first token's time
    is the whole answer's too). Records without times are taken as they are. With at least
    :data:`MIN_SAMPLES` such records, prefill throughput comes from the faster half of their TTFTs, the
    batch-1 decode step from the fast end of their TPOTs and the link efficiency from their handoffs;
    with fewer, the figures are ``base``'s (``used == 0``). The traffic mix and arrival rate come from
    every record (lengths and arrivals do not depend on load). None with fewer than :data:`MIN_SAMPLES`
    records at all."""
    done = [r for r in records if r.get("ttft_ms") and r.get("prompt_tokens")]
    if len(done) < MIN_SAMPLES:
        return None
    busy = _others_in_flight([_span(r) for r in done])
    rejected = {"coalesced": 0, "loaded": 0, "no_prefill": 0}
    used: list[dict[str, Any]] = []
    unknown = 0
    for r, others in zip(done, busy, strict=True):
        tpot = r.get("tpot_ms")
        if tpot is not None and (r.get("completion_tokens") or 0) >= 2 and tpot < MIN_TPOT_MS:
            rejected["coalesced"] += 1
        elif r["ttft_ms"] - (r.get("handoff_ms") or 0.0) <= 0:
            rejected["no_prefill"] += 1
        elif others:
            rejected["loaded"] += 1
        else:
            unknown += others is None
            used.append(r)
    notes: list[str] = []
    if rejected["loaded"]:
        notes.append(f"{rejected['loaded']} ran while other requests were in flight (a loaded box measures "
                     "queueing, not service time)")
    if rejected["coalesced"]:
        notes.append(f"{rejected['coalesced']} had a TPOT under {MIN_TPOT_MS:g} ms, which is no engine's decode "
                     "step (the tokens arrived in one burst)")
    if rejected["no_prefill"]:
        notes.append(f"{rejected['no_prefill']} had no prefill time left after the KV handoff")
    if unknown:
        notes.append(f"{unknown} without start and end times taken as measured alone")
    hw = base
    if len(used) >= MIN_SAMPLES:
        fast = sorted(used, key=lambda r: r["ttft_ms"])[: max(3, len(used) // 2)]
        prefill_s = sum(r["ttft_ms"] - (r.get("handoff_ms") or 0.0) for r in fast) / 1000
        tpots = sorted(r["tpot_ms"] for r in used if r.get("tpot_ms") and (r.get("completion_tokens") or 0) >= 2)
        step = tpots[len(tpots) // 10] if len(tpots) >= MIN_SAMPLES else base.decode_step_ms
        if len(tpots) < MIN_SAMPLES:
            notes.append("decode step from the settings (too few usable TPOT samples)")
        eff = base.transfer_efficiency
        rates = [r["kv_bytes"] / (r["handoff_ms"] / 1000) for r in used if r.get("kv_bytes") and r.get("handoff_ms")]
        if rates:
            eff = min(1.0, statistics.median(rates) / (base.link_bandwidth_gbps * GB))
        hw = dataclasses.replace(base, prefill_tokens_per_s=sum(r["prompt_tokens"] for r in fast) / prefill_s,
                                 decode_step_ms=step, transfer_efficiency=eff)
    else:
        notes.append(f"only {len(used)} of {len(done)} can measure the engine (at least {MIN_SAMPLES} needed): "
                     "throughput from the settings; measure a quiet period, one request at a time, to calibrate")
        used = []
    starts = sorted(r["started_at"] for r in done if r.get("started_at") is not None)
    rate = None
    if len(starts) >= 2:
        span = (starts[-1] - starts[0]).total_seconds()
        rate = (len(starts) - 1) / span if span > 0 else None
    traffic = Traffic(prompt_tokens=[int(r["prompt_tokens"]) for r in done],
                      output_tokens=[max(1, int(r.get("completion_tokens") or 1)) for r in done], arrival_rate=rate)
    return Calibration(hardware=hw, traffic=traffic, samples=len(done), notes=tuple(notes), used=len(used),
                       rejected={k: v for k, v in rejected.items() if v})


# --- the plot ---------------------------------------------------------------------------------------

PlotLayout = Literal["wide", "narrow"]


def render_plot(result: Plan, fmt: str = "png", layout: PlotLayout = "wide") -> bytes:
    """:func:`plot_figure`, as PNG or SVG."""
    buf = io.BytesIO()
    plot_figure(result, layout).savefig(buf, format=fmt)
    return buf.getvalue()


def plot_figure(result: Plan, layout: PlotLayout = "wide") -> Any:
    """A matplotlib ``Figure``: goodput per GPU by configuration, each bar labelled (recommended one
    highlighted; when nothing meets the SLO, each configuration's share of requests within it at no load,
    the closest highlighted), and TTFT/TPOT against load for aggregated and the recommended (or best)
    split, with the SLO lines. ``wide``: the two side by side; ``narrow`` (a phone): one above the other, at
    a size whose labels stay readable at a phone's width."""
    import matplotlib  # deferred: matplotlib (~0.5 s) only when a plot is drawn

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # deferred: after the backend is chosen

    if layout == "narrow":
        fig = Figure(figsize=(4.0, 7.6), dpi=110)
        ax1, ax2 = fig.subplots(2, 1)
    else:
        fig = Figure(figsize=(11, 4.2), dpi=110)
        ax1, ax2 = fig.subplots(1, 2)
    names = [c.name for c in result.configs]
    if result.feasible:
        vals = [c.goodput_per_gpu for c in result.configs]
        colors = ["tab:green" if n == result.recommended else "tab:gray" for n in names]
        ax1.set_ylabel("goodput (req/s per GPU within SLO)")
        ax1.set_title(f"recommended: {result.recommended}")
        labels = [f"{v:.3g}" for v in vals]
    else:
        vals = [c.slo_attainment * 100 for c in result.configs]
        colors = ["tab:orange" if n == result.closest else "tab:gray" for n in names]
        ax1.set_ylabel("% of requests within the SLO at no load")
        ax1.set_title(f"nothing meets the SLO; closest: {result.closest}")
        labels = [f"{v:.0f}%" for v in vals]
    bars = ax1.bar(names, vals, color=colors)
    ax1.bar_label(bars, labels=labels, fontsize=8, padding=2)
    top = max(vals, default=0.0)
    ax1.set_ylim(0, top * 1.18 if top > 0 else (100 if not result.feasible else 1))
    ax1.tick_params(axis="x", rotation=45)
    slo = result.inputs["slo"]
    agg = result.configs[0]
    other = next((c for c in result.configs if c.name in (result.recommended, result.closest) and c.prefill), None)
    other = other or _best_pd(result.configs)
    for cfg, style in ((agg, "-"), (other, "--")):
        xs = [pt.rate / cfg.gpus for pt in cfg.curve if math.isfinite(pt.ttft_ms)]
        ax2.plot(xs, [pt.ttft_ms for pt in cfg.curve if math.isfinite(pt.ttft_ms)], style, color="tab:blue",
                 label=f"TTFT p{slo['percentile']:g} {cfg.name}")
        ax2.plot(xs, [pt.tpot_ms for pt in cfg.curve if math.isfinite(pt.ttft_ms)], style, color="tab:orange",
                 label=f"TPOT p{slo['percentile']:g} {cfg.name}")
    ax2.axhline(slo["ttft_ms"], color="tab:blue", linewidth=0.8, alpha=0.5)
    ax2.axhline(slo["tpot_ms"], color="tab:orange", linewidth=0.8, alpha=0.5)
    ax2.set_yscale("log")
    ax2.set_xlabel("arrival rate per GPU (req/s)")
    ax2.set_ylabel("ms")
    ax2.legend(fontsize=7)
    fig.suptitle(f"KV {result.kv_bytes_per_request / 2**20:.3g} MiB/request, transfer >= "
                 f"{result.transfer_lower_bound_ms:.3g} ms", fontsize=9)
    fig.tight_layout()
    return fig
