"""The load generator's client: streaming OpenAI requests over one bounded aiohttp connection pool,
timed on the client with :func:`time.perf_counter`, sent at Poisson arrival times."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from baton.bench.datasets import SampleRequest
from baton.bench.stats import RequestResult, poisson_arrivals

ProgressFn = Callable[[RequestResult], None]


@dataclass
class Target:
    """One OpenAI-compatible endpoint: ``base_url`` ends before ``/chat/completions`` (e.g.
    ``http://127.0.0.1:8000/v1``)."""

    base_url: str
    model: str
    api_key: str | None = None
    endpoint: str = "chat"
    """``chat`` (/chat/completions) or ``completions`` (/completions)."""
    ignore_eos: bool = True
    """Ask for exactly ``output_len`` tokens (vLLM's ``ignore_eos`` and ``min_tokens``)."""
    name: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)

    def url(self) -> str:
        path = "/chat/completions" if self.endpoint == "chat" else "/completions"
        return self.base_url.rstrip("/") + path

    def request_headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", **self.headers}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def body(self, sample: SampleRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sample.output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": sample.prompt}]
        else:
            body["prompt"] = sample.prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = sample.output_len
        body.update(self.extra_body)
        return body


def _chunk_text(data: dict[str, Any]) -> str:
    parts = []
    for choice in data.get("choices") or ():
        delta = choice.get("delta")
        if isinstance(delta, dict):
            parts.append(delta.get("content") or "")
            parts.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
        parts.append(choice.get("text") or "")
    return "".join(parts)


def _finished(data: dict[str, Any]) -> bool:
    return any(c.get("finish_reason") for c in data.get("choices") or ())


async def send_one(session: Any, target: Target, sample: SampleRequest, *, t0: float = 0.0,
                   timeout_s: float = 300.0) -> RequestResult:
    """Sends one streaming request and times it. Never raises: failures come back as results."""
    import aiohttp

    res = RequestResult(success=False, prompt_len=sample.prompt_len, arm=target.name)
    payload = json.dumps(target.body(sample))
    tokens = 0
    usage_out: int | None = None
    usage_in: int | None = None
    done = finished = False
    st = time.perf_counter()
    res.start = st - t0 if t0 else 0.0
    last = st
    try:
        async with session.post(target.url(), data=payload, headers=target.request_headers(),
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                res.error = f"HTTP {resp.status}: {_error_message(text)}"
                res.latency = time.perf_counter() - st
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line or not line.startswith(b"data:"):
                    if line.startswith(b"event:") and b"error" in line:
                        res.error = "SSE error event"
                    continue
                now = time.perf_counter()
                data_s = line[5:].strip()
                if data_s == b"[DONE]":
                    done = True
                    break
                try:
                    data = json.loads(data_s)
                except ValueError:
                    res.error = "malformed SSE data"
                    break
                if "error" in data and not data.get("choices"):
                    res.error = "stream error: " + _error_message(json.dumps(data))
                    break
                if _chunk_text(data):
                    if tokens == 0:
                        res.ttft = now - st
                    else:
                        res.itl.append(now - last)
                    last = now
                    tokens += 1
                finished = finished or _finished(data)
                usage = data.get("usage")
                if isinstance(usage, dict):
                    usage_out = usage.get("completion_tokens", usage_out)
                    usage_in = usage.get("prompt_tokens", usage_in)
            res.latency = time.perf_counter() - st
    except TimeoutError:
        res.error = "timeout"
        res.latency = time.perf_counter() - st
        return res
    except Exception as exc:  # connection refused, reset, payload errors: a failed request
        res.error = type(exc).__name__
        res.latency = time.perf_counter() - st
        return res
    if res.error:
        return res
    if not (done or finished):
        res.error = "stream ended early"
        return res
    if tokens == 0:
        res.error = "no tokens"
        return res
    res.output_tokens = int(usage_out) if usage_out else tokens
    if usage_in:
        res.prompt_len = int(usage_in)
    res.success = True
    return res


def _error_message(text: str) -> str:
    try:
        obj = json.loads(text)
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:160]
        return str(err)[:160]
    except ValueError:
        return text[:160]


def make_session(max_connections: int) -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max(1, max_connections), force_close=False, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


SendFn = Callable[[Any, SampleRequest, int, float], Awaitable[RequestResult]]
"""``send(session, sample, index, t0)``: sends one request and times it (never raises)."""


async def run_requests(
    send: SendFn,
    samples: Sequence[SampleRequest],
    *,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    burstiness: float = 1.0,
    progress: ProgressFn | None = None,
    session: Any = None,
) -> tuple[list[RequestResult], float]:
    """Calls ``send`` for each sample at Poisson arrivals of ``request_rate`` per second (``inf``: all at
    once), at most ``max_concurrency`` in flight. Returns the results in send order and the duration."""
    offsets = poisson_arrivals(len(samples), request_rate, seed, burstiness=burstiness)
    limit = max_concurrency or len(samples) or 1
    sem = asyncio.Semaphore(limit)
    own = session is None
    sess = session or make_session(limit)
    t0 = time.perf_counter()

    async def one(i: int, offset: float, sample: SampleRequest) -> RequestResult:
        delay = offset - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:
            r = await send(sess, sample, i, t0)
        if progress:
            progress(r)
        return r

    try:
        results = await asyncio.gather(*(one(i, o, s) for i, (o, s) in enumerate(zip(offsets, samples, strict=True))))
    finally:
        if own:
            await sess.close()
    return list(results), time.perf_counter() - t0


async def run_load(
    target: Target | Sequence[Target],
    samples: Sequence[SampleRequest],
    *,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    seed: int = 0,
    burstiness: float = 1.0,
    timeout_s: float = 300.0,
    progress: ProgressFn | None = None,
    session: Any = None,
) -> tuple[list[RequestResult], float]:
    """:func:`run_requests` to one target, or round-robin over several (replicas without a router)."""
    targets = [target] if isinstance(target, Target) else list(target)

    async def send(sess: Any, sample: SampleRequest, i: int, t0: float) -> RequestResult:
        return await send_one(sess, targets[i % len(targets)], sample, t0=t0, timeout_s=timeout_s)

    return await run_requests(send, samples, request_rate=request_rate, max_concurrency=max_concurrency, seed=seed,
                              burstiness=burstiness, progress=progress, session=session)


def run(coro: Any) -> Any:
    """Runs a coroutine on uvloop when it is installed (lower client overhead), else asyncio's loop."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)
