from __future__ import annotations

import uuid

from baton.core import secrets as s


def test_new_keys_carry_prefix_and_a_checksum_scanners_can_verify() -> None:
    key = s.new_secret()
    assert key.startswith("bt_live_")
    assert s.looks_valid(key)
    flipped = key[:12] + ("A" if key[12] != "A" else "B") + key[13:]
    assert not s.looks_valid(flipped)
    assert not s.looks_valid(key.replace("bt_live_", "bt_test_"))
    assert s.new_secret() != key


def test_visible_prefix_reveals_only_the_start() -> None:
    key = s.new_secret()
    shown = s.visible_prefix(key)
    assert key.startswith(shown) and len(shown) == len("bt_live_") + 6


def test_hash_depends_on_the_server_secret() -> None:
    key = s.new_secret()
    assert s.hash_secret("a", key) == s.hash_secret("a", key)
    assert s.hash_secret("a", key) != s.hash_secret("b", key)
    assert len(s.hash_secret("a", key)) == 32


def test_cache_salt_is_per_tenant_and_stable() -> None:
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    assert s.cache_salt("k", t1) == s.cache_salt("k", t1)
    assert s.cache_salt("k", t1) != s.cache_salt("k", t2)
    assert s.cache_salt("k", t1) != s.cache_salt("other", t1)
