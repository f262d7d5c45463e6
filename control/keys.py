"""Tenant API keys: issue, list, revoke, rotate with an overlap window, authenticate.

The secret is returned once, by :meth:`KeyService.issue` and :meth:`KeyService.rotate`; the database
keeps only its HMAC-SHA256 (with ``security.key_secret``) and its visible prefix. Every mutation is
written to the audit log in the same transaction and, after the commit, announced on Redis
(:data:`baton.core.contracts.INVALIDATION_CHANNEL`) so that every gateway process drops its cached copy at once.

Other parts of the control plane that change what a gateway caches about a tenant (suspension, model
grants, rate limits) announce it the same way with :func:`publish_invalidation` (kind ``"tenant"``).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import redis

from baton.control.roles import TenantAction, authorize
from baton.core import errors
from baton.core import models as m
from baton.core.contracts import INVALIDATION_CHANNEL, InvalidationKind, invalidation_message
from baton.core.db import Database
from baton.core.secrets import (
    hash_secret,
    looks_valid,
    new_secret,
    secret_fingerprint,
    secret_mismatch,
    visible_prefix,
)
from baton.core.settings import Settings

log = logging.getLogger(__name__)

KeyState = Literal["active", "expiring", "expired", "revoked"]

KeyKind = Literal["standard", "playground"]


def publish_invalidation(redis_client: object, kind: InvalidationKind, id_: uuid.UUID | None = None) -> bool:
    """Tells every gateway process to drop what it caches about a key, a tenant or everything.

    ``redis_client`` is a synchronous ``redis.Redis``. Returns False (and logs) when Redis cannot be
    reached: the change is committed regardless, and gateways pick it up when their cache entry expires.
    """
    try:
        redis_client.publish(INVALIDATION_CHANNEL, invalidation_message(kind, id_))  # type: ignore[attr-defined]
    except Exception as exc:  # redis errors and OSError alike; the change itself is already committed
        log.warning("could not publish a gateway cache invalidation (%s); caches expire on their own",
                    type(exc).__name__)
        return False
    return True


class KeyEvents(Protocol):
    """Where key changes are announced after they are committed."""

    def key_changed(self, key_id: uuid.UUID) -> None: ...


class RedisKeyEvents:
    """Announces key changes on :data:`INVALIDATION_CHANNEL`."""

    def __init__(self, redis_client: object) -> None:
        self._redis = redis_client

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisKeyEvents:
        return cls(redis.Redis.from_url(settings.redis.url, socket_timeout=2, socket_connect_timeout=2))

    def key_changed(self, key_id: uuid.UUID) -> None:
        publish_invalidation(self._redis, "key", key_id)


class NoKeyEvents:
    def key_changed(self, key_id: uuid.UUID) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ApiKeyView:
    """What may be shown about a key: never its secret or hash."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    prefix: str
    model_scope: tuple[str, ...]
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    rotated_to_id: uuid.UUID | None
    created_by: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    kind: KeyKind = "standard"

    @classmethod
    def of(cls, row: m.ApiKey) -> ApiKeyView:
        return cls(
            id=row.id, tenant_id=row.tenant_id, name=row.name, prefix=row.prefix,
            model_scope=tuple(row.model_scope or ()), expires_at=row.expires_at, revoked_at=row.revoked_at,
            rotated_to_id=row.rotated_to_id, created_by=row.created_by, created_at=row.created_at,
            last_used_at=row.last_used_at,
            kind="playground" if row.kind is m.KeyKind.PLAYGROUND else "standard",
        )

    def live(self, now: dt.datetime | None = None) -> bool:
        """Works now: not revoked and not expired (a rotated key works until its overlap ends)."""
        return self.state(now) in ("active", "expiring")

    def state(self, now: dt.datetime | None = None) -> KeyState:
        now = now or dt.datetime.now(dt.UTC)
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        if self.rotated_to_id is not None or self.expires_at is not None:
            return "expiring"
        return "active"

    def audit_form(self) -> dict[str, object]:
        return {
            "name": self.name, "prefix": self.prefix, "model_scope": list(self.model_scope),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "rotated_to_id": str(self.rotated_to_id) if self.rotated_to_id else None, "kind": self.kind,
        }


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A new key and its secret. The secret exists only here: show it once, keep it nowhere."""

    key: ApiKeyView
    secret: str


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Who a valid secret belongs to."""

    key_id: uuid.UUID
    tenant_id: uuid.UUID
    model_scope: tuple[str, ...]
    expires_at: dt.datetime | None


