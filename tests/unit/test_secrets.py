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


def test_the_key_secret_fingerprint_names_a_secret_without_revealing_it() -> None:
    fp = s.secret_fingerprint("a-secret")
    assert fp == s.secret_fingerprint("a-secret") and fp != s.secret_fingerprint("b-secret")
    assert fp.startswith("kf_") and len(fp) == 15 and "a-secret" not in fp
    # a process may mint and check when no live key names a secret, or some live key was made with its own
    assert s.fingerprint_problem(fp, set()) is None
    assert s.fingerprint_problem(fp, {fp, "kf_000000000000"}) is None
    problem = s.fingerprint_problem(fp, {"kf_000000000000"})
    assert problem is not None and fp in problem and "kf_000000000000" in problem
