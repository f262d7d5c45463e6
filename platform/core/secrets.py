"""Secrets Baton hands out (API keys, admin tokens, session tokens) and how it keeps them.

A key looks like ``bt_live_<32 base62>_<6 base62 checksum>``: the prefix tells a scanner whose key it
is, the CRC32 checksum lets it recognise a real one without asking Baton. At rest only an HMAC-SHA256
of the whole key (with the server's secret) and its visible prefix are kept.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
import zlib

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


def cache_salt(server_secret: str, tenant_id: uuid.UUID) -> str:
    """The tenant's prefix-cache salt: derived server-side, never chosen by a client."""
    mac = hmac.new(server_secret.encode(), b"cache-salt:" + tenant_id.bytes, hashlib.sha256)
    return mac.hexdigest()[:32]
