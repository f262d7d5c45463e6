"""``baton bench fairness``: the gateway's flow control measured from outside, as tenants see it.

Against a running Baton (``scripts/up``), through its public surfaces only: the admin API makes the
benchmark's own tenants (the model granted, rate limits far above what is sent, so that only flow
control pushes back), one SLO policy per tenant and its assignment, and an API key each; the tenants'
OpenAI endpoint carries the load. Every request is a streamed chat completion timed at the client
(:func:`time.perf_counter`): TTFT is from sending to the first SSE chunk that carries content text.

Phases, each ``duration_s`` long, ``gap_s`` apart (the queue drains in between):

- ``b_alone``: tenant B (light) sends a short request (~20 words, ``max_tokens`` 16) every
  ``b_interval_s``, open loop: the next one leaves on schedule whether the last has ended or not.
- ``a_flood_b``: tenant A keeps ``a_concurrency`` long streams in flight (~300 words, each prompt its own
  text so that no prefix cache hides its prefill, ``max_tokens`` 128), closed loop, and as a flooder it
  ignores ``Retry-After`` (a refused worker sends again after ``a_retry_pause_s``); or, with ``a_rate``,
  sends such a request every ``1 / a_rate`` s, open loop, whatever the earlier ones got. A starts
  ``lead_s`` before B's window so that every B request meets a full queue. B runs as in ``b_alone``, in the same
  band (both policies priority ``ab_priority``, 50 as for a tenant without a policy).
- ``bands``: one tenant per :class:`BandSpec` (default priority 90 with 1 stream, 50 with 4 and 10 with
  12, the last ``sheddable``), each with its medium streams in flight (``band_concurrency`` for a band
  that names none), closed loop, waiting out ``Retry-After`` after a 429 as a well-behaved client does.
- ``share``: two tenants in one band (priority ``ab_priority``), ``w2`` and ``w1``, their policies' weights
  2 and 1 (:data:`SHARE_WEIGHTS`), each with ``share_concurrency`` streams of the same length in flight
  (closed loop, ``Retry-After`` honoured), so that both always have requests waiting in the gateway's
  queue: inside a band the gateway shares tokens by weight. (Both tenants' streams together must pass the
  model's concurrency limit, or nothing waits and the shares follow the streams, not the weights.)

Figures per tenant and phase: requests sent, outcomes (200, 429, 503, other 5xx, other 4xx, client
timeouts, connection errors, streams that broke after their 200), whether every 429 carried
``Retry-After``, TTFT (mean, p50, p90, p99 of the completed requests), completion tokens received and
tokens per second (all tokens received / the tenant's time from its first send to its last end), prompt
tokens (from the usage report in a stream's last chunk) and the tokens as the gateway's fair share counts
them (``weighted_tokens``: prompt tokens + 2 x completion tokens, VTC's costs, not divided by the weight).

Derived, with targets: ``b_ttft_p99_ratio`` = B's TTFT p99 beside A / B's TTFT p99 alone (<= 1.5);
``a_never_5xx_or_timeout`` (A is refused with 429 only, never a 5xx or a client timeout); every 429
with ``Retry-After``; SLO attainment per band = share of the band's completed requests whose TTFT is
within its policy's ``ttft_ms`` (top band >= 0.99); ``share_ratio`` = ``w2``'s weighted tokens /
``w1``'s, within 10% of the weights' ratio 2 (``share_within_10pct_of_weights``: ``|ratio / 2 - 1| <=
0.10``). Descriptive: each band's share of the tokens, and Jain's fairness index over the tenants'
tokens per second divided by their policy weights (1 = equal shares; in ``bands`` the priorities make
shares unequal by design, in ``a_flood_b`` B asks for less than its share).

Each tenant's load runs in a process of its own (``processes``), so one tenant's client (A's many
streams) never delays the event loop that times another's (B's) first token. Everything the run made is
deleted at the end (assignments, policies, keys revoked, tenants with their grants and limits), and
leftovers of an interrupted run (names starting ``bench-fairness-``) are deleted before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import math
import multiprocessing as mp
import queue as queue_mod
import random
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from baton.bench import report, stats
from baton.bench.datasets import WORDS

TARGET_B_TTFT_P99_RATIO = 1.5
TARGET_TOP_BAND_ATTAINMENT = 0.99
#: The share phase's largest error against the weights: ``|measured ratio / weight ratio - 1|``.
TARGET_SHARE_ERROR = 0.10
PHASES = ("b_alone", "a_flood_b", "bands", "share")
#: The tenants of the ``share`` phase and their policies' weights (the first's share over the second's is
#: judged against their ratio).
SHARE_WEIGHTS: Mapping[str, float] = {"w2": 2.0, "w1": 1.0}
#: With a second gateway: the light tenant, the share's weight-1 tenant and the top band send there, the
#: rest to the first (each gateway then sees only some of the tenants of a phase).
SECOND_GATEWAY_ROLES = frozenset({"b", "w1", "high"})
#: What a generated token costs in the gateway's fair-share counter, a prompt token costing 1 (VTC's w_q).
DECODE_COST = 2
#: Names of everything the benchmark makes start with this (a rerun deletes what an interrupted run left).
NAME_PREFIX = "bench-fairness"
#: Rate limits far above what the benchmark sends: only flow control may push back.
GENEROUS_LIMITS = {"requests_per_minute": 1_000_000, "tokens_per_minute": 2_000_000_000, "max_concurrency": 100_000}
#: Outcome kinds, in the order they are reported.
KINDS = ("200", "429", "503", "5xx", "4xx", "timeout", "connection_error", "stream_error")

ProgressFactory = Callable[[str, int], Callable[[Any], None]]


@dataclass(frozen=True)
class BandSpec:
    """One tenant of the ``bands`` phase and its SLO policy."""

    name: str
    priority: int
    ttft_ms: int
    sheddable: bool = False
    weight: float = 1.0
    """The policy's share weight inside its band (sent to the admin API only when not 1)."""
    streams: int | None = None
    """Its streams in flight; None: ``band_concurrency``."""


#: An interactive top band well under the pools' capacity (one stream), a middle band about at it and a
#: sheddable bottom band past it: the overload is the bottom band's to absorb.
DEFAULT_BANDS: tuple[BandSpec, ...] = (
    BandSpec("high", 90, 500, streams=1),
    BandSpec("mid", 50, 1000, streams=4),
    BandSpec("low", 10, 1000, sheddable=True, streams=12),
)


