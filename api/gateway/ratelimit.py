"""Rate limits in Redis: requests and tokens per minute, concurrent requests; per tenant and per key.

One Lua script decides a request atomically for every scope that applies (the tenant's limits and
the key's), so several gateway processes sharing one Redis never admit more than a limit allows:

- requests per minute: a sliding-window log (sorted set of request ids scored by admission time);
  in any 60 s window at most ``limit`` requests are admitted.
- tokens per minute: the same log with an amount per request (hash) and a running sum. Admission
  reserves prompt + max_tokens; :meth:`RateLimiter.finish` corrects the reservation to what the
  engine really used.
- concurrency: leases (sorted set scored by lease expiry). A lease is released when the request
  ends (completed, failed or the client went away) and renewed while it runs; a process that dies
  leaves leases that expire after ``lease_s``, so slots heal on their own.

Time comes from Redis (``TIME``), so processes with skewed clocks still agree. All keys of a tenant
carry the tenant's hash tag (``{<tenant id>}``) and stay in one slot of a Redis cluster.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from baton.api.gateway.redis_client import lean_scripts

log = logging.getLogger(__name__)

WINDOW_MS = 60_000

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid = ARGV[1]
local tokens = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local horizon = now - 60000
local lim_req, rem_req, reset_req = -1, -1, 0
local lim_tok, rem_tok, reset_tok = -1, -1, 0
local deny, retry = 0, 0
local refreshed = {}

-- When enough reserved tokens leave the window for `need` more to fit.
local function tokens_free_at(log, amt, used, limit, need)
  local entries = redis.call('ZRANGE', log, 0, 63, 'WITHSCORES')
  local free = limit - used
  for i = 1, #entries, 2 do
    free = free + (tonumber(redis.call('HGET', amt, entries[i])) or 0)
    if free >= need then return tonumber(entries[i + 1]) + 60000 - now end
  end
  return 60000
end

for s = 0, n - 1 do
  local log, amt, conc = KEYS[s * 3 + 1], KEYS[s * 3 + 2], KEYS[s * 3 + 3]
  local rpm = tonumber(ARGV[5 + s * 3])
  local tpm = tonumber(ARGV[6 + s * 3])
  local cc = tonumber(ARGV[7 + s * 3])
  if rpm > 0 or tpm > 0 then
    -- one log of admissions (sorted by time) serves both per-minute limits; amounts and their sum in a hash
    local old = redis.call('ZRANGEBYSCORE', log, '-inf', horizon)
    if #old > 0 then
      if tpm > 0 then
        local freed = 0
        for i = 1, #old, 500 do
          local part = {}
          for j = i, math.min(i + 499, #old) do part[#part + 1] = old[j] end
          local amounts = redis.call('HMGET', amt, unpack(part))
          for k = 1, #amounts do freed = freed + (tonumber(amounts[k]) or 0) end
          redis.call('HDEL', amt, unpack(part))
        end
        if freed > 0 then redis.call('HINCRBY', amt, ':sum', -freed) end
      end
      redis.call('ZREMRANGEBYSCORE', log, '-inf', horizon)
    end
    local reset = 0
    local first = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
    if #first > 0 then reset = tonumber(first[2]) + 60000 - now end
    if rpm > 0 then
      local used = redis.call('ZCARD', log)
      if used + 1 > rpm then
        if deny == 0 then deny = 1 end
        retry = math.max(retry, reset)
      end
      local left = rpm - used - 1
      if rem_req < 0 or left < rem_req then lim_req, rem_req, reset_req = rpm, left, reset end
    end
    if tpm > 0 then
      local h = redis.call('HMGET', amt, ':sum', ':exp')
      local used = tonumber(h[1]) or 0
      refreshed[s] = tonumber(h[2]) or 0
      if tokens > tpm then
        deny = 4  -- can never fit: reported before any other reason
      elseif used + tokens > tpm then
        if deny == 0 then deny = 2 end
        retry = math.max(retry, tokens_free_at(log, amt, used, tpm, tokens))
      end
      local left = tpm - used - tokens
      if rem_tok < 0 or left < rem_tok then lim_tok, rem_tok, reset_tok = tpm, left, reset end
    end
  end
  if cc > 0 then
    redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
    if redis.call('ZCARD', conc) + 1 > cc then
      if deny == 0 then deny = 3 end
      retry = math.max(retry, 1000)
    end
  end
end

if deny == 0 then
  for s = 0, n - 1 do
    local log, amt, conc = KEYS[s * 3 + 1], KEYS[s * 3 + 2], KEYS[s * 3 + 3]
    local tpm = tonumber(ARGV[6 + s * 3])
    if tonumber(ARGV[5 + s * 3]) > 0 or tpm > 0 then
      redis.call('ZADD', log, now, rid)
      if tpm > 0 then
        -- the log and the hash outlive their newest entry by a minute: their expiry is pushed on at most
        -- once a second (62 s ahead), not on every admission
        if now - refreshed[s] >= 1000 then
          redis.call('HSET', amt, rid, tokens, ':exp', now)
          redis.call('PEXPIRE', log, 62000)
          redis.call('PEXPIRE', amt, 62000)
        else
          redis.call('HSET', amt, rid, tokens)
        end
        redis.call('HINCRBY', amt, ':sum', tokens)
      else
        redis.call('PEXPIRE', log, 61000)
      end
    end
    if tonumber(ARGV[7 + s * 3]) > 0 then
      redis.call('ZADD', conc, now + lease, rid)
      redis.call('PEXPIRE', conc, lease * 2)
    end
  end
else
  if rem_req >= 0 and deny ~= 1 then rem_req = rem_req + 1 end
  if rem_tok >= 0 then rem_tok = rem_tok + tokens end
end
return {deny, retry, lim_req, math.max(rem_req, 0), reset_req, lim_tok, math.max(rem_tok, 0), reset_tok}
"""

