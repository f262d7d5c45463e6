"""Serving-benchmark statistics, with the definitions of ``vllm bench serve``.

Per request (client-side clock, :func:`time.perf_counter`):

- **TTFT**: from sending the request to receiving the first content token.
- **ITL**: the gaps between successive content chunks of one stream (every gap of every request is one
  sample; the percentiles are over all gaps of all requests).
- **TPOT**: ``(e2e latency - TTFT) / (output tokens - 1)``, per request with more than one output token.
- **E2EL**: from sending the request to the end of the stream.

Goodput: a request is *good* when it succeeded and meets every SLO given (``ttft``, ``tpot``, ``e2el``,
in milliseconds); requests with one output token count a TPOT of 0, as in vLLM. Failed requests are
never good, so they count as misses: ``goodput_fraction`` = good / all requests sent, ``goodput`` =
good / duration (requests per second).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestResult:
    """What the client saw of one request. Times are seconds."""

    success: bool
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0
    """Send time relative to the start of the run."""
    error: str = ""
    arm: str = ""

    @property
    def tpot(self) -> float:
        """Per-request time per output token after the first; 0 when there is at most one token."""
        if self.output_tokens > 1:
            return (self.latency - self.ttft) / (self.output_tokens - 1)
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default,
    which vLLM uses). NaN for an empty sequence."""
    if not 0 <= q <= 100:
        raise ValueError("percentile must be within 0..100")
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def describe(values: Sequence[float], percentiles: Iterable[float] = DEFAULT_PERCENTILES, *,
             scale: float = 1.0) -> dict[str, float]:
    """``{"mean", "median", "std", "p50", "p90", ...}`` of ``values`` multiplied by ``scale``."""
    xs = [v * scale for v in values]
    out: dict[str, float] = {"count": float(len(xs))}
    if xs:
        mean = sum(xs) / len(xs)
        out["mean"] = mean
        out["std"] = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
        out["min"] = min(xs)
        out["max"] = max(xs)
    else:
        out.update(mean=math.nan, std=math.nan, min=math.nan, max=math.nan)
    out["median"] = percentile(xs, 50.0)
    for p in percentiles:
        out[f"p{_pct_name(p)}"] = percentile(xs, p)
    return out


def _pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def parse_goodput(specs: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (also ``"ttft:200 tpot:50"``) -> ``{"ttft": 200.0, "tpot": 50.0}``
    (milliseconds)."""
    slo: dict[str, float] = {}
    for spec in specs or ():
        for part in spec.replace(",", " ").split():
            name, sep, value = part.partition(":")
            name = name.strip().lower()
            if not sep or name not in SLO_METRICS:
                raise ValueError(f"goodput SLO {part!r}: expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
            try:
                ms = float(value)
            except ValueError:
                raise ValueError(f"goodput SLO {part!r}: {value!r} is not a number of milliseconds") from None
            if ms <= 0 or not math.isfinite(ms):
                raise ValueError(f"goodput SLO {part!r}: the limit must be a positive number of milliseconds")
            slo[name] = ms
    return slo


def is_good(r: RequestResult, slo: Mapping[str, float]) -> bool:
    """Whether one request counts toward goodput: it succeeded and meets every SLO (ms)."""
    if not r.success:
        return False
    measured = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
    return all(measured[name] * 1000.0 <= limit for name, limit in slo.items())


def summarize(
    results: Sequence[RequestResult],
    duration: float,
    *,
    slo: Mapping[str, float] | None = None,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """The report of one run: counts, throughput, goodput and TTFT/TPOT/ITL/E2EL in milliseconds."""
    pcts = tuple(percentiles)
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    out: dict[str, Any] = {
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration > 0 else math.nan,
        "output_throughput": total_out / duration if duration > 0 else math.nan,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else math.nan,
        "ttft_ms": describe([r.ttft for r in ok], pcts, scale=1000.0),
        # vLLM's TPOT statistics use requests with more than one output token only.
        "tpot_ms": describe([r.tpot for r in ok if r.output_tokens > 1], pcts, scale=1000.0),
        "itl_ms": describe([g for r in ok for g in r.itl], pcts, scale=1000.0),
        "e2el_ms": describe([r.latency for r in ok], pcts, scale=1000.0),
    }
    errors: dict[str, int] = {}
    for r in results:
        if not r.success:
            key = (r.error or "error")[:120]
            errors[key] = errors.get(key, 0) + 1
    out["errors"] = errors
    if slo:
        good = sum(1 for r in results if is_good(r, slo))
        out["slo_ms"] = dict(slo)
        out["good_requests"] = good
        out["goodput"] = good / duration if duration > 0 else math.nan
        out["goodput_fraction"] = good / len(results) if results else math.nan
    return out


def poisson_arrivals(n: int, rate: float, seed: int, *, burstiness: float = 1.0) -> list[float]:
    """Send offsets (seconds from the start) of ``n`` requests arriving at ``rate`` per second.

    Gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate`` (shape 1 = Poisson
    process, as in vLLM). ``rate = inf`` sends everything at once. The same seed gives the same list.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if math.isinf(rate):
        return [0.0] * n
    import numpy as np

    rng = np.random.default_rng(seed)
    theta = 1.0 / (rate * burstiness)
    gaps = rng.gamma(shape=burstiness, scale=theta, size=n)
    offsets: list[float] = []
    t = 0.0
    for g in gaps:
        offsets.append(t)
        t += float(g)
    return offsets


def added_latency(base: Sequence[float], other: Sequence[float],
                  percentiles: Iterable[float] = (50.0, 99.0)) -> dict[str, float]:
    """What ``other`` adds over ``base`` at each percentile (same units), e.g. TTFT through a gateway
    minus TTFT straight to the engine."""
    return {f"p{_pct_name(p)}": percentile(list(other), p) - percentile(list(base), p) for p in percentiles}