@dataclass
class FairnessConfig:
    base_url: str = "http://127.0.0.1:8000"
    """The gateway: ``/v1`` for the tenants, ``/admin/v1`` for the setup."""
    second_url: str = ""
    """Another gateway of the same stack (its own process): the tenants of :data:`SECOND_GATEWAY_ROLES`
    send there, the others to ``base_url``, so that each gateway sees only some of the tenants and the
    fairness has to come from what the gateways share. Empty: every tenant on ``base_url``."""
    admin_token: str = field(default="", repr=False)
    """Bearer token of the admin API (never written to the result)."""
    model: str = "tiny-llama"
    duration_s: float = 60.0
    """Length of each phase (of B's window in ``a_flood_b``)."""
    phases: tuple[str, ...] = PHASES
    b_interval_s: float = 0.5
    b_prompt_words: int = 20
    b_max_tokens: int = 16
    a_concurrency: int = 16
    a_rate: float | None = None
    """A's offer as an open loop instead: a request every ``1 / a_rate`` s, on schedule whatever the
    earlier ones got (an offer past what the pools serve, which no closed loop can make: its streams
    wait for their answers). None: ``a_concurrency`` streams, closed loop."""
    a_prompt_words: int = 300
    a_max_tokens: int = 128
    a_retry_pause_s: float = 0.05
    """A ignores ``Retry-After``; it only waits this long after a refusal so that its own client loop is
    not what gets measured."""
    lead_s: float = 5.0
    """A floods this long before B's window of ``a_flood_b`` opens."""
    ab_priority: int = 50
    ab_ttft_ms: int = 1000
    bands: tuple[BandSpec, ...] = DEFAULT_BANDS
    band_concurrency: int | None = None
    """Streams in flight per band tenant; None: ``a_concurrency // 2``."""
    band_prompt_words: int = 120
    band_max_tokens: int = 64
    share_concurrency: int | None = None
    """Streams in flight per tenant of the ``share`` phase; None: ``a_concurrency // 2``."""
    share_prompt_words: int = 120
    share_max_tokens: int = 64
    tpot_ms: int = 1000
    """The policies' TPOT target (the admin API needs one; not measured here)."""
    request_timeout_s: float = 120.0
    warmup_requests: int = 4
    """Sequential short requests per tenant before the first phase (keys, grants and policies seen by
    the gateway; latency samples for its capacity limit)."""
    settle_s: float = 2.0
    gap_s: float = 3.0
    processes: bool = True
    """Each tenant's load from its own process; False: all on one event loop."""
    kill_decode_at_s: float | None = None
    """Seconds into ``a_flood_b`` at which a decode replica of ``kill_app`` is SIGKILLed (on this machine,
    found by its process title), the overload's recovery seen from outside; None: no fault."""
    kill_app: str = "tiny-llama-pd"
    """The Serve application (the deployment's name) whose decode replica is killed."""
    seed: int = 0

    def band_streams(self) -> int:
        return self.band_concurrency if self.band_concurrency is not None else max(1, self.a_concurrency // 2)

    def share_streams(self) -> int:
        return self.share_concurrency if self.share_concurrency is not None else max(1, self.a_concurrency // 2)


def config_dict(cfg: FairnessConfig) -> dict[str, Any]:
    """The config as written to the result: no admin token."""
    out = asdict(cfg)
    out.pop("admin_token", None)
    out["band_concurrency"] = cfg.band_streams()
    out["share_concurrency"] = cfg.share_streams()
    return out


def admin_token_from_env_file(path: Path) -> str | None:
    """``BATON_SECURITY__ADMIN_TOKEN`` from a ``var/baton.env``-style file (None if absent)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "BATON_SECURITY__ADMIN_TOKEN":
            return value.strip().strip("'\"") or None
    return None


# --- statistics -------------------------------------------------------------------------------------

def jain_index(values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """Jain's fairness index of ``values / weights``: ``(sum x)^2 / (n * sum x^2)``, 1 when every share is
    equal (to its weight), ``1/n`` when one tenant has everything. NaN for no tenants or nothing served."""
    ws = list(weights) if weights is not None else [1.0] * len(values)
    if len(ws) != len(values):
        raise ValueError("one weight per value")
    if any(w <= 0 for w in ws):
        raise ValueError("weights must be > 0")
    xs = [v / w for v, w in zip(values, ws, strict=True)]
    square_sum = sum(x * x for x in xs)
    if not xs or square_sum == 0:
        return math.nan
    return sum(xs) ** 2 / (len(xs) * square_sum)


def attainment(ttfts_s: Iterable[float], ttft_ms: float) -> float:
    """Share of the TTFTs (seconds) within ``ttft_ms``; NaN for none."""
    xs = list(ttfts_s)
    if not xs:
        return math.nan
    return sum(1 for t in xs if t * 1000.0 <= ttft_ms) / len(xs)


def token_shares(tokens: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's share of all the tokens (NaN each when there were none)."""
    total = sum(tokens.values())
    return {k: (v / total if total > 0 else math.nan) for k, v in tokens.items()}


def weighted_tokens(prompt_tokens: float, completion_tokens: float) -> float:
    """Tokens as the gateway's fair share counts a tenant's service (before its weight divides them):
    prompt tokens + :data:`DECODE_COST` x completion tokens."""
    return prompt_tokens + DECODE_COST * completion_tokens


def share_error(ratio: float | None, weight_ratio: float) -> float | None:
    """``|ratio / weight_ratio - 1|``: how far a measured share ratio is from the weights' (None without one)."""
    if ratio is None or not math.isfinite(ratio) or weight_ratio <= 0:
        return None
    return abs(ratio / weight_ratio - 1.0)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b <= 0:
        return None
    return a / b


# --- one streamed request -----------------------------------------------------------------------------

class SseParser:
    """Server-sent events from the lines of a ``text/event-stream`` (line ends stripped or not): one
    ``(event, data)`` per block ended by a blank line, ``event`` ``"message"`` unless the block names one,
    ``data`` its ``data:`` lines joined by newlines; comments (``:``) are skipped."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> list[tuple[str, str]]:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return []
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return []

    def close(self) -> list[tuple[str, str]]:
        """The last block, if the stream ended without its blank line."""
        return self._dispatch()

    def _dispatch(self) -> list[tuple[str, str]]:
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        return [(event, "\n".join(data))] if data else []


def chunk_text(data: Mapping[str, Any]) -> str:
    """The content text of one chat (``delta.content``) or completions (``text``) chunk."""
    parts: list[str] = []
    for choice in data.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            parts.append(str(delta.get("content") or ""))
        parts.append(str(choice.get("text") or ""))
    return "".join(parts)


@dataclass
class StreamReading:
    """What a client read from one 200 stream, event by event (:meth:`on_event`)."""

    first_content_at: float | None = None
    content_chunks: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    """The usage report's ``prompt_tokens`` (None: no report read)."""
    finished: bool = False
    done: bool = False
    error: str = ""

    def on_event(self, event: str, data: str, now: float) -> bool:
        """Takes one SSE event read at ``now``; True when the stream is over (``[DONE]`` or an error)."""
        if data.strip() == "[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(data)
        except ValueError:
            self.error = "malformed SSE data"
            return True
        if not isinstance(obj, dict):
            self.error = "malformed SSE data"
            return True
        if event == "error" or ("error" in obj and not obj.get("choices")):
            err = obj.get("error", obj)
            self.error = "stream error: " + str(err.get("message") if isinstance(err, dict) else err)[:160]
            return True
        if chunk_text(obj):
            if self.first_content_at is None:
                self.first_content_at = now
            self.content_chunks += 1
        if any(isinstance(c, Mapping) and c.get("finish_reason") for c in obj.get("choices") or ()):
            self.finished = True
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
            prompt = usage.get("prompt_tokens")
            self.prompt_tokens = prompt if isinstance(prompt, int) else 0
        return False

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.content_chunks

    @property
    def complete(self) -> bool:
        return not self.error and (self.done or self.finished) and self.first_content_at is not None


@dataclass
class Outcome:
    """One request as its client saw it. Times in seconds; ``start_s`` from the phase's start."""

    kind: str
    """One of :data:`KINDS`."""
    status: int = 0
    start_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float = 0.0
    completion_tokens: int = 0
    retry_after: str | None = None
    error: str = ""
    prompt_tokens: int = 0
    """From the stream's usage report (0 without one)."""
    usage: bool = False
    """Whether the stream carried a usage report (else ``completion_tokens`` counts content chunks)."""


def kind_of(status: int) -> str:
    """The outcome kind of a refused request's HTTP status."""
    if status in (429, 503):
        return str(status)
    if status >= 500:
        return "5xx"
    return "4xx"


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A streamed chat request that generates exactly ``max_tokens`` (``ignore_eos``: the load is what the
    phase says, and no answer ends empty on an end-of-text first token)."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0, "ignore_eos": True}


def make_prompt(rng: random.Random, words: int, tag: str) -> str:
    """``words`` random words behind a tag unique to the request (it comes first, so that no two
    prompts share a cached prefix beyond the chat template's)."""
    return f"[{tag}] " + " ".join(rng.choice(WORDS) for _ in range(max(0, words - 1)))


async def send_chat(client: Any, url: str, api_key: str, body: dict[str, Any], *, timeout_s: float,
                    t0: float = 0.0) -> Outcome:
    """Sends one streamed chat completion over ``client`` (an ``httpx.AsyncClient``) and times it. Never
    raises: a failure comes back as its :class:`Outcome`. ``t0``: the phase's start (perf_counter)."""
    import httpx

    st = time.perf_counter()
    out = Outcome(kind="connection_error", start_s=st - t0 if t0 else 0.0)
    reading = StreamReading()
    headers = {"Authorization": f"Bearer {api_key}", "Accept": "text/event-stream"}
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body, headers=headers) as resp:
                out.status = resp.status_code
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    out.kind = kind_of(resp.status_code)
                    out.retry_after = resp.headers.get("retry-after")
                    out.error = f"HTTP {resp.status_code}: {_error_message(text)}"
                    out.latency_s = time.perf_counter() - st
                    return out
                parser = SseParser()
                over = False
                # Read to the body's end even past [DONE]: a connection closed mid-body is a client that
                # went away (to the gateway) and one more connection to open (to this client).
                async for line in resp.aiter_lines():
                    for event, data in parser.feed(line):
                        over = over or reading.on_event(event, data, time.perf_counter())
                for event, data in parser.close():
                    over = over or reading.on_event(event, data, time.perf_counter())
    except TimeoutError:
        out.kind, out.error = "timeout", f"no end within {timeout_s:g} s"
    except httpx.TimeoutException as exc:
        out.kind, out.error = "timeout", type(exc).__name__
    except (httpx.HTTPError, OSError) as exc:
        out.kind, out.error = "connection_error", type(exc).__name__
    else:
        if reading.complete:
            out.kind = "200"
        else:
            out.kind = "stream_error"
            out.error = reading.error or ("no content" if reading.first_content_at is None else "stream ended early")
    out.latency_s = time.perf_counter() - st
    out.completion_tokens = reading.tokens
    out.usage = reading.usage_tokens is not None
    out.prompt_tokens = reading.prompt_tokens or 0
    if reading.first_content_at is not None:
        out.ttft_s = reading.first_content_at - st
    return out


def _error_message(text: str) -> str:
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:160]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:160]
    return str(err)[:160]