_FINISH = """
local rid = ARGV[1]
local actual = tonumber(ARGV[2])
for s = 0, tonumber(ARGV[3]) - 1 do
  local amt, conc = KEYS[s * 2 + 1], KEYS[s * 2 + 2]
  redis.call('ZREM', conc, rid)
  if actual >= 0 then
    local old = redis.call('HGET', amt, rid)
    if old and tonumber(old) ~= actual then
      redis.call('HSET', amt, rid, actual)
      redis.call('HINCRBY', amt, ':sum', actual - tonumber(old))
    end
  end
end
return 1
"""

_RENEW = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', until_ms, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 2)
end
return #KEYS
"""

DENIED_REQUESTS = 1
DENIED_TOKENS = 2
DENIED_CONCURRENCY = 3
DENIED_TOO_LARGE = 4


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None

    def __bool__(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.max_concurrency)


@dataclass(frozen=True, slots=True)
class LimitScope:
    """The limits of one tenant or one key, with its Redis keys computed once."""

    name: str
    limits: Limits
    keys: tuple[str, str, str] = field(repr=False)
    """The admission log (sorted set: request id -> admitted at, ms), the token amounts (hash: request id ->
    tokens, ``:sum`` their total, ``:exp`` when the expiry was last pushed on) and the concurrency leases
    (sorted set: request id -> lease expiry)."""

    @classmethod
    def tenant(cls, tenant_id: uuid.UUID, limits: Limits) -> LimitScope:
        return cls._make(tenant_id, f"t:{tenant_id}", limits)

    @classmethod
    def key(cls, tenant_id: uuid.UUID, key_id: uuid.UUID, limits: Limits) -> LimitScope:
        """One key's limits; ``key_id`` names their buckets (the gateway gives the key's ``rate_limits`` row
        id, which stays with the limits when the key is rotated)."""
        return cls._make(tenant_id, f"k:{key_id}", limits)

    @classmethod
    def _make(cls, tenant_id: uuid.UUID, name: str, limits: Limits) -> LimitScope:
        base = f"baton:rl:{{{tenant_id}}}:{name}"
        return cls(name, limits, (f"{base}:log", f"{base}:amt", f"{base}:conc"))


@dataclass(slots=True)
class Lease:
    """An admitted request's hold on its scopes, until :meth:`RateLimiter.finish`."""

    request_id: str
    scopes: tuple[LimitScope, ...]
    reserved_tokens: int


@dataclass(slots=True)
class Decision:
    allowed: bool
    reason: int = 0
    retry_after_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    lease: Lease | None = None