class KeyService:
    """Every operation on tenant API keys. Tenant-facing operations run in the tenant's scope."""

    def __init__(self, db: Database, settings: Settings, *, events: KeyEvents | None = None) -> None:
        self._db = db
        self._secret = settings.security.key_secret.get_secret_value()
        self.fingerprint = secret_fingerprint(self._secret)
        self._events: KeyEvents = events or NoKeyEvents()

    def hash(self, secret: str) -> bytes:
        return hash_secret(self._secret, secret)

    def check_secret(self) -> None:
        """Refuses (:class:`errors.KeySecretMismatchError`) to mint a key when the live keys were all made with
        another key secret: every gateway that checks those keys has that secret, so it would refuse a key
        made with this one. With no live key of a known secret, any secret may begin."""
        problem = secret_mismatch(self._db, self.fingerprint)
        if problem is not None:
            raise errors.KeySecretMismatchError(problem + " No key was made.")

    def issue(
        self,
        *,
        tenant_id: uuid.UUID,
        name: str,
        created_by: str,
        model_scope: Sequence[str] = (),
        expires_at: dt.datetime | None = None,
        role: m.UserRole | None = None,
    ) -> IssuedKey:
        """Creates a key for ``tenant_id``. ``model_scope`` (empty: all the tenant's models) must name
        models granted to the tenant. ``role``: the caller's role inside the tenant (a console user), None
        for an operator (:mod:`baton.control.roles`)."""
        authorize(role, TenantAction.MANAGE_KEYS)
        name = name.strip()
        if not name or len(name) > 100:
            raise errors.ValidationError("A key name is 1 to 100 characters.", param="name")
        _check_expiry(expires_at)
        scope = _normalise_scope(model_scope)
        self.check_secret()
        secret = new_secret()
        with self._db.tenant(tenant_id) as uow:
            tenant = uow.tenants.require(tenant_id)
            _check_scope(uow.models.for_tenant(tenant.id), scope)
            row = uow.api_keys.add(m.ApiKey(
                tenant_id=tenant_id, name=name, prefix=visible_prefix(secret), key_hash=self.hash(secret),
                model_scope=list(scope), expires_at=expires_at, created_by=created_by,
                secret_fingerprint=self.fingerprint,
            ))
            view = ApiKeyView.of(row)
            uow.audit.record(actor=created_by, action="api_key.create", target_type="api_key",
                             target_id=str(row.id), tenant_id=tenant_id, after=view.audit_form())
            uow.commit()
        return IssuedKey(key=view, secret=secret)

    def issue_playground(self, *, tenant_id: uuid.UUID, created_by: str, model: str,
                         ttl: dt.timedelta, role: m.UserRole | None = None) -> IssuedKey:
        """A key for one model that expires after ``ttl``, for the console's playground. A console user
        has at most one unrevoked playground key: the previous one is revoked in the same transaction
        (and every gateway is told)."""
        authorize(role, TenantAction.USE_PLAYGROUND)
        scope = _normalise_scope([model])
        if len(scope) != 1:
            raise errors.ValidationError("Name the model to try.", param="model")
        if ttl <= dt.timedelta(0):
            raise errors.ValidationError("A playground key must expire in the future.", param="ttl")
        self.check_secret()
        now = dt.datetime.now(dt.UTC)
        secret = new_secret()
        with self._db.tenant(tenant_id) as uow:
            tenant = uow.tenants.require(tenant_id)
            _check_scope(uow.models.for_tenant(tenant.id), scope)
            replaced = []
            for old in uow.api_keys.unrevoked_playground(tenant_id, created_by):
                before = ApiKeyView.of(old).audit_form()
                old.revoked_at = now
                uow.flush()
                uow.audit.record(actor=created_by, action="api_key.revoke", target_type="api_key",
                                 target_id=str(old.id), tenant_id=tenant_id, before=before,
                                 after=ApiKeyView.of(old).audit_form())
                replaced.append(old.id)
            row = uow.api_keys.add(m.ApiKey(
                tenant_id=tenant_id, name=f"playground-{secrets.token_hex(4)}", prefix=visible_prefix(secret),
                key_hash=self.hash(secret), model_scope=list(scope), expires_at=now + ttl, created_by=created_by,
                kind=m.KeyKind.PLAYGROUND, secret_fingerprint=self.fingerprint,
            ))
            view = ApiKeyView.of(row)
            uow.audit.record(actor=created_by, action="api_key.create", target_type="api_key",
                             target_id=str(row.id), tenant_id=tenant_id, after=view.audit_form())
            uow.commit()
        for key_id in replaced:
            self._events.key_changed(key_id)
        return IssuedKey(key=view, secret=secret)

    def list(self, *, tenant_id: uuid.UUID, include_revoked: bool = False) -> list[ApiKeyView]:
        with self._db.tenant(tenant_id) as uow:
            uow.tenants.require(tenant_id)
            rows = uow.api_keys.for_tenant(tenant_id, include_revoked=include_revoked)
            return [ApiKeyView.of(r) for r in rows]

    def get(self, *, tenant_id: uuid.UUID, key_id: uuid.UUID) -> ApiKeyView:
        with self._db.tenant(tenant_id) as uow:
            return ApiKeyView.of(_require_key(uow, tenant_id, key_id))

    def revoke(self, *, tenant_id: uuid.UUID, key_id: uuid.UUID, actor: str,
               role: m.UserRole | None = None) -> ApiKeyView:
        """Revokes a key at once. Revoking a revoked key changes nothing and is not an error."""
        authorize(role, TenantAction.MANAGE_KEYS)
        with self._db.tenant(tenant_id) as uow:
            row = _require_key(uow, tenant_id, key_id)
            if row.revoked_at is not None:
                return ApiKeyView.of(row)
            before = ApiKeyView.of(row).audit_form()
            row.revoked_at = dt.datetime.now(dt.UTC)
            uow.flush()
            view = ApiKeyView.of(row)
            uow.audit.record(actor=actor, action="api_key.revoke", target_type="api_key", target_id=str(row.id),
                             tenant_id=tenant_id, before=before, after=view.audit_form())
            uow.commit()
        self._events.key_changed(key_id)
        return view

    def rotate(
        self, *, tenant_id: uuid.UUID, key_id: uuid.UUID, actor: str, overlap: dt.timedelta = dt.timedelta(hours=24),
        role: m.UserRole | None = None,
    ) -> IssuedKey:
        """Issues a successor with the same name, scope, expiry and rate limits; the old key keeps working for
        ``overlap`` (then expires), so clients can switch without downtime, and shares the successor's limits
        meanwhile. ``overlap`` 0 ends it now."""
        authorize(role, TenantAction.MANAGE_KEYS)
        if overlap < dt.timedelta(0):
            raise errors.ValidationError("The overlap cannot be negative.", param="overlap")
        self.check_secret()
        now = dt.datetime.now(dt.UTC)
        secret = new_secret()
        with self._db.tenant(tenant_id) as uow:
            old = _require_key(uow, tenant_id, key_id)
            if old.revoked_at is not None or old.rotated_to_id is not None:
                raise errors.ConflictError("Only a live key that has not been rotated yet can be rotated.")
            if old.expires_at is not None and old.expires_at <= now:
                raise errors.ConflictError("This key has expired; issue a new one.")
            before = ApiKeyView.of(old).audit_form()
            # The old key gives its name up (the live-name index skips rotated keys) before the new one
            # takes it; a self-reference first, then the real successor once it has an id.
            old.rotated_to_id = old.id
            original_expiry = old.expires_at
            old_end = now + overlap
            old.expires_at = min(original_expiry, old_end) if original_expiry else old_end
            uow.flush()
            new = uow.api_keys.add(m.ApiKey(
                tenant_id=tenant_id, name=old.name, prefix=visible_prefix(secret), key_hash=self.hash(secret),
                model_scope=list(old.model_scope or ()), expires_at=original_expiry, created_by=actor,
                secret_fingerprint=self.fingerprint,
            ))
            old.rotated_to_id = new.id
            uow.flush()
            # the key's own limits are the successor's now, and the old key, while it still works, counts
            # against them too (the gateway follows rotated_to_id): rotating never lifts a limit
            uow.rate_limits.move_to_key(old.id, new.id)
            view = ApiKeyView.of(new)
            uow.audit.record(actor=actor, action="api_key.rotate", target_type="api_key", target_id=str(old.id),
                             tenant_id=tenant_id, before=before, after=ApiKeyView.of(old).audit_form())
            uow.audit.record(actor=actor, action="api_key.create", target_type="api_key", target_id=str(new.id),
                             tenant_id=tenant_id, after=view.audit_form())
            uow.commit()
        self._events.key_changed(key_id)
        return IssuedKey(key=view, secret=secret)

    def authenticate(self, secret: str, *, now: dt.datetime | None = None) -> KeyIdentity:
        """The identity behind a secret, or :class:`AuthenticationError` (same message for every failure:
        unknown, malformed, revoked, expired, suspended tenant)."""
        if not looks_valid(secret):
            raise errors.AuthenticationError("Incorrect API key provided.")
        now = now or dt.datetime.now(dt.UTC)
        with self._db.system() as uow:
            row = uow.api_keys.by_hash(self.hash(secret))
            if row is None or row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= now):
                raise errors.AuthenticationError("Incorrect API key provided.")
            tenant = uow.tenants.get(row.tenant_id)
            if tenant is None or tenant.status is not m.TenantStatus.ACTIVE:
                raise errors.AuthenticationError("Incorrect API key provided.")
            return KeyIdentity(key_id=row.id, tenant_id=row.tenant_id, model_scope=tuple(row.model_scope or ()),
                               expires_at=row.expires_at)