# --- one tenant's load ----------------------------------------------------------------------------------

@dataclass
class Driver:
    """One tenant's load in one phase: open loop (a request every ``interval_s``) or closed loop
    (``concurrency`` requests in flight), from ``offset_s`` after the phase starts, for ``window_s``."""

    tenant: str
    phase: str
    api_key: str = field(repr=False)
    url: str
    model: str
    prompt_words: int
    max_tokens: int
    window_s: float
    offset_s: float = 0.0
    interval_s: float | None = None
    concurrency: int = 1
    honour_retry_after: bool = True
    retry_pause_s: float = 0.05
    timeout_s: float = 120.0
    seed: int = 0


async def drive(d: Driver, start_at: float, *, transport: Any = None) -> dict[str, Any]:
    """Runs one :class:`Driver` from the wall-clock time ``start_at`` (+ its offset); returns its outcomes
    and ``elapsed_s`` (from its first send to its last request's end)."""
    import httpx

    rng = random.Random(f"{d.seed}-{d.phase}-{d.tenant}")
    run_tag = uuid.uuid4().hex[:8]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(8, 2 * d.concurrency))
    outcomes: list[Outcome] = []
    counter = 0

    def next_body() -> dict[str, Any]:
        nonlocal counter
        counter += 1
        prompt = make_prompt(rng, d.prompt_words, f"{d.tenant}-{run_tag}-{counter}")
        return chat_body(d.model, prompt, d.max_tokens)

    async with httpx.AsyncClient(timeout=httpx.Timeout(d.timeout_s, connect=10.0), limits=limits,
                                 transport=transport) as client:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()  # the phase's start, on this process's clock
        await asyncio.sleep(d.offset_s)
        first = time.perf_counter()
        end = first + d.window_s

        async def one() -> Outcome:
            o = await send_chat(client, d.url, d.api_key, next_body(), timeout_s=d.timeout_s, t0=t0)
            outcomes.append(o)
            return o

        if d.interval_s is not None:
            tasks: list[asyncio.Task[Outcome]] = []
            k = 0
            while (due := first + k * d.interval_s) < end:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks.append(asyncio.create_task(one()))
                k += 1
            await asyncio.gather(*tasks)
        else:
            async def worker() -> None:
                while time.perf_counter() < end:
                    o = await one()
                    await asyncio.sleep(0)  # an instant answer must not keep the other tenants' loops waiting
                    if o.kind == "200":
                        continue
                    pause = d.retry_pause_s
                    if d.honour_retry_after and o.retry_after:
                        with contextlib.suppress(ValueError):
                            pause = max(pause, float(o.retry_after))
                    await asyncio.sleep(max(0.0, min(pause, end - time.perf_counter())))

            await asyncio.gather(*(worker() for _ in range(max(1, d.concurrency))))
        elapsed = time.perf_counter() - first
    outcomes.sort(key=lambda o: o.start_s)
    return {"tenant": d.tenant, "phase": d.phase, "elapsed_s": elapsed, "outcomes": [asdict(o) for o in outcomes]}


