"""KeyService on real Postgres and Redis: secrets shown once, hashes at rest, revoke, rotate, audit."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import orjson
import pytest
import redis
from sqlalchemy import text

from baton.control.keys import KeyService, RedisKeyEvents
from baton.core import errors
from baton.core import models as m
from baton.core.contracts import INVALIDATION_CHANNEL
from baton.core.db import Database
from baton.core.secrets import looks_valid
from baton.core.settings import Settings
from tests.integration.gateway.conftest import Catalogue


def _tenant(db: Database, models: tuple[str, ...] = ()) -> uuid.UUID:
    name = f"k-{uuid.uuid4().hex[:10]}"
    with db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=name, display_name=name))
        for n in models:
            model = uow.models.by_name(n)
            assert model is not None
            uow.tenant_models.grant(t.id, model.id)
        uow.commit()
        return t.id


def test_the_secret_is_shown_once_and_only_its_hmac_is_stored(
    db: Database, owner_db: Database, keys: KeyService
) -> None:
    tid = _tenant(db)
    issued = keys.issue(tenant_id=tid, name="ci", created_by="alice")
    assert looks_valid(issued.secret) and issued.key.prefix == issued.secret[:14]
    with owner_db.engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM api_keys WHERE id = :id"), {"id": issued.key.id}).mappings().one()
        dump = repr(dict(row))
        assert issued.secret not in dump and issued.secret[14:] not in dump
        assert len(row["key_hash"]) == 32
        audit = conn.execute(text("SELECT action, after::text FROM audit_log WHERE target_id = :id"),
                             {"id": str(issued.key.id)}).all()
    assert [a.action for a in audit] == ["api_key.create"]
    assert issued.secret not in audit[0][1]
    assert keys.authenticate(issued.secret).tenant_id == tid
    assert [v.id for v in keys.list(tenant_id=tid)] == [issued.key.id]


def test_failures_all_look_the_same(db: Database, keys: KeyService) -> None:
    tid = _tenant(db)
    issued = keys.issue(tenant_id=tid, name="a", created_by="t")
    tampered = issued.secret[:-1] + ("A" if issued.secret[-1] != "A" else "B")
    for bad in ("", "sk-openai", tampered, "bt_live_" + "x" * 32 + "_000000"):
        with pytest.raises(errors.AuthenticationError):
            keys.authenticate(bad)
    keys.revoke(tenant_id=tid, key_id=issued.key.id, actor="t")
    with pytest.raises(errors.AuthenticationError):
        keys.authenticate(issued.secret)
    # Revoking twice is not an error; a key of another tenant is "not found".
    keys.revoke(tenant_id=tid, key_id=issued.key.id, actor="t")
    with pytest.raises(errors.NotFoundError):
        keys.revoke(tenant_id=_tenant(db), key_id=issued.key.id, actor="t")


def test_names_scopes_and_expiry_are_validated(db: Database, keys: KeyService, catalogue: Catalogue) -> None:
    tid = _tenant(db, (catalogue.small,))
    keys.issue(tenant_id=tid, name="dup", created_by="t", model_scope=[catalogue.small])
    with pytest.raises(errors.ConflictError):
        keys.issue(tenant_id=tid, name="dup", created_by="t")
    with pytest.raises(errors.ValidationError) as exc:
        keys.issue(tenant_id=tid, name="x", created_by="t", model_scope=[catalogue.big])
    assert exc.value.param == "model_scope"
    with pytest.raises(errors.ValidationError):
        keys.issue(tenant_id=tid, name="y", created_by="t", expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(1))
    with pytest.raises(errors.ValidationError):
        keys.issue(tenant_id=tid, name=" ", created_by="t")
    soon = keys.issue(tenant_id=tid, name="soon", created_by="t",
                      expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    with pytest.raises(errors.AuthenticationError):
        keys.authenticate(soon.secret, now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))


def test_rotation_hands_the_name_over_and_keeps_the_old_key_for_the_overlap(db: Database, keys: KeyService) -> None:
    tid = _tenant(db)
    expiry = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    old = keys.issue(tenant_id=tid, name="svc", created_by="t", expires_at=expiry)
    new = keys.rotate(tenant_id=tid, key_id=old.key.id, actor="t", overlap=dt.timedelta(minutes=10))
    assert new.key.name == "svc" and new.key.expires_at == expiry
    old_view = keys.get(tenant_id=tid, key_id=old.key.id)
    assert old_view.rotated_to_id == new.key.id and old_view.state() == "expiring"
    assert old_view.expires_at is not None and old_view.expires_at < expiry
    assert keys.authenticate(old.secret).key_id == old.key.id
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=11)
    with pytest.raises(errors.AuthenticationError):
        keys.authenticate(old.secret, now=later)
    assert keys.authenticate(new.secret, now=later).key_id == new.key.id
    with pytest.raises(errors.ConflictError):
        keys.rotate(tenant_id=tid, key_id=old.key.id, actor="t")


def test_changes_are_announced_to_gateways(db: Database, settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis.url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(INVALIDATION_CHANNEL)
    service = KeyService(db, settings, events=RedisKeyEvents(client))
    tid = _tenant(db)
    issued = service.issue(tenant_id=tid, name="a", created_by="t")
    service.revoke(tenant_id=tid, key_id=issued.key.id, actor="t")
    seen: list[dict[str, str]] = []
    done = threading.Event()
    for _ in range(200):
        msg = pubsub.get_message(timeout=0.05)
        if msg:
            seen.append(orjson.loads(msg["data"]))
            if seen[-1].get("id") == str(issued.key.id):
                done.set()
                break
    pubsub.close()
    assert done.is_set(), seen
    assert {"kind": "key", "id": str(issued.key.id)} in seen


def test_a_tenant_session_cannot_touch_another_tenants_keys(db: Database, keys: KeyService) -> None:
    a, b = _tenant(db), _tenant(db)
    key_b = keys.issue(tenant_id=b, name="b", created_by="t")
    with pytest.raises(errors.NotFoundError):
        keys.get(tenant_id=a, key_id=key_b.key.id)
    assert keys.list(tenant_id=a) == []
