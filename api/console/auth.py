"""Console sign-in: argon2 passwords, server-side sessions, CSRF tokens and login throttling.

A session is a random token in an HttpOnly, SameSite=Strict cookie (Secure when
``security.secure_cookies``); the ``console_sessions`` row keeps only its HMAC-SHA256 (with
``security.session_secret``), so a leaked table opens nothing. Each session has its own CSRF token,
which the front end reads from ``GET /console/api/session`` and sends back in the ``X-CSRF-Token``
header on every mutating request; the server compares it with the session's in constant time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from baton.control.audit import snapshot
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database
from baton.core.passwords import hash_password

log = logging.getLogger(__name__)

COOKIE_NAME = "baton_console"
CSRF_HEADER = "x-csrf-token"

_hasher = PasswordHasher()
# Verified against when the email is unknown, so that a wrong email costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash("baton-console-dummy-password")


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


@dataclass(frozen=True, slots=True)
class ConsoleUser:
    """Who a console request comes from."""

    session_id: uuid.UUID
    user_id: uuid.UUID
    email: str
    role: m.UserRole
    tenant_id: uuid.UUID | None
    csrf_token: str

    @property
    def is_operator(self) -> bool:
        return self.role is m.UserRole.OPERATOR

    @property
    def actor(self) -> str:
        return f"console:{self.email}"


@dataclass(frozen=True, slots=True)
class Account:
    """A console user's identity, detached from the database session."""

    id: uuid.UUID
    email: str
    role: m.UserRole
    tenant_id: uuid.UUID | None

    @classmethod
    def of(cls, user: m.User) -> Account:
        return cls(id=user.id, email=user.email, role=m.UserRole(user.role), tenant_id=user.tenant_id)


@dataclass(frozen=True, slots=True)
class NewSession:
    token: str
    user: ConsoleUser
    expires_at: dt.datetime