def _child(d: Driver, go: Any, start_at: Any, out: Any) -> None:
    """A spawned process's body: ready, wait for the common start, drive, report."""
    from baton.bench.client import run as run_loop

    try:
        import httpx  # noqa: F401 - imported before the start, not on the clock

        out.put({"ready": d.tenant})
        if not go.wait(timeout=300):
            raise TimeoutError("no start signal")
        out.put(run_loop(drive(d, start_at.value)))
    except BaseException:
        out.put({"tenant": d.tenant, "phase": d.phase, "error": traceback.format_exc()[-2000:]})


# --- summaries ------------------------------------------------------------------------------------------

def summarize_tenant(outcomes: Sequence[Outcome], elapsed_s: float) -> dict[str, Any]:
    """Counts, ``Retry-After`` on 429s, TTFT (ms) of the completed requests, tokens and tokens/s."""
    counts = dict.fromkeys(KINDS, 0)
    for o in outcomes:
        counts[o.kind] = counts.get(o.kind, 0) + 1
    refused = [o for o in outcomes if o.kind == "429"]
    missing = sum(1 for o in refused if not o.retry_after)
    ok = [o for o in outcomes if o.kind == "200"]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    tokens = sum(o.completion_tokens for o in outcomes)
    prompt_tokens = sum(o.prompt_tokens for o in outcomes)
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.kind != "200" and o.error:
            key = f"{o.kind}: {o.error}"[:160]
            errors[key] = errors.get(key, 0) + 1
    return {
        "sent": len(outcomes),
        "completed": len(ok),
        "status": counts,
        "retry_after_on_every_429": missing == 0,
        "429_without_retry_after": missing,
        "ttft_ms": stats.describe(ttfts, (50, 90, 99), scale=1000.0),
        "completion_tokens": tokens,
        "elapsed_s": elapsed_s,
        "tokens_per_s": tokens / elapsed_s if elapsed_s > 0 else math.nan,
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:10]),
        "prompt_tokens": prompt_tokens,
        "weighted_tokens": weighted_tokens(prompt_tokens, tokens),
        "completed_without_usage": sum(1 for o in ok if not o.usage),
    }


def _outcomes(raw: Mapping[str, Any]) -> list[Outcome]:
    return [Outcome(**o) for o in raw.get("outcomes", ())]


async def read_records(api: AdminApi, made: Made, raw: Mapping[str, Sequence[Mapping[str, Any]]],
                       log: Callable[[str], None], *, tries: int = 10) -> dict[str, list[dict[str, Any]]]:
    """Each tenant's request records (role -> records), once the gateway has written as many as the
    tenant's completed requests (the gateway writes them in batches, off the request path), or
    after ``tries`` seconds with what there is."""
    answered = {role: sum(1 for phase in raw.values() for r in phase if r["tenant"] == role
                          for o in _outcomes(r) if o.kind == "200")
                for role in made.tenants}
    out: dict[str, list[dict[str, Any]]] = {}
    for attempt in range(tries):
        out = {role: await api.requests(tid) for role, tid in made.tenants.items()}
        if all(len(out[role]) >= n for role, n in answered.items()):
            break
        if attempt < tries - 1:
            await asyncio.sleep(1.0)
    short = {role: f"{len(out[role])} of {n}" for role, n in answered.items() if len(out[role]) < n}
    if short:
        log(f"request records not all written yet: {short}")
    return out


def record_figures(records: Sequence[Mapping[str, Any]], window: tuple[float, float]) -> dict[str, Any]:
    """Baton's own view of one tenant's requests started within ``window`` (epoch seconds): how long they
    waited in the gateway's queue, and their time to first token after it."""
    lo, hi = window
    mine = [r for r in records if lo <= dt.datetime.fromisoformat(r["started_at"]).timestamp() <= hi]
    queued = [float(r["queue_ms"]) for r in mine if r.get("queue_ms") is not None]
    after = [float(r["ttft_ms"]) - float(r.get("queue_ms") or 0.0) for r in mine if r.get("ttft_ms") is not None]
    return {"records": len(mine), "queue_ms": stats.describe(queued, (50, 90, 99)),
            "ttft_after_queue_ms": stats.describe(after, (50, 90, 99))}