def _duration(ms: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``120ms``."""
    if ms < 1000:
        return f"{max(int(ms), 0)}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.3g}s"
    minutes, sec = divmod(round(s), 60)
    return f"{minutes}m{sec}s"


def _headers(raw: Sequence[int]) -> dict[str, str]:
    lim_req, rem_req, reset_req, lim_tok, rem_tok, reset_tok = (int(x) for x in raw[2:8])
    out: dict[str, str] = {}
    if lim_req > 0:
        out["x-ratelimit-limit-requests"] = str(lim_req)
        out["x-ratelimit-remaining-requests"] = str(rem_req)
        out["x-ratelimit-reset-requests"] = _duration(reset_req)
    if lim_tok > 0:
        out["x-ratelimit-limit-tokens"] = str(lim_tok)
        out["x-ratelimit-remaining-tokens"] = str(rem_tok)
        out["x-ratelimit-reset-tokens"] = _duration(reset_tok)
    return out


class RateLimiter:
    """Admission and release against Redis. ``redis`` is a ``redis.asyncio.Redis``; the scripts run over
    :mod:`baton.api.gateway.redis_client`' lean connection to the same server when it can reproduce it.

    When Redis cannot be reached, ``fail_open`` decides: admit without limits (the default; serving
    goes on and a warning is logged at most every 10 s) or refuse with 503.
    """

    def __init__(self, redis: Any, *, lease_s: float = 30.0, fail_open: bool = True, lean: bool = True) -> None:
        self._redis = redis
        self._lease_ms = int(lease_s * 1000)
        self._renew_every = max(lease_s / 3, 0.05)
        self.fail_open = fail_open
        self._lean = lean_scripts(redis) if lean else None  # None: redis-py's own scripts
        register = self._lean.script if self._lean is not None else redis.register_script
        self._admit = register(_ADMIT)
        self._finish = register(_FINISH)
        self._renew = register(_RENEW)
        self._held: dict[str, Lease] = {}  # leases with a concurrency slot, renewed while they run
        self._releases: list[tuple[Lease, int | None]] = []  # finished, not yet released
        self._releasing: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._warned_at = 0.0

    async def start(self) -> None:
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_loop(), name="ratelimit-renew")

    async def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
        while self._releasing is not None:  # the releases still queued
            await asyncio.gather(self._releasing, return_exceptions=True)
        if self._lean is not None:
            await self._lean.aclose()

    async def admit(self, request_id: str, scopes: Sequence[LimitScope], tokens: int) -> Decision:
        """Decides one request for all ``scopes`` at once; on success the caller must :meth:`finish`."""
        active = tuple(s for s in scopes if s.limits)
        if not active:
            return Decision(True)
        keys: list[str] = []
        args: list[int | str] = [request_id, tokens, self._lease_ms, len(active)]
        for s in active:
            keys.extend(s.keys)
            lim = s.limits
            args.extend((lim.requests_per_minute or 0, lim.tokens_per_minute or 0, lim.max_concurrency or 0))
        try:
            raw = await self._admit(keys=keys, args=args)
        except Exception as exc:  # redis.RedisError, OSError, timeouts: Redis is unavailable
            return self._unavailable(exc)
        headers = _headers(raw)
        reason = int(raw[0])
        if reason:
            retry = 60.0 if reason == DENIED_TOO_LARGE else max(int(raw[1]), 1) / 1000
            return Decision(False, reason, retry, headers)
        lease = Lease(request_id, active, tokens)
        if any(s.limits.max_concurrency for s in active):
            self._held[request_id] = lease
        return Decision(True, 0, 0.0, headers, lease)

    def finish(self, lease: Lease | None, actual_tokens: int | None = None) -> None:
        """Releases the concurrency slot and corrects the token reservation, off the caller's path: the
        releases of one turn of the event loop go to Redis together, by one background task.

        Safe to call from ``finally`` blocks of cancelled tasks: it schedules and never awaits.
        """
        if lease is None:
            return
        self._held.pop(lease.request_id, None)
        self._releases.append((lease, actual_tokens))
        if self._releasing is None:
            self._releasing = asyncio.get_running_loop().create_task(self._release_queued())

    async def _release_queued(self) -> None:
        try:
            while self._releases:
                batch, self._releases = self._releases, []
                await self._release_many(batch)
        finally:
            self._releasing = None

    async def _release_many(self, batch: list[tuple[Lease, int | None]]) -> None:
        calls: list[tuple[list[str], list[int | str]]] = []
        for lease, actual_tokens in batch:
            keys: list[str] = []
            for s in lease.scopes:
                keys.extend(s.keys[1:])
            actual = -1 if actual_tokens is None else max(int(actual_tokens), 0)
            calls.append((keys, [lease.request_id, actual, len(lease.scopes)]))
        for attempt in range(3):
            try:
                if self._lean is not None:
                    replies = await self._finish.many(calls)
                    calls = [c for c, r in zip(calls, replies, strict=True) if isinstance(r, Exception)]
                else:
                    replies = await asyncio.gather(*(self._finish(keys=k, args=a) for k, a in calls),
                                                   return_exceptions=True)
                    calls = [c for c, r in zip(calls, replies, strict=True) if isinstance(r, BaseException)]
                if not calls:
                    return
                raise ConnectionError(f"{len(calls)} releases refused")
            except Exception as exc:  # Redis unavailable: retry briefly; the leases expire anyway
                if attempt == 2:
                    self._warn("could not release rate-limit leases", exc)
                    return
                await asyncio.sleep(0.05 * (attempt + 1))

    async def release(self, lease: Lease, actual_tokens: int | None = None) -> None:
        """Releases one lease now (what :meth:`finish` queues)."""
        await self._release_many([(lease, actual_tokens)])

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every)
            leases = list(self._held.values())
            if not leases:
                continue
            keys: list[str] = []
            args: list[int | str] = [self._lease_ms]
            for lease in leases:
                for s in lease.scopes:
                    if s.limits.max_concurrency:
                        keys.append(s.keys[2])
                        args.append(lease.request_id)
            try:
                for i in range(0, len(keys), 1000):
                    await self._renew(keys=keys[i:i + 1000], args=[args[0], *args[1 + i:1 + i + 1000]])
            except Exception as exc:
                self._warn("could not renew rate-limit leases", exc)

    def _unavailable(self, exc: BaseException) -> Decision:
        self._warn("rate limits are not enforced: Redis is unavailable", exc)
        if self.fail_open:
            return Decision(True)
        return Decision(False, -1, 1.0)

    def _warn(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at > 10:
            self._warned_at = now
            log.warning("%s (%s)", what, type(exc).__name__)


def retry_after_header(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(math.ceil(seconds), 1)), "retry-after-ms": str(max(int(seconds * 1000), 1))}
