"""RateLimiter against real Redis: exact under concurrency, token reservations corrected, leases heal."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from baton.api.gateway.ratelimit import (
    DENIED_CONCURRENCY,
    DENIED_REQUESTS,
    DENIED_TOKENS,
    DENIED_TOO_LARGE,
    Limits,
    LimitScope,
    RateLimiter,
)
from baton.core.settings import Settings


@pytest.fixture()
def run(settings: Settings) -> Iterator[object]:
    """Runs a coroutine factory f(limiter, redis) on a fresh loop with a fresh Redis client."""

    def runner(fn, *, lease_s: float = 30.0):  # type: ignore[no-untyped-def]
        async def main():  # type: ignore[no-untyped-def]
            client = aioredis.Redis.from_url(settings.redis.url)
            limiter = RateLimiter(client, lease_s=lease_s)
            await limiter.start()
            try:
                return await fn(limiter, client)
            finally:
                await limiter.stop()
                await client.aclose()

        return asyncio.run(main())

    yield runner


def _scopes(**limits: int) -> tuple[uuid.UUID, list[LimitScope]]:
    tid = uuid.uuid4()
    return tid, [LimitScope.key(tid, uuid.uuid4(), Limits(limits.get("rpm"), limits.get("tpm"),
                                                           limits.get("concurrency")))]


def test_a_burst_admits_exactly_the_limit_across_limiters(run, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(rpm=60)

    async def burst(limiter: RateLimiter, client: aioredis.Redis) -> list[bool]:
        other = RateLimiter(aioredis.Redis.from_url(settings.redis.url))  # a second "process"
        decisions = await asyncio.gather(*[
            (limiter if i % 2 else other).admit(uuid.uuid4().hex, scopes, 1) for i in range(150)
        ])
        await other._redis.aclose()
        return [d.allowed for d in decisions]

    allowed = run(burst)
    assert allowed.count(True) == 60


def test_tenant_and_key_limits_both_apply(run) -> None:  # type: ignore[no-untyped-def]
    tid = uuid.uuid4()
    tenant = LimitScope.tenant(tid, Limits(requests_per_minute=5))
    key_a = LimitScope.key(tid, uuid.uuid4(), Limits(requests_per_minute=3))
    key_b = LimitScope.key(tid, uuid.uuid4(), Limits(requests_per_minute=100))

    async def go(limiter: RateLimiter, _: aioredis.Redis) -> tuple[list[bool], list[bool]]:
        a = [(await limiter.admit(uuid.uuid4().hex, [tenant, key_a], 1)).allowed for _ in range(4)]
        b = [(await limiter.admit(uuid.uuid4().hex, [tenant, key_b], 1)).allowed for _ in range(4)]
        return a, b

    a, b = run(go)
    assert a == [True, True, True, False]
    assert b == [True, True, False, False]  # the tenant's 5 are spent: 3 by key A, 2 by key B


def test_denials_say_why_and_when_to_retry(run) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(rpm=1, tpm=100)

    async def go(limiter: RateLimiter, _: aioredis.Redis):  # type: ignore[no-untyped-def]
        first = await limiter.admit(uuid.uuid4().hex, scopes, 10)
        second = await limiter.admit(uuid.uuid4().hex, scopes, 10)
        huge = await limiter.admit(uuid.uuid4().hex, scopes, 1000)
        return first, second, huge

    first, second, huge = run(go)
    assert first.allowed and first.headers["x-ratelimit-remaining-requests"] == "0"
    assert first.headers["x-ratelimit-remaining-tokens"] == "90"
    assert not second.allowed and second.reason == DENIED_REQUESTS and 1 <= second.retry_after_s <= 60
    assert not huge.allowed and huge.reason == DENIED_TOO_LARGE


def test_token_reservations_are_corrected_to_real_usage(run) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(tpm=1000)

    async def go(limiter: RateLimiter, _: aioredis.Redis) -> list[int]:
        out = []
        first = await limiter.admit(uuid.uuid4().hex, scopes, 900)
        blocked = await limiter.admit(uuid.uuid4().hex, scopes, 200)
        out.append(blocked.reason)
        await limiter.release(first.lease, actual_tokens=50)  # type: ignore[arg-type]
        after = await limiter.admit(uuid.uuid4().hex, scopes, 200)
        out.append(after.reason)
        out.append(int(after.headers["x-ratelimit-remaining-tokens"]))
        return out

    assert run(go) == [DENIED_TOKENS, 0, 750]


def test_concurrency_slots_are_released_and_leases_of_dead_processes_expire(run, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(concurrency=2)

    async def go(limiter: RateLimiter, _: aioredis.Redis) -> list[int]:
        a = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        b = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        c = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        limiter.finish(a.lease, 1)
        await asyncio.sleep(0.1)
        d = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        # A "dead process": it admitted, never finishes and never renews. Its lease expires.
        dead = RateLimiter(aioredis.Redis.from_url(settings.redis.url), lease_s=0.3)
        limiter.finish(b.lease, 1)
        limiter.finish(d.lease, 1)
        await asyncio.sleep(0.1)
        e = await dead.admit(uuid.uuid4().hex, scopes, 1)
        f = await dead.admit(uuid.uuid4().hex, scopes, 1)
        g = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        await asyncio.sleep(0.5)
        h = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        await dead._redis.aclose()
        return [x.reason for x in (a, b, c, d, e, f, g, h)]

    assert run(go) == [0, 0, DENIED_CONCURRENCY, 0, 0, 0, DENIED_CONCURRENCY, 0]


def test_running_requests_keep_their_slot_past_the_lease(run) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(concurrency=1)

    async def go(limiter: RateLimiter, _: aioredis.Redis) -> list[int]:
        a = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        await asyncio.sleep(0.8)  # > lease: renewed in the background meanwhile
        b = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        limiter.finish(a.lease)
        await asyncio.sleep(0.1)
        c = await limiter.admit(uuid.uuid4().hex, scopes, 1)
        return [a.reason, b.reason, c.reason]

    assert run(go, lease_s=0.3) == [0, DENIED_CONCURRENCY, 0]


def test_releases_queued_together_free_every_slot_and_correct_every_reservation(run) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(tpm=100_000, concurrency=20)

    async def go(limiter: RateLimiter, client: aioredis.Redis) -> tuple[int, list[bool], int]:
        first = await asyncio.gather(*(limiter.admit(uuid.uuid4().hex, scopes, 1000) for _ in range(20)))
        full = await limiter.admit(uuid.uuid4().hex, scopes, 1000)
        for i, d in enumerate(first):
            limiter.finish(d.lease, i)  # one turn of the loop: released together, by one task
        while limiter._releasing is not None:  # noqa: ASYNC110 - the queue's own task; no event to wait on
            await asyncio.sleep(0.01)
        again = await asyncio.gather(*(limiter.admit(uuid.uuid4().hex, scopes, 1) for _ in range(20)))
        return full.reason, [d.allowed for d in again], int(await client.hget(scopes[0].keys[1], ":sum"))

    reason, again, used = run(go)
    assert reason == DENIED_CONCURRENCY and all(again)
    assert used == sum(range(20)) + 20  # each reservation corrected to what it used, plus the 20 new ones


def test_redis_down_fails_open_by_default(run) -> None:  # type: ignore[no-untyped-def]
    _, scopes = _scopes(rpm=1)

    async def go(_: RateLimiter, __: aioredis.Redis) -> tuple[bool, bool]:
        down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
        open_ = await RateLimiter(down).admit("x", scopes, 1)
        closed = await RateLimiter(down, fail_open=False).admit("y", scopes, 1)
        await down.aclose()
        return open_.allowed, closed.allowed

    assert run(go) == (True, False)




def test_the_limiter_runs_its_scripts_over_the_lean_connection(run) -> None:  # type: ignore[no-untyped-def]
    async def go(limiter: RateLimiter, client: aioredis.Redis) -> None:
        assert limiter._lean is not None  # a plain TCP client is reproduced
        _, scopes = _scopes(rpm=2, tpm=1000, concurrency=5)
        decisions = await asyncio.gather(*(limiter.admit(uuid.uuid4().hex, scopes, 100) for _ in range(3)))
        assert sorted(d.allowed for d in decisions) == [False, True, True]  # pipelined, answered in order
        lease = next(d.lease for d in decisions if d.allowed)
        await limiter.release(lease, 40)
        assert int(await client.hget(scopes[0].keys[1], ":sum")) == 140  # the reservation corrected to what was used

    run(go)


def test_a_script_redis_has_not_seen_is_sent_whole_once() -> None:
    from baton.api.gateway.redis_client import lean_scripts

    async def go() -> tuple[object, object]:
        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
        lean = lean_scripts(client)
        assert lean is not None
        script = lean.script(f"return {{ARGV[1], '{uuid.uuid4().hex}'}}")  # unknown to the server: NOSCRIPT
        try:
            first = await script(keys=[], args=[7])
            second = await script(keys=[], args=[8])
            return first, second
        finally:
            await lean.aclose()
            await client.aclose()

    first, second = asyncio.run(go())
    assert first[0] == b"7" and second[0] == b"8"  # type: ignore[index]


def test_a_lean_connection_to_a_dead_redis_fails_like_redis_py() -> None:
    from baton.api.gateway.redis_client import LeanScripts

    async def go() -> None:
        lean = LeanScripts(host="127.0.0.1", port=1, connect_timeout_s=0.2)
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            await lean.script("return 1")(keys=[], args=[])

    asyncio.run(go())
