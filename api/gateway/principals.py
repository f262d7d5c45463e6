"""Who is calling: API key -> tenant, models and limits, cached in the gateway process.

The hot path never touches Postgres once a key is cached. A lookup costs one HMAC and one dict read;
a miss loads the key, its tenant, the tenant's models and limits in one read-only transaction (in a
worker thread), with one load per key in flight at a time. An entry older than ``ttl`` is served while it
is read again in the background (stale-while-revalidate): a request never waits for Postgres for a key the
process knows, however long the key was idle.

Freshness: every mutation of keys or tenants is announced on Redis
(:data:`baton.core.contracts.INVALIDATION_CHANNEL`); :class:`InvalidationListener` drops the affected
entries in every process within milliseconds. Each invalidation also bumps a generation counter so a
load that raced with it is not cached. If the subscription breaks, the whole cache is dropped once it
is back (messages may have been missed). If Postgres is down, entries past their TTL keep serving
(revocations still arrive through Redis).

Last use: each successful authentication notes the key and the time in memory (a dict write);
:class:`KeyUseRecorder` writes what it noted as ``api_keys.last_used_at`` in one UPDATE every
``gateway.last_used_flush_s``, off the request path, and once more when the gateway stops. A write that
fails is kept and retried with the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from baton.api.gateway.flow import DEFAULT_CLASS, FlowClass
from baton.api.gateway.ratelimit import Limits, LimitScope
from baton.core import errors
from baton.core import models as m
from baton.core.contracts import INVALIDATION_CHANNEL, parse_invalidation
from baton.core.db import Database
from baton.core.secrets import cache_salt, hash_secret, looks_valid

log = logging.getLogger(__name__)

_INVALID_KEY = "Incorrect API key provided. You can find your API key in the Baton console."


@dataclass(frozen=True, slots=True)
class ModelGrant:
    """A catalogue model a key may use."""

    id: uuid.UUID
    name: str
    context_length: int
    source: str
    created: int  # unix seconds, for /v1/models
    kind: str = "generate"  # or "embed"
    auto_tools: bool = False  # the engines have a tool-call parser: `tool_choice: auto` works


@dataclass(frozen=True, slots=True)
class Principal:
    """A key as the gateway sees it. ``models`` is already narrowed by the key's scope."""

    key_id: uuid.UUID
    tenant_id: uuid.UUID
    revoked: bool
    expires_at: float | None  # unix seconds
    tenant_active: bool
    models: Mapping[str, ModelGrant]
    limit_scopes: tuple[LimitScope, ...]
    cache_salt: str
    #: model name -> how its requests are queued (the tenant's effective SLO policy on it); absent: default
    classes: Mapping[str, FlowClass] = field(default_factory=lambda: MappingProxyType({}))
    #: One request's tokens at most (prompt and completion together): the smaller of the tenant's and the
    #: key's ``max_tokens_per_request``; None: only the model's context bounds it.
    max_request_tokens: int | None = None

    def flow_class(self, model: str) -> FlowClass:
        return self.classes.get(model, DEFAULT_CLASS)

    def check(self, now: float) -> None:
        """Raises the client error for a key that may not be used now."""
        if self.revoked or (self.expires_at is not None and self.expires_at <= now):
            raise errors.AuthenticationError(_INVALID_KEY)
        if not self.tenant_active:
            raise errors.PermissionDeniedError(
                "This organization is suspended. Contact your Baton operator.", openai_type="permission_error"
            )

    def model(self, name: str) -> ModelGrant:
        grant = self.models.get(name)
        if grant is None:
            raise ModelNotFoundError(f"The model `{name}` does not exist or you do not have access to it.",
                                     param="model")
        return grant


class ModelNotFoundError(errors.NotFoundError):
    code = "model_not_found"


#: Successors followed from a rotated key to the one whose limits it shares.
MAX_ROTATIONS = 16


def load_principal(db: Database, key_hash: bytes, salt_secret: str) -> Principal | None:
    """Everything the gateway needs about one key, in one system-scope read (None: no such key)."""
    with db.system() as uow:
        key = uow.api_keys.by_hash(key_hash)
        return _principal(uow, key, salt_secret) if key is not None else None