class SessionService:
    """Creates, resolves and ends console sessions. Lookups run in the system scope: the session row
    is what tells which tenant a request belongs to."""

    def __init__(self, db: Database, session_secret: str, *, ttl: dt.timedelta = dt.timedelta(hours=12)) -> None:
        self._db = db
        self._secret = session_secret.encode()
        self.ttl = ttl

    def token_hash(self, token: str) -> bytes:
        return hmac.new(self._secret, b"console-session:" + token.encode(), hashlib.sha256).digest()

    def authenticate(self, email: str, password: str) -> Account:
        """The user behind an email and password; one message for every failure."""
        email = email.strip()
        with self._db.system() as uow:
            user = uow.users.by_email(email) if email else None
            ok = verify_password(user.password_hash if user else None, password)
            if user is None or not ok or user.disabled:
                raise errors.AuthenticationError("The email or password is not correct.")
            if user.tenant_id is not None:
                tenant = uow.tenants.get(user.tenant_id)
                if tenant is None or tenant.status is not m.TenantStatus.ACTIVE:
                    raise errors.PermissionDeniedError("This organisation is suspended; contact the operators.")
            return Account.of(user)

    def start(self, user: Account) -> NewSession:
        token = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        expires = dt.datetime.now(dt.UTC) + self.ttl
        with self._db.system() as uow:
            row = uow.console_sessions.add(m.ConsoleSession(
                token_hash=self.token_hash(token), user_id=user.id, tenant_id=user.tenant_id,
                csrf_token=csrf, expires_at=expires,
            ))
            uow.console_sessions.touch_user(user.id)
            uow.commit()
            sid = row.id
        cu = ConsoleUser(session_id=sid, user_id=user.id, email=user.email, role=user.role,
                         tenant_id=user.tenant_id, csrf_token=csrf)
        return NewSession(token=token, user=cu, expires_at=expires)

    def resolve(self, token: str | None) -> ConsoleUser | None:
        if not token or len(token) > 200:
            return None
        now = dt.datetime.now(dt.UTC)
        with self._db.system() as uow:
            row = uow.console_sessions.by_hash(self.token_hash(token), now)
            if row is None:
                return None
            user = uow.users.get(row.user_id)
            if user is None or user.disabled or user.tenant_id != row.tenant_id:
                return None
            if user.tenant_id is not None:
                tenant = uow.tenants.get(user.tenant_id)
                if tenant is None:
                    return None
                if tenant.status is not m.TenantStatus.ACTIVE:
                    # a signed-in user of a suspended organisation is told why, not sent to sign in again
                    raise errors.PermissionDeniedError("This organisation is suspended; contact the operators.")
            return ConsoleUser(session_id=row.id, user_id=user.id, email=user.email, role=m.UserRole(user.role),
                               tenant_id=user.tenant_id, csrf_token=row.csrf_token)

    def end(self, token: str | None) -> None:
        if not token:
            return
        with self._db.system() as uow:
            uow.console_sessions.end(self.token_hash(token))
            uow.commit()


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_key(value: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of an origin or URL, the port made explicit; None if it is not one."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host, port or _DEFAULT_PORTS[scheme]


def origin_allowed(origin: str | None, *, own: str, allowed: Sequence[str] = ()) -> bool:
    """Whether a request that names ``origin`` (its ``Origin`` header) may sign in or sign up.

    No header: yes (browsers send one on every cross-site POST; other clients need not). Otherwise it
    must be the console's own origin ``own`` (``scheme://host[:port]`` of the request) or one of
    ``allowed`` (``console.allowed_origins``); ``null`` (a sandboxed or privacy-stripped context) is not.
    """
    if origin is None:
        return True
    key = _origin_key(origin)
    if key is None:
        return False
    return key == _origin_key(own) or any(key == _origin_key(a) for a in allowed)


def check_origin(origin: str | None, *, own: str, allowed: Sequence[str] = ()) -> None:
    if not origin_allowed(origin, own=own, allowed=allowed):
        raise errors.PermissionDeniedError(
            "Sign-in and sign-up are accepted only from the console's own pages.")


def check_csrf(user: ConsoleUser, header_value: str | None) -> None:
    if not header_value or not hmac.compare_digest(header_value.encode(), user.csrf_token.encode()):
        raise errors.PermissionDeniedError(
            "The request is missing its CSRF token; reload the page and try again.")


class LoginThrottle:
    """Failed sign-ins in a sliding window, per (email, client address), per client address, and per email
    from everywhere with a much higher cap: a guesser is stopped after ``max_failures`` tries at one account,
    but cannot lock its owner out from elsewhere (only a spread attack past ``max_per_email`` does).

    Counts live in Redis (shared by every API process) when one is given; if Redis cannot be reached
    the process falls back to its own counters, so a Redis outage never opens the door wide.
    """

    def __init__(self, redis_client: Any | None, *, max_failures: int = 5, max_per_ip: int = 30,
                 max_per_email: int = 100, window_s: int = 900) -> None:
        self._redis = redis_client
        self.max_failures = max_failures
        self.max_per_ip = max_per_ip
        self.max_per_email = max_per_email
        self.window_s = window_s
        self._local: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def _keys(self, email: str, ip: str) -> list[tuple[str, int]]:
        em = hashlib.sha256(email.strip().lower().encode()).hexdigest()[:32]
        return [(f"baton:console:login:email-ip:{em}:{ip}", self.max_failures),
                (f"baton:console:login:ip:{ip}", self.max_per_ip),
                (f"baton:console:login:email:{em}", self.max_per_email)]

    def _count(self, key: str) -> int:
        if self._redis is not None:
            try:
                now = time.time()
                pipe = self._redis.pipeline()
                pipe.zremrangebyscore(key, 0, now - self.window_s)
                pipe.zcard(key)
                return int(pipe.execute()[1])
            except Exception as exc:  # redis down: count locally
                log.warning("login throttle: Redis unavailable (%s); counting in-process", type(exc).__name__)
        with self._lock:
            cutoff = time.time() - self.window_s
            hits = [t for t in self._local.get(key, []) if t > cutoff]
            self._local[key] = hits
            return len(hits)

    def check(self, email: str, ip: str) -> None:
        for key, limit in self._keys(email, ip):
            if self._count(key) >= limit:
                raise errors.RateLimitedError(
                    "Too many failed attempts to sign in or sign up. Wait a few minutes and try again.",
                    headers={"Retry-After": str(self.window_s // 3)})

    def failed(self, email: str, ip: str) -> None:
        now = time.time()
        for key, _ in self._keys(email, ip):
            member = f"{now}:{secrets.token_hex(4)}"
            if self._redis is not None:
                try:
                    pipe = self._redis.pipeline()
                    pipe.zadd(key, {member: now})
                    pipe.expire(key, self.window_s)
                    pipe.execute()
                    continue
                except Exception as exc:
                    log.warning("login throttle: Redis unavailable (%s); counting in-process", type(exc).__name__)
            with self._lock:
                self._local.setdefault(key, []).append(now)

    def succeeded(self, email: str, ip: str) -> None:
        key = self._keys(email, ip)[0][0]
        if self._redis is not None:
            with contextlib.suppress(Exception):  # best effort; the window expires anyway
                self._redis.delete(key)
        with self._lock:
            self._local.pop(key, None)


def create_operator(db: Database, *, email: str, password: str, actor: str = "cli") -> uuid.UUID:
    """Creates a platform operator (a console user without a tenant); returns its id."""
    email = email.strip()
    if "@" not in email or len(email) > 320:
        raise errors.ValidationError("Enter a valid email address.", param="email")
    password_hash = hash_password(password)
    with db.system() as uow:
        user = uow.users.add(m.User(tenant_id=None, email=email, password_hash=password_hash,
                                    role=m.UserRole.OPERATOR))
        uow.audit.record(actor=actor, action="user.create", target_type="user", target_id=str(user.id),
                         after=snapshot(user))
        uow.commit()
        user_id: uuid.UUID = user.id
        return user_id
