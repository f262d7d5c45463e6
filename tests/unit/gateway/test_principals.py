"""PrincipalCache with an in-memory loader (the Postgres loader has its integration tests)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable

import pytest

from baton.api.gateway.principals import ModelGrant, Principal, PrincipalCache
from baton.core import errors
from baton.core.contracts import invalidation_message
from baton.core.secrets import hash_secret, new_secret

SECRET = "unit-secret"


def _principal(**kw: object) -> Principal:
    base: dict[str, object] = dict(
        key_id=uuid.uuid4(), tenant_id=uuid.uuid4(), revoked=False, expires_at=None, tenant_active=True,
        models={"m": ModelGrant(uuid.uuid4(), "m", 100, "/x", 0)}, limit_scopes=(), cache_salt="s")
    base.update(kw)
    return Principal(**base)  # type: ignore[arg-type]


class Loader:
    def __init__(self) -> None:
        self.rows: dict[bytes, Principal | None] = {}
        self.calls = 0
        self.down = False

    def __call__(self, key_hash: bytes) -> Principal | None:
        self.calls += 1
        if self.down:
            raise errors.UnavailableError()
        return self.rows.get(key_hash)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _setup() -> tuple[PrincipalCache, Loader, Clock, str, Principal]:
    loader, clock = Loader(), Clock()
    cache = PrincipalCache(loader, key_secret=SECRET, ttl=10, clock=clock)
    secret = new_secret()
    principal = _principal()
    loader.rows[hash_secret(SECRET, secret)] = principal
    return cache, loader, clock, f"Bearer {secret}", principal


async def _until(done: Callable[[], bool]) -> None:
    """Lets the event loop and the cache's worker threads run until ``done()`` (at most a second)."""
    for _ in range(100):
        if done():
            return
        await asyncio.sleep(0.01)


def test_lookups_are_cached_and_reread_in_the_background_past_the_ttl() -> None:
    cache, loader, clock, header, principal = _setup()

    async def go() -> None:
        assert await cache.authenticate(header) is principal
        assert await cache.authenticate(header) is principal
        assert loader.calls == 1
        changed = _principal(key_id=principal.key_id, tenant_id=principal.tenant_id, cache_salt="new")
        loader.rows[next(iter(loader.rows))] = changed
        clock.now = 11
        assert await cache.authenticate(header) is principal  # past the TTL: answered from the cache ...
        await _until(lambda: loader.calls == 2)  # ... while the key is read again in a worker thread
        assert loader.calls == 2
        assert await cache.authenticate(header) is changed
        assert loader.calls == 2

    asyncio.run(go())


class GatedLoader(Loader):
    """A loader whose reads after the first block until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def __call__(self, key_hash: bytes) -> Principal | None:
        if self.calls >= 1:
            self.gate.wait(5)
        return super().__call__(key_hash)


def test_a_request_past_the_ttl_never_waits_for_the_database() -> None:
    """The re-read of a known key blocks in its worker thread; the requests are answered meanwhile, and the
    key is read once however many requests came past the TTL."""
    loader, clock = GatedLoader(), Clock()
    cache = PrincipalCache(loader, key_secret=SECRET, ttl=10, clock=clock)
    secret, principal = new_secret(), _principal()
    loader.rows[hash_secret(SECRET, secret)] = principal
    header = f"Bearer {secret}"

    async def go() -> None:
        assert await cache.authenticate(header) is principal
        clock.now = 11
        try:
            answers = await asyncio.wait_for(asyncio.gather(*[cache.authenticate(header) for _ in range(5)]), 2)
            assert all(a is principal for a in answers)
            assert len(cache._inflight) == 1
        finally:
            loader.gate.set()
        await _until(lambda: not cache._inflight)
        assert loader.calls == 2

    asyncio.run(go())


def test_concurrent_misses_load_once() -> None:
    cache, loader, _, header, _ = _setup()

    async def go() -> None:
        await asyncio.gather(*[cache.authenticate(header) for _ in range(20)])

    asyncio.run(go())
    assert loader.calls == 1


def test_bad_headers_never_reach_the_loader() -> None:
    cache, loader, *_ = _setup()

    async def go() -> None:
        good = new_secret()
        bad_checksum = good[:-1] + ("x" if good[-1] != "x" else "y")
        for header in (None, "", "Basic abc", "Bearer ", "Bearer sk-123", "Bearer " + bad_checksum):
            with pytest.raises(errors.AuthenticationError):
                await cache.authenticate(header)

    asyncio.run(go())
    assert loader.calls == 0


def test_invalidation_drops_keys_and_tenants() -> None:
    cache, loader, _, header, principal = _setup()

    async def go() -> None:
        await cache.authenticate(header)
        key_hash = next(iter(loader.rows))
        loader.rows[key_hash] = _principal(key_id=principal.key_id, tenant_id=principal.tenant_id, revoked=True)
        cache.apply(invalidation_message("key", principal.key_id))
        with pytest.raises(errors.AuthenticationError):
            await cache.authenticate(header)
        loader.rows[key_hash] = _principal(key_id=principal.key_id, tenant_id=principal.tenant_id,
                                           tenant_active=False)
        cache.apply(invalidation_message("tenant", principal.tenant_id))
        with pytest.raises(errors.PermissionDeniedError):
            await cache.authenticate(header)
        loader.rows[key_hash] = principal
        cache.apply(b"not json")  # unreadable: forget everything rather than keep stale entries
        assert loader.calls == 3
        assert await cache.authenticate(header) is principal
        assert loader.calls == 4

    asyncio.run(go())


def test_expired_keys_are_refused_from_the_cache() -> None:
    cache, loader, _, header, _ = _setup()
    loader.rows[next(iter(loader.rows))] = _principal(expires_at=1.0)

    async def go() -> None:
        with pytest.raises(errors.AuthenticationError):
            await cache.authenticate(header)

    asyncio.run(go())


def test_postgres_down_keeps_serving_what_was_known() -> None:
    cache, loader, clock, header, principal = _setup()
    other = f"Bearer {new_secret()}"

    async def go() -> None:
        await cache.authenticate(header)
        loader.down = True
        clock.now = 100
        assert await cache.authenticate(header) is principal
        with pytest.raises(errors.UnavailableError):
            await cache.authenticate(other)

    asyncio.run(go())


def test_a_load_racing_an_invalidation_is_not_cached() -> None:
    cache, loader, _, header, principal = _setup()

    async def go() -> None:
        first = asyncio.create_task(cache.authenticate(header))
        await asyncio.sleep(0)  # the load is now running in a worker thread
        cache.invalidate_key(principal.key_id)  # published while the load was in flight
        await first
        await cache.authenticate(header)
        assert loader.calls == 2  # the racing result was not kept

    asyncio.run(go())