def load_principal_by_id(db: Database, key_id: uuid.UUID, salt_secret: str) -> Principal | None:
    """The principal of the key ``key_id`` (a batch's lines run as the key that created the batch)."""
    with db.system() as uow:
        key = uow.api_keys.get(key_id)
        return _principal(uow, key, salt_secret) if key is not None else None


def _principal(uow: Any, key: m.ApiKey, salt_secret: str) -> Principal:
    tenant = uow.tenants.get(key.tenant_id)
    granted = uow.models.for_tenant(key.tenant_id)
    limits = uow.rate_limits.for_tenant(key.tenant_id)
    scope = set(key.model_scope or ())
    models = {
        g.name: ModelGrant(g.id, g.name, g.context_length, g.source, int(g.created_at.timestamp()), g.kind,
                           bool(g.tool_call_parser))
        for g in granted if not scope or g.name in scope
    }
    classes: dict[str, FlowClass] = {}
    for g in granted:
        if g.name in models:
            policy = uow.slo_assignments.effective(key.tenant_id, g.id)
            if policy is not None:
                classes[g.name] = FlowClass(name=policy.name, priority=policy.priority,
                                            weight=float(policy.weight), sheddable=policy.sheddable,
                                            ttft_ms=policy.ttft_ms, tpot_ms=policy.tpot_ms,
                                            max_wait_s=policy.max_wait_s, max_waiting=policy.max_waiting)
    # A rotated key, while its overlap lasts, counts against its latest successor's limits (one bucket)
    limited = key
    for _ in range(MAX_ROTATIONS):
        nxt = uow.api_keys.get(limited.rotated_to_id) if limited.rotated_to_id not in (None, limited.id) else None
        if nxt is None:
            break
        limited = nxt
    scopes: list[LimitScope] = []
    caps: list[int] = []
    for row in limits:
        lim = Limits(row.requests_per_minute, row.tokens_per_minute, row.max_concurrency)
        if row.api_key_id is None:
            scopes.append(LimitScope.tenant(key.tenant_id, lim))
        elif row.api_key_id == limited.id:
            # the bucket is named after the limit's own row, which a rotation moves to the successor: a
            # rotation never opens a fresh window either
            scopes.append(LimitScope.key(key.tenant_id, row.id, lim))
        else:
            continue
        if row.max_tokens_per_request is not None:
            caps.append(row.max_tokens_per_request)
    return Principal(
        key_id=key.id,
        tenant_id=key.tenant_id,
        revoked=key.revoked_at is not None,
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
        tenant_active=tenant is not None and tenant.status is m.TenantStatus.ACTIVE,
        models=models,
        limit_scopes=tuple(scopes),
        cache_salt=cache_salt(salt_secret, key.tenant_id),
        classes=MappingProxyType(classes),
        max_request_tokens=min(caps, default=None),
    )


def write_key_uses(db: Database, used: Mapping[uuid.UUID, dt.datetime]) -> int:
    """``api_keys.last_used_at`` of many keys in one system-scope UPDATE; returns the rows changed."""
    with db.system() as uow:
        n = uow.api_keys.mark_used(used)
        uow.commit()
    return n