def _require_key(uow: object, tenant_id: uuid.UUID, key_id: uuid.UUID) -> m.ApiKey:
    row: m.ApiKey | None = uow.api_keys.get(key_id)  # type: ignore[attr-defined]
    if row is None or row.tenant_id != tenant_id:
        raise errors.NotFoundError(f"No API key with id {key_id}.")
    return row


def _check_expiry(expires_at: dt.datetime | None) -> None:
    if expires_at is None:
        return
    if expires_at.tzinfo is None:
        raise errors.ValidationError("expires_at needs a time zone.", param="expires_at")
    if expires_at <= dt.datetime.now(dt.UTC):
        raise errors.ValidationError("expires_at must be in the future.", param="expires_at")


def _normalise_scope(model_scope: Sequence[str]) -> tuple[str, ...]:
    if isinstance(model_scope, str):
        raise errors.ValidationError("model_scope is a list of model names.", param="model_scope")
    return tuple(sorted({s.strip() for s in model_scope if s.strip()}))


def _check_scope(granted: Sequence[m.Model], scope: tuple[str, ...]) -> None:
    names = {g.name for g in granted}
    missing = [s for s in scope if s not in names]
    if missing:
        raise errors.ValidationError(
            f"The tenant has no access to: {', '.join(missing[:5])}.", param="model_scope"
        )