def summarize(cfg: FairnessConfig, raw: Mapping[str, Sequence[Mapping[str, Any]]], *,
              records: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
              windows: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The result's figures from each phase's driver results (``{phase: [drive(...) result, ...]}``):
    per tenant and phase, per band, the derived figures and the targets; with ``records`` (role -> request
    records) and ``windows`` (phase -> its span), each tenant's figures from Baton's records too."""
    phases: dict[str, Any] = {}
    ttft_samples: dict[str, list[float]] = {}
    weights = {"a": 1.0, "b": 1.0, **{b.name: b.weight for b in cfg.bands}, **SHARE_WEIGHTS}
    for phase, results in raw.items():
        tenants = {r["tenant"]: summarize_tenant(_outcomes(r), float(r.get("elapsed_s", 0.0))) for r in results}
        entry: dict[str, Any] = {"tenants": tenants}
        if records and windows and phase in windows:
            entry["records"] = {n: record_figures(records.get(n, ()), windows[phase]) for n in tenants}
        names = list(tenants)
        entry["jain_index"] = jain_index([tenants[n]["tokens_per_s"] for n in names],
                                         [weights.get(n, 1.0) for n in names]) if names else math.nan
        for r in results:
            if r["tenant"] == "b":
                ttft_samples[phase] = [1000.0 * o.ttft_s for o in _outcomes(r)
                                       if o.kind == "200" and o.ttft_s is not None]
        if phase == "bands":
            entry["token_share"] = token_shares({n: t["completion_tokens"] for n, t in tenants.items()})
            entry["attainment"] = {}
            for band in cfg.bands:
                res = next((r for r in results if r["tenant"] == band.name), None)
                outs = _outcomes(res) if res else []
                ok = [o.ttft_s for o in outs if o.kind == "200" and o.ttft_s is not None]
                entry["attainment"][band.name] = {
                    "priority": band.priority, "ttft_ms": band.ttft_ms, "sheddable": band.sheddable,
                    "weight": band.weight, "completed": len(ok), "sent": len(outs),
                    "attainment": attainment(ok, band.ttft_ms),
                    "attainment_of_sent": (sum(1 for t in ok if t * 1000.0 <= band.ttft_ms) / len(outs)
                                           if outs else math.nan),
                }
        if phase == "share":
            entry["share"] = share_figures(cfg, tenants)
        phases[phase] = entry
    return {"phases": phases, "b_ttft_ms_samples": ttft_samples, **derive(cfg, phases)}


def share_figures(cfg: FairnessConfig, tenants: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``share`` phase's figures: each tenant's weighted tokens (prompt + 2 x completion), the first
    tenant's over the second's, and that ratio's error against their weights' ratio."""
    (hi, w_hi), (lo, w_lo) = list(SHARE_WEIGHTS.items())[:2]
    served = {n: float(tenants[n]["weighted_tokens"]) if n in tenants else math.nan for n in SHARE_WEIGHTS}
    ratio = _ratio(served[hi], served[lo])
    return {
        "priority": cfg.ab_priority,
        "weights": dict(SHARE_WEIGHTS),
        "weighted_tokens": served,
        "ratio": ratio,
        "weight_ratio": w_hi / w_lo,
        "error": share_error(ratio, w_hi / w_lo),
    }


def derive(cfg: FairnessConfig, phases: Mapping[str, Any]) -> dict[str, Any]:
    """``derived`` figures and ``targets`` (``{"measured", "target", "op", "met"}``; ``met`` None when the
    phases it needs did not run) from the per-phase summaries."""

    def p99(phase: str, tenant: str) -> float | None:
        t = phases.get(phase, {}).get("tenants", {}).get(tenant)
        v = t["ttft_ms"]["p99"] if t else None
        return v if isinstance(v, int | float) and math.isfinite(v) else None

    ratio = _ratio(p99("a_flood_b", "b"), p99("b_alone", "b"))
    a = phases.get("a_flood_b", {}).get("tenants", {}).get("a")
    a_clean = None if a is None else all(a["status"][k] == 0 for k in ("503", "5xx", "timeout"))
    all_tenants = [t for p in phases.values() for t in p.get("tenants", {}).values()]
    every_429 = all(t["retry_after_on_every_429"] for t in all_tenants) if all_tenants else None
    att = phases.get("bands", {}).get("attainment", {})
    band_att = {name: v["attainment"] for name, v in att.items()}
    top = max(cfg.bands, key=lambda b: b.priority).name if cfg.bands else None
    top_att = band_att.get(top) if top else None
    top_att = top_att if isinstance(top_att, float) and math.isfinite(top_att) else None
    share = phases.get("share", {}).get("share") or {}
    share_err = share.get("error")
    derived = {
        "b_ttft_p99_ms_alone": p99("b_alone", "b"),
        "b_ttft_p99_ms_beside_a": p99("a_flood_b", "b"),
        "b_ttft_p99_ratio": ratio,
        "a_never_5xx_or_timeout": a_clean,
        "every_429_had_retry_after": every_429,
        "band_attainment": band_att,
        "top_band": top,
        "top_band_attainment": top_att,
        "bands_token_share": phases.get("bands", {}).get("token_share", {}),
        "jain_index": {name: p.get("jain_index") for name, p in phases.items() if name != "b_alone"},
        "share_weighted_tokens": share.get("weighted_tokens", {}),
        "share_ratio": share.get("ratio"),
        "share_weight_ratio": share.get("weight_ratio"),
        "share_error": share_err,
    }
    targets: dict[str, dict[str, Any]] = {
        "b_ttft_p99_ratio": {"measured": ratio, "target": TARGET_B_TTFT_P99_RATIO, "op": "<=",
                             "met": None if ratio is None else ratio <= TARGET_B_TTFT_P99_RATIO},
        "a_never_5xx_or_timeout": {"measured": a_clean, "target": True, "op": "==", "met": a_clean},
        "every_429_had_retry_after": {"measured": every_429, "target": True, "op": "==", "met": every_429},
        "top_band_attainment": {"measured": top_att, "target": TARGET_TOP_BAND_ATTAINMENT, "op": ">=",
                                "met": None if top_att is None else top_att >= TARGET_TOP_BAND_ATTAINMENT},
        "share_within_10pct_of_weights": {"measured": share_err, "target": TARGET_SHARE_ERROR, "op": "<=",
                                          "met": None if share_err is None else share_err <= TARGET_SHARE_ERROR},
    }
    judged = [t["met"] for t in targets.values() if t["met"] is not None]
    return {"derived": derived, "targets": targets, "met": bool(judged) and all(judged)}


# --- the admin API --------------------------------------------------------------------------------------

class AdminError(RuntimeError):
    pass


@dataclass
class Made:
    """What the run made through the admin API, so that all of it goes again."""

    tenants: dict[str, str] = field(default_factory=dict)  # role -> tenant id
    tenant_names: dict[str, str] = field(default_factory=dict)  # role -> tenant name
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # role -> (tenant id, key id)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)  # role -> API key
    policies: dict[str, str] = field(default_factory=dict)  # role -> policy id
    assignments: dict[str, str] = field(default_factory=dict)  # role -> assignment id


class AdminApi:
    """The few ``/admin/v1`` calls the benchmark needs, over an ``httpx.AsyncClient``."""

    def __init__(self, http: Any) -> None:
        self.http = http

    async def _call(self, method: str, path: str, *, ok: Iterable[int] = (200, 201, 204), **kw: Any) -> Any:
        r = await self.http.request(method, path, **kw)
        if r.status_code not in tuple(ok):
            raise AdminError(f"{method} /admin/v1{path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.status_code != 204 and r.content else None

    async def model_id(self, name: str) -> str:
        page = await self._call("GET", "/models", params={"name": name, "limit": 500})
        for m in page["data"]:
            if m["name"] == name:
                return str(m["id"])
        raise AdminError(f"model {name!r} is not in the catalogue (GET /admin/v1/models)")

    async def create_tenant(self, name: str, display: str) -> str:
        body = await self._call("POST", "/tenants", json={"name": name, "display_name": display})
        return str(body["id"])

    async def grant(self, tenant_id: str, model_id: str) -> None:
        await self._call("PUT", f"/tenants/{tenant_id}/models/{model_id}")

    async def set_limits(self, tenant_id: str, limits: Mapping[str, int]) -> None:
        await self._call("PUT", f"/tenants/{tenant_id}/rate-limit", json=dict(limits))

    async def create_policy(self, body: Mapping[str, Any]) -> str:
        out = await self._call("POST", "/slo-policies", json=dict(body))
        return str(out["id"])

    async def assign(self, policy_id: str, tenant_id: str) -> str:
        out = await self._call("POST", "/slo-assignments", json={"policy_id": policy_id, "tenant_id": tenant_id})
        return str(out["id"])

    async def issue_key(self, tenant_id: str, name: str) -> tuple[str, str]:
        out = await self._call("POST", f"/tenants/{tenant_id}/keys", json={"name": name})
        return str(out["key"]["id"]), str(out["secret"])

    async def requests(self, tenant_id: str) -> list[dict[str, Any]]:
        """Every request record of the tenant (Baton's own view of its requests), newest first."""
        out: list[dict[str, Any]] = []
        while True:
            page = await self._call("GET", "/requests", params={"tenant_id": tenant_id, "limit": 500,
                                                                 "offset": len(out)})
            out.extend(page["data"])
            if not page["data"] or len(out) >= page["count"]:
                return out

    async def delete_assignment(self, assignment_id: str) -> None:
        await self._call("DELETE", f"/slo-assignments/{assignment_id}", ok=(204, 404))

    async def delete_policy(self, policy_id: str) -> None:
        await self._call("DELETE", f"/slo-policies/{policy_id}", ok=(204, 404))

    async def revoke_key(self, tenant_id: str, key_id: str) -> None:
        await self._call("POST", f"/tenants/{tenant_id}/keys/{key_id}/revoke", ok=(200, 404, 409))

    async def delete_tenant(self, tenant_id: str) -> None:
        # the bench's own tenants, keys still live: force (an operator's delete of a live tenant needs it)
        await self._call("DELETE", f"/tenants/{tenant_id}", ok=(204, 404), params={"force": "true"})

    async def leftovers(self, prefix: str) -> tuple[list[str], list[str]]:
        """Ids of the tenants and policies whose names start with ``prefix``."""
        page = await self._call("GET", "/tenants", params={"name": prefix, "limit": 500})
        tenants = [str(t["id"]) for t in page["data"] if str(t["name"]).startswith(prefix)]
        policies: list[str] = []
        offset = 0
        while True:
            page = await self._call("GET", "/slo-policies", params={"limit": 500, "offset": offset})
            policies += [str(p["id"]) for p in page["data"] if str(p["name"]).startswith(prefix)]
            offset += len(page["data"])
            if not page["data"] or offset >= page["count"]:
                break
        return tenants, policies


def policy_body(name: str, *, priority: int, ttft_ms: int, tpot_ms: int, sheddable: bool = False,
                weight: float = 1.0) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "priority": priority,
                            "sheddable": sheddable}
    if weight != 1.0:
        body["weight"] = weight
    return body


def roles(cfg: FairnessConfig) -> dict[str, dict[str, Any]]:
    """The tenants the phases need (role -> its policy's fields)."""
    out: dict[str, dict[str, Any]] = {}
    if {"b_alone", "a_flood_b"} & set(cfg.phases):
        out["b"] = {"priority": cfg.ab_priority, "ttft_ms": cfg.ab_ttft_ms}
    if "a_flood_b" in cfg.phases:
        out["a"] = {"priority": cfg.ab_priority, "ttft_ms": cfg.ab_ttft_ms}
    if "bands" in cfg.phases:
        for b in cfg.bands:
            out[b.name] = {"priority": b.priority, "ttft_ms": b.ttft_ms, "sheddable": b.sheddable,
                           "weight": b.weight}
    if "share" in cfg.phases:
        for name, weight in SHARE_WEIGHTS.items():
            out[name] = {"priority": cfg.ab_priority, "ttft_ms": cfg.ab_ttft_ms, "weight": weight}
    return out


async def setup(api: AdminApi, cfg: FairnessConfig, made: Made, run_id: str, log: Callable[[str], None]) -> None:
    """Tenants (the model granted, generous limits), a policy and its assignment each, a key each; every
    id goes into ``made`` as soon as it exists."""
    model_id = await api.model_id(cfg.model)
    for role, policy in roles(cfg).items():
        name = f"{NAME_PREFIX}-{run_id}-{role}"
        tenant_id = await api.create_tenant(name, f"baton bench fairness: tenant {role}")
        made.tenants[role], made.tenant_names[role] = tenant_id, name
        await api.grant(tenant_id, model_id)
        await api.set_limits(tenant_id, GENEROUS_LIMITS)
        pid = await api.create_policy(policy_body(name, tpot_ms=cfg.tpot_ms, **policy))
        made.policies[role] = pid
        made.assignments[role] = await api.assign(pid, tenant_id)
        key_id, secret = await api.issue_key(tenant_id, f"{NAME_PREFIX}-{role}")
        made.keys[role], made.secrets[role] = (tenant_id, key_id), secret
        weight = float(policy.get("weight", 1.0))
        log(f"tenant {role}: {name} (priority {policy['priority']}, TTFT target {policy['ttft_ms']} ms"
            f"{', sheddable' if policy.get('sheddable') else ''}{f', weight {weight:g}' if weight != 1.0 else ''})")


async def cleanup(api: AdminApi, made: Made) -> dict[str, Any]:
    """Deletes what ``made`` lists (assignments, policies, keys revoked, tenants); never raises."""
    done: dict[str, int] = {"assignments": 0, "policies": 0, "keys": 0, "tenants": 0}
    errors: list[str] = []
    steps: Sequence[tuple[str, Callable[[], Awaitable[None]]]] = (
        [("assignments", functools.partial(api.delete_assignment, a)) for a in made.assignments.values()]
        + [("policies", functools.partial(api.delete_policy, p)) for p in made.policies.values()]
        + [("keys", functools.partial(api.revoke_key, t, k)) for t, k in made.keys.values()]
        + [("tenants", functools.partial(api.delete_tenant, t)) for t in made.tenants.values()]
    )
    for what, call in steps:
        try:
            await call()
            done[what] += 1
        except Exception as exc:  # one failure must not keep the rest
            errors.append(f"{what}: {exc}"[:300])
    return {"deleted": done, "errors": errors}


async def sweep(api: AdminApi, log: Callable[[str], None]) -> int:
    """Deletes what an interrupted run left (names starting :data:`NAME_PREFIX`)."""
    tenants, policies = await api.leftovers(f"{NAME_PREFIX}-")
    for p in policies:
        await api.delete_policy(p)
    for t in tenants:
        await api.delete_tenant(t)
    if tenants or policies:
        log(f"deleted {len(tenants)} tenant(s) and {len(policies)} policy(ies) left by an earlier run")
    return len(tenants) + len(policies)


# --- the run --------------------------------------------------------------------------------------------

def chat_url(cfg: FairnessConfig, role: str) -> str:
    """Where the tenant of ``role`` sends (see :attr:`FairnessConfig.second_url`)."""
    base = cfg.second_url if cfg.second_url and role in SECOND_GATEWAY_ROLES else cfg.base_url
    return base.rstrip("/") + "/v1/chat/completions"


def drivers(cfg: FairnessConfig, phase: str, secrets: Mapping[str, str]) -> list[Driver]:
    """The tenants' loads of one phase."""
    common: dict[str, Any] = {"model": cfg.model, "timeout_s": cfg.request_timeout_s, "seed": cfg.seed}

    def b(offset: float) -> Driver:
        return Driver(tenant="b", phase=phase, api_key=secrets["b"], prompt_words=cfg.b_prompt_words,
                      max_tokens=cfg.b_max_tokens, window_s=cfg.duration_s, offset_s=offset,
                      interval_s=cfg.b_interval_s, url=chat_url(cfg, "b"), **common)

    if phase == "b_alone":
        return [b(0.0)]
    if phase == "a_flood_b":
        a = Driver(tenant="a", phase=phase, api_key=secrets["a"], prompt_words=cfg.a_prompt_words,
                   max_tokens=cfg.a_max_tokens, window_s=cfg.lead_s + cfg.duration_s,
                   concurrency=cfg.a_concurrency, honour_retry_after=False, retry_pause_s=cfg.a_retry_pause_s,
                   interval_s=1.0 / cfg.a_rate if cfg.a_rate else None, url=chat_url(cfg, "a"), **common)
        return [a, b(cfg.lead_s)]
    if phase == "bands":
        return [Driver(tenant=band.name, phase=phase, api_key=secrets[band.name],
                       prompt_words=cfg.band_prompt_words, max_tokens=cfg.band_max_tokens, window_s=cfg.duration_s,
                       concurrency=band.streams or cfg.band_streams(), honour_retry_after=True, retry_pause_s=0.05,
                       url=chat_url(cfg, band.name), **common)
                for band in cfg.bands]
    if phase == "share":
        return [Driver(tenant=name, phase=phase, api_key=secrets[name], prompt_words=cfg.share_prompt_words,
                       max_tokens=cfg.share_max_tokens, window_s=cfg.duration_s, concurrency=cfg.share_streams(),
                       honour_retry_after=True, retry_pause_s=0.05, url=chat_url(cfg, name), **common)
                for name in SHARE_WEIGHTS]
    raise ValueError(f"unknown phase {phase!r}; choose from {', '.join(PHASES)}")


async def _phase_in_processes(ds: Sequence[Driver], span_s: float, tick: Callable[[], None], *,
                              started: list[float] | None = None) -> list[dict[str, Any]]:
    """Each driver in a spawned process; all start together once every one is ready (imports done).
    ``started`` gets the phase's start (unix seconds: each outcome's ``start_s`` counts from it)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_child, args=(d, go, start_at, out), daemon=True) for d in ds]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    ready = 0
    deadline = time.monotonic() + 300 + span_s
    next_tick = math.inf
    try:
        while len(results) < len(ds):
            try:
                msg = out.get_nowait()
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError("the load processes did not report in time") from None
                if not any(p.is_alive() for p in procs) and out.empty():
                    await asyncio.sleep(1.0)  # a result still on its way through the pipe
                    if out.empty():
                        raise RuntimeError("a load process ended without its result") from None
                await asyncio.sleep(0.05)
                if time.monotonic() >= next_tick:
                    next_tick += 1.0
                    tick()
                continue
            if "ready" in msg:
                ready += 1
                if ready == len(ds):
                    start_at.value = time.time() + 0.5
                    if started is not None:
                        started.append(start_at.value)
                    go.set()
                    next_tick = time.monotonic() + 1.5
                continue
            results.append(msg)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return results


async def _phase_in_loop(ds: Sequence[Driver], tick: Callable[[], None], transport: Any) -> list[dict[str, Any]]:
    start_at = time.time() + 0.2

    async def ticker() -> None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        while True:
            await asyncio.sleep(1.0)
            tick()

    ticking = asyncio.create_task(ticker())
    try:
        return list(await asyncio.gather(*(drive(d, start_at, transport=transport) for d in ds)))
    finally:
        ticking.cancel()


async def _warmup(cfg: FairnessConfig, secrets: Mapping[str, str], transport: Any) -> dict[str, int]:
    """A few sequential short requests per tenant; fails the run when none of a tenant's was answered
    (streamed, or refused by flow control with 429: its key, grant and model work)."""
    import httpx

    rng = random.Random(cfg.seed)
    ok: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=cfg.request_timeout_s, transport=transport) as client:
        for role, key in secrets.items():
            ok[role] = 0
            last = ""
            for i in range(cfg.warmup_requests):
                body = chat_body(cfg.model, make_prompt(rng, cfg.b_prompt_words, f"warmup-{role}-{i}"), 8)
                o = await send_chat(client, chat_url(cfg, role), key, body, timeout_s=cfg.request_timeout_s)
                ok[role] += o.kind in ("200", "429")
                last = o.error or o.kind
            if cfg.warmup_requests and not ok[role]:
                raise RuntimeError(f"tenant {role}: no warm-up request was answered ({last})")
    return ok


async def run_async(cfg: FairnessConfig, *, log: Callable[[str], None] = print,
                    progress: ProgressFactory | None = None, transport: Any = None) -> dict[str, Any]:
    """The whole benchmark (see the module's docstring); ``transport`` (an httpx transport) replaces the
    network, and forces ``processes`` off."""
    import httpx

    unknown = [p for p in cfg.phases if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase(s) {unknown}; choose from {', '.join(PHASES)}")
    if not cfg.admin_token:
        raise ValueError("an admin token is needed (BATON_SECURITY__ADMIN_TOKEN in var/baton.env)")
    if transport is not None:
        cfg = replace(cfg, processes=False)
    started = report.provenance()
    run_id = uuid.uuid4().hex[:6]
    made = Made()
    raw: dict[str, list[dict[str, Any]]] = {}
    killer: asyncio.Task[dict[str, Any]] | None = None
    fault: dict[str, Any] | None = None
    windows: dict[str, tuple[float, float]] = {}  # phase -> its wall-clock span (the request records')
    records: dict[str, list[dict[str, Any]]] = {}
    async with httpx.AsyncClient(base_url=cfg.base_url.rstrip("/") + "/admin/v1", timeout=30.0, transport=transport,
                                 headers={"Authorization": f"Bearer {cfg.admin_token}"}) as http:
        api = AdminApi(http)
        await sweep(api, log)
        try:
            await setup(api, cfg, made, run_id, log)
            await asyncio.sleep(cfg.settle_s)
            warm = await _warmup(cfg, made.secrets, transport)
            log(f"warm-up answered: {warm}")
            for i, phase in enumerate(cfg.phases):
                if i:
                    await asyncio.sleep(cfg.gap_s)
                ds = drivers(cfg, phase, made.secrets)
                span = max(d.offset_s + d.window_s for d in ds)
                log(f"{phase}: {', '.join(_describe(d) for d in ds)}")
                tick = _ticker(progress, phase, math.ceil(span))
                opened = time.time()
                if phase == "a_flood_b" and cfg.kill_decode_at_s is not None:
                    killer = asyncio.create_task(_kill_decode(cfg, log))
                if cfg.processes:
                    results = await _phase_in_processes(ds, span, tick)
                else:
                    results = await _phase_in_loop(ds, tick, transport)
                failed = [r for r in results if "error" in r]
                if failed:
                    raise RuntimeError(f"{phase}: tenant {failed[0]['tenant']}'s load failed:\n{failed[0]['error']}")
                for _ in range(math.ceil(span)):
                    tick()  # the bar full: the phase is over
                if killer is not None:
                    fault = await killer
                    killer = None
                order = [d.tenant for d in ds]
                raw[phase] = sorted(results, key=lambda r: order.index(r["tenant"]))
                windows[phase] = (opened, time.time())
                log(_phase_line(phase, raw[phase]))
            records = await read_records(api, made, raw, log)
        finally:
            cleaned = await cleanup(api, made)
            log(f"cleaned up: {cleaned['deleted']}" + (f", errors: {cleaned['errors']}" if cleaned["errors"] else ""))
    figures = summarize(cfg, raw, records=records, windows=windows)
    tenants = {role: {"name": made.tenant_names[role], "policy": policy} for role, policy in roles(cfg).items()}
    return {
        "benchmark": "fairness",
        "config": config_dict(cfg),
        "method": "tenants, SLO policies, assignments and keys made through /admin/v1 (rate limits far above the "
                  "load: only flow control pushes back), deleted afterwards; streamed chat completions to /v1 "
                  "timed at the client, each tenant's load in its own process; TTFT = sending to the first SSE "
                  "chunk with content text; tokens/s = completion tokens received / the tenant's time from its "
                  "first send to its last end; attainment = completed requests within the policy's ttft_ms / "
                  "completed requests; weighted tokens = prompt tokens (the stream's usage report) + 2 x "
                  "completion tokens, as the gateway's fair share counts them; records = Baton's own request "
                  "records of each tenant (GET /admin/v1/requests) in the phase's time: queue_ms (the wait in "
                  "the gateway's flow-control queue) and ttft_ms - queue_ms (the time to first token after it, "
                  "as the gateway timed it)",
        "tenants": tenants,
        **figures,
        **({"fault": fault} if fault is not None else {}),
        "cleanup": cleaned,
        "provenance": report.provenance(started),
    }


async def _kill_decode(cfg: FairnessConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """SIGKILLs one decode replica of ``cfg.kill_app`` (its engine processes first) at ``kill_decode_at_s``
    into the phase; what was killed and whether it was gone, for the result."""
    from baton.bench.chaos.faults import kill_replica, replicas_from_titles

    assert cfg.kill_decode_at_s is not None
    await asyncio.sleep(cfg.kill_decode_at_s)
    victims = [r for r in await asyncio.to_thread(replicas_from_titles, cfg.kill_app) if r.pool == "decode"]
    if not victims:
        log(f"fault: no decode replica of {cfg.kill_app} found on this machine; nothing killed")
        return {"at_s": cfg.kill_decode_at_s, "app": cfg.kill_app, "killed": False, "detail": "no decode replica"}
    killed, detail = await asyncio.to_thread(kill_replica, victims[0])
    log(f"fault at +{cfg.kill_decode_at_s:g} s: decode replica {victims[0].deployment} (pid {victims[0].pid}): "
        f"{detail}")
    return {"at_s": cfg.kill_decode_at_s, "app": cfg.kill_app, "deployment": victims[0].deployment,
            "killed": killed, "detail": detail}


def run(cfg: FairnessConfig, *, log: Callable[[str], None] = print,
        progress: ProgressFactory | None = None) -> dict[str, Any]:
    """Runs the benchmark against the stack at ``cfg.base_url`` and returns its result."""
    from baton.bench.client import run as run_loop

    result: dict[str, Any] = run_loop(run_async(cfg, log=log, progress=progress))
    return result


def _ticker(progress: ProgressFactory | None, phase: str, total: int) -> Callable[[], None]:
    """A phase's progress bar, one step a second, never past ``total``."""
    if progress is None:
        return lambda: None
    advance = progress(phase, total)
    steps = 0

    def tick() -> None:
        nonlocal steps
        if steps < total:
            steps += 1
            advance(1)

    return tick


def _describe(d: Driver) -> str:
    load = (f"a request every {d.interval_s:g} s" if d.interval_s is not None
            else f"{d.concurrency} streams in flight")
    return f"{d.tenant} {load} ({d.prompt_words} words, max_tokens {d.max_tokens}) for {d.window_s:g} s" + (
        f" from +{d.offset_s:g} s" if d.offset_s else "")


def _phase_line(phase: str, results: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for r in results:
        s = summarize_tenant(_outcomes(r), float(r["elapsed_s"]))
        counts = ", ".join(f"{k} {v}" for k, v in s["status"].items() if v)
        parts.append(f"{r['tenant']}: {counts or 'nothing sent'}; TTFT p99 {s['ttft_ms']['p99']:.0f} ms")
    return f"{phase} done: " + "; ".join(parts)


# --- the plot -------------------------------------------------------------------------------------------

def plot(path: Path, result: Mapping[str, Any]) -> Path:
    """B's TTFT as a CDF alone and beside A's flood, and each band's SLO attainment (bars, with the top
    band's target)."""
    plt = report._plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    samples = result.get("b_ttft_ms_samples") or {}
    for phase, label, style in (("b_alone", "B alone", "-"), ("a_flood_b", "B beside A's flood", "--")):
        xs = sorted(samples.get(phase) or [])
        if xs:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            p99 = stats.percentile(xs, 99)
            ax1.step(xs, ys, style, where="post", label=f"{label} (p99 {p99:.0f} ms, n={len(xs)})")
    ratio = (result.get("derived") or {}).get("b_ttft_p99_ratio")
    ax1.axhline(0.99, color="grey", linewidth=0.8, linestyle=":")
    ax1.set_xlabel("TTFT (ms, client)")
    ax1.set_ylabel("share of B's completed requests")
    ax1.set_title("B's TTFT" + (f": p99 ratio {ratio:.2f} (target <= {TARGET_B_TTFT_P99_RATIO:g})"
                                if isinstance(ratio, int | float) else ""))
    ax1.grid(alpha=0.3)
    if samples:
        ax1.legend(fontsize=8, loc="lower right")
    bands = ((result.get("phases") or {}).get("bands") or {}).get("attainment") or {}
    names = list(bands)
    if names:
        vals = [bands[n]["attainment"] if isinstance(bands[n]["attainment"], int | float) else 0.0 for n in names]
        share = ((result.get("phases") or {}).get("bands") or {}).get("token_share") or {}
        labels = [f"{n}\nprio {bands[n]['priority']}, {bands[n]['ttft_ms']} ms"
                  + (", shed" if bands[n]["sheddable"] else "") for n in names]
        bars = ax2.bar(labels, vals, color=["tab:green", "tab:blue", "tab:orange", "tab:red"][: len(names)])
        for bar, n in zip(bars, names, strict=True):
            s, of_sent = share.get(n), bands[n].get("attainment_of_sent")
            note = f"{bar.get_height():.2f}"
            if isinstance(of_sent, int | float) and math.isfinite(of_sent):
                note += f" ({of_sent:.2f} of sent)"
            if isinstance(s, int | float) and math.isfinite(s):
                note += f"\n{100 * s:.0f}% of tokens"
            ax2.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                         fontsize=8)
        ax2.axhline(TARGET_TOP_BAND_ATTAINMENT, color="black", linestyle="--", linewidth=1,
                    label=f"top band target {TARGET_TOP_BAND_ATTAINMENT:g}")
        ax2.legend(fontsize=8, loc="lower left")
    ax2.set_ylim(0, 1.18)
    ax2.set_ylabel("completed requests within the TTFT target")
    ax2.set_title("SLO attainment per priority band")
    ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