class KeyUseRecorder:
    """Which keys authenticated, and when last, until :meth:`flush` writes them (a background task every
    ``interval_s``, and :meth:`stop`). :meth:`seen` is the only part on the request path."""

    def __init__(self, write: Callable[[Mapping[uuid.UUID, dt.datetime]], int], *, interval_s: float = 5.0) -> None:
        self._write = write
        self.interval_s = interval_s
        self._seen: dict[uuid.UUID, float] = {}
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.failures = 0

    def seen(self, key_id: uuid.UUID, at: float) -> None:
        """Notes a successful authentication (``at``: unix seconds). Never blocks, never raises."""
        self._seen[key_id] = at

    @property
    def pending(self) -> int:
        return len(self._seen)

    async def flush(self) -> bool:
        """Writes what was noted since the last write; False (and kept for the next one) if it failed."""
        if not self._seen:
            return True
        batch, self._seen = self._seen, {}
        used = {k: dt.datetime.fromtimestamp(at, dt.UTC) for k, at in batch.items()}
        try:
            self.written += await asyncio.to_thread(self._write, used)
        except Exception as exc:  # Postgres down or slow: keep the uses, newest time wins
            self.failures += 1
            log.warning("last use of %d keys not written yet (%s); will retry", len(batch), type(exc).__name__)
            for k, at in batch.items():
                if at > self._seen.get(k, 0.0):
                    self._seen[k] = at
            return False
        return True

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="key-last-used")

    async def stop(self) -> None:
        """Stops the loop and writes what is left (one try)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()


_Entry = tuple[Principal | None, float]  # (principal or None for an unknown key, loaded at monotonic)

Loader = Callable[[bytes], Principal | None]


class PrincipalCache:
    """``Authorization`` header -> :class:`Principal`, cached with a TTL and explicit invalidation."""

    def __init__(self, loader: Loader, *, key_secret: str, ttl: float = 30.0, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic, uses: KeyUseRecorder | None = None,
                 secret_check: Callable[[], str | None] | None = None) -> None:
        self._load = loader
        #: Why this process cannot check the database's keys (its key secret is not theirs: a sentence for
        #: the operator), from ``secret_check`` at start and again after an unknown key, at most every
        #: :attr:`secret_recheck_s`; None while it can.
        self.secret_problem: str | None = None
        self._secret_check = secret_check
        self.secret_recheck_s = 30.0
        self._secret_checked = -math.inf
        #: Where successful authentications are noted (None: last use is not recorded).
        self.uses = uses
        self._secret = key_secret
        self.ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: dict[bytes, _Entry] = {}
        self._by_key: dict[uuid.UUID, bytes] = {}
        self._by_tenant: dict[uuid.UUID, set[bytes]] = {}
        self._inflight: dict[bytes, asyncio.Future[Principal | None]] = {}
        self._revalidating: set[asyncio.Task[None]] = set()  # background re-reads (a reference keeps them)
        self.generation = 0

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller's principal, or AuthenticationError / PermissionDeniedError (OpenAI's 401/403)."""
        token = _bearer(authorization)
        if token is None:
            raise errors.AuthenticationError(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
        if not looks_valid(token):
            raise errors.AuthenticationError(_INVALID_KEY)
        key_hash = hash_secret(self._secret, token)
        entry = self._entries.get(key_hash)
        if entry is None or (entry[0] is None and self._clock() - entry[1] > self.ttl):
            principal = await self._refresh(key_hash, entry)
        else:
            principal = entry[0]
            if self._clock() - entry[1] > self.ttl:
                self._revalidate(key_hash, entry)
        if principal is None:
            if await self._secret_mismatch():
                raise errors.KeySecretMismatchError(self.secret_problem or "")
            raise errors.AuthenticationError(_INVALID_KEY)
        now = time.time()
        principal.check(now)
        if self.uses is not None:
            self.uses.seen(principal.key_id, now)
        return principal

    async def start(self) -> None:
        await self._secret_mismatch(force=True)
        if self.uses is not None:
            await self.uses.start()

    async def _secret_mismatch(self, *, force: bool = False) -> bool:
        """Whether this process's key secret is not the one the live keys were made with (checked again at
        most every :attr:`secret_recheck_s`; a failed read keeps the last answer)."""
        if self._secret_check is None:
            return False
        now = self._clock()
        if force or now - self._secret_checked >= self.secret_recheck_s:
            self._secret_checked = now
            try:
                problem = await asyncio.to_thread(self._secret_check)
            except Exception as exc:  # Postgres down: keys are checked as before, the answer waits
                log.warning("key secret not compared with the keys' (%s)", type(exc).__name__)
            else:
                if problem is not None and problem != self.secret_problem:
                    log.error("API keys cannot be checked: %s", problem)
                elif problem is None and self.secret_problem is not None:
                    log.info("the key secret matches the live keys again")
                self.secret_problem = problem
        return self.secret_problem is not None

    async def stop(self) -> None:
        """Writes the last uses still in memory."""
        if self.uses is not None:
            await self.uses.stop()

    def _revalidate(self, key_hash: bytes, stale: _Entry) -> None:
        """Re-reads a known key past its TTL in the background while the request goes on with what the cache
        holds (stale-while-revalidate: no request waits for Postgres for a key it knows; what changed
        unannounced is seen by the next request, what was announced on Redis was dropped already)."""
        if key_hash in self._inflight:
            return
        task = asyncio.get_running_loop().create_task(self._refresh_quietly(key_hash, stale))
        self._revalidating.add(task)
        task.add_done_callback(self._revalidating.discard)

    async def _refresh_quietly(self, key_hash: bytes, stale: _Entry) -> None:
        try:
            await self._refresh(key_hash, stale)
        except Exception as exc:  # Postgres away: the stale entry stays, the next request tries again
            log.debug("key re-read failed (%s)", type(exc).__name__)

    async def _refresh(self, key_hash: bytes, stale: _Entry | None) -> Principal | None:
        fut = self._inflight.get(key_hash)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key_hash] = fut
        generation = self.generation
        try:
            principal = await asyncio.to_thread(self._load, key_hash)
        except errors.UnavailableError as exc:
            if stale is not None and stale[0] is not None and generation == self.generation:
                # Postgres is down: keep serving what we knew (revocations still arrive via Redis).
                fut.set_result(stale[0])
                return stale[0]
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else errors.UnavailableError())
            fut.exception()
            raise
        finally:
            self._inflight.pop(key_hash, None)
        if generation == self.generation:
            self._store(key_hash, principal)
        fut.set_result(principal)
        return principal

    def _store(self, key_hash: bytes, principal: Principal | None) -> None:
        if len(self._entries) >= self._max:
            self.clear()
        self._entries[key_hash] = (principal, self._clock())
        if principal is not None:
            self._by_key[principal.key_id] = key_hash
            self._by_tenant.setdefault(principal.tenant_id, set()).add(key_hash)

    def invalidate_key(self, key_id: uuid.UUID) -> None:
        self.generation += 1
        key_hash = self._by_key.pop(key_id, None)
        if key_hash is not None:
            entry = self._entries.pop(key_hash, None)
            if entry is not None and entry[0] is not None:
                self._by_tenant.get(entry[0].tenant_id, set()).discard(key_hash)

    def invalidate_tenant(self, tenant_id: uuid.UUID) -> None:
        self.generation += 1
        for key_hash in self._by_tenant.pop(tenant_id, set()):
            entry = self._entries.pop(key_hash, None)
            if entry is not None and entry[0] is not None:
                self._by_key.pop(entry[0].key_id, None)

    def clear(self) -> None:
        self.generation += 1
        self._entries.clear()
        self._by_key.clear()
        self._by_tenant.clear()

    def apply(self, message: bytes | str) -> None:
        """Applies one invalidation message (:func:`baton.core.contracts.parse_invalidation`)."""
        parsed = parse_invalidation(message)
        if parsed is None:
            log.warning("ignored a malformed cache invalidation; dropping the whole cache instead")
            self.clear()
            return
        kind, id_ = parsed
        if kind == "key" and id_ is not None:
            self.invalidate_key(id_)
        elif kind == "tenant" and id_ is not None:
            self.invalidate_tenant(id_)
        else:
            self.clear()


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class InvalidationListener:
    """Subscribes to the invalidation channel and applies every message to a :class:`PrincipalCache`."""

    def __init__(self, redis: Any, cache: PrincipalCache, *, on_message: Callable[[], None] | None = None) -> None:
        self._redis = redis
        self._cache = cache
        self._task: asyncio.Task[None] | None = None
        self._on_message = on_message
        self.subscribed = asyncio.Event()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="key-invalidation")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(INVALIDATION_CHANNEL)
                # Anything published while we were not listening is lost: start from a clean cache.
                self._cache.clear()
                self.subscribed.set()
                backoff = 0.1
                while True:
                    msg = await pubsub.get_message(timeout=5.0)
                    if msg is not None and msg.get("type") == "message":
                        self._cache.apply(msg["data"])
                        if self._on_message is not None:
                            self._on_message()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost: retry with backoff
                self.subscribed.clear()
                log.warning("key invalidation channel lost (%s); reconnecting", type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):  # already broken (or stuck): nothing left to clean up
                    await asyncio.wait_for(pubsub.aclose(), timeout=2.0)

