"""Secrets Baton hands out (API keys, admin tokens, session tokens) and how it keeps them.

A key looks like ``bt_live_<32 base62>_<6 base62 checksum>``: the prefix tells a scanner whose key it
is, the CRC32 checksum lets it recognise a real one without asking Baton. At rest only an HMAC-SHA256
of the whole key (with the server's secret) and its visible prefix are kept.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import uuid
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from baton.core.db import Database

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
KEY_PREFIX = "bt_live_"
ADMIN_PREFIX = "bt_admin_"
_BODY_LEN = 32
_CHECK_LEN = 6
VISIBLE_LEN = 6  # characters of the body shown in listings, after the prefix


def _base62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(_ALPHABET[r])
    return "".join(reversed(out))


def _checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode()), _CHECK_LEN)


def new_secret(prefix: str = KEY_PREFIX) -> str:
    body = "".join(secrets.choice(_ALPHABET) for _ in range(_BODY_LEN))
    return f"{prefix}{body}_{_checksum(prefix + body)}"


def looks_valid(token: str, prefix: str = KEY_PREFIX) -> bool:
    """Offline check: right prefix, shape and checksum. Says nothing about revocation."""
    if not token.startswith(prefix):
        return False
    body, sep, check = token[len(prefix):].rpartition("_")
    return (
        bool(sep)
        and len(body) == _BODY_LEN
        and all(c in _ALPHABET for c in body)
        and hmac.compare_digest(check, _checksum(prefix + body))
    )


def visible_prefix(token: str) -> str:
    """What listings show of a key: its prefix and the first characters of its body."""
    for prefix in (KEY_PREFIX, ADMIN_PREFIX):
        if token.startswith(prefix):
            return token[: len(prefix) + VISIBLE_LEN]
    return token[:VISIBLE_LEN]


def hash_secret(server_secret: str, token: str) -> bytes:
    return hmac.new(server_secret.encode(), token.encode(), hashlib.sha256).digest()


def secret_fingerprint(server_secret: str) -> str:
    """A short, one-way name of the key secret (``kf_`` + 12 hex characters of an HMAC of a fixed label):
    kept beside each key it signed, so a process with another secret can tell that the keys were not
    made with its own, without either side learning the other's secret."""
    mac = hmac.new(server_secret.encode(), b"baton:key-secret-fingerprint", hashlib.sha256)
    return "kf_" + mac.hexdigest()[:12]


def fingerprint_problem(fingerprint: str, theirs: set[str]) -> str | None:
    """Why a process whose key secret has ``fingerprint`` cannot mint or check keys whose live ones were
    made with the secrets ``theirs`` (a sentence for the operator that names fingerprints, never a secret),
    or None when it can: some live key was made with its secret, or no live key names its secret."""
    if not theirs or fingerprint in theirs:
        return None
    return (f"This process's key secret (fingerprint {fingerprint}) is not the one the live API keys were made "
            f"with ({', '.join(sorted(theirs))}): a key it made would be refused, and it cannot check theirs. "
            "Give it the stack's BATON_SECURITY__KEY_SECRET (scripts/up writes it to var/baton.env), or revoke "
            "the keys made with the other secret first.")


def secret_mismatch(db: Database, fingerprint: str, now: dt.datetime | None = None) -> str | None:
    """:func:`fingerprint_problem` against the database's live keys (one system-scope read)."""
    with db.system() as uow:
        theirs = uow.api_keys.live_fingerprints(now or dt.datetime.now(dt.UTC))
    return fingerprint_problem(fingerprint, theirs)


def cache_salt(server_secret: str, tenant_id: uuid.UUID) -> str:
    """The tenant's prefix-cache salt: derived server-side, never chosen by a client."""
    mac = hmac.new(server_secret.encode(), b"cache-salt:" + tenant_id.bytes, hashlib.sha256)
    return mac.hexdigest()[:32]
