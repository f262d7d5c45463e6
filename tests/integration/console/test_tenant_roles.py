"""Roles inside a tenant, on real Postgres through the console: a member (added by an operator) reads the
organisation's pages and uses the playground; every change to keys and every request for a model is 403
for them, whoever made the key, and the same actions succeed for the tenant's admin. The use cases check
the role themselves (``baton.control.roles``), so a surface that passes it cannot forget the check."""

from __future__ import annotations

import uuid

import pytest

from baton.core import errors
from baton.core import models as m
from baton.core.db import Database

from .conftest import Session, SignUp, add_member, add_model, grant

API = "/console/api"


def test_a_member_reads_and_plays_but_changes_no_key_and_asks_for_no_model(
        console_app, operator: Session, sign_up: SignUp, db: Database) -> None:  # type: ignore[no-untyped-def]
    admin = sign_up()
    assert admin.tenant_id is not None
    granted, other = add_model(db), add_model(db)
    grant(db, admin.tenant_id, granted.id)
    made = admin.post(f"{API}/tenant/keys", json={"name": "admins-key"})
    assert made.status_code == 201, made.text
    key_id = made.json()["key"]["id"]
    member = add_member(console_app, operator, admin.tenant_id)
    try:
        # reads and the playground
        assert member.get(f"{API}/session").json()["user"]["role"] == "tenant_member"
        assert [k["id"] for k in member.get(f"{API}/tenant/keys").json()] == [key_id]  # the organisation's keys
        assert member.get(f"{API}/tenant/models").status_code == 200
        assert member.get(f"{API}/tenant/catalogue").status_code == 200
        pg = member.post(f"{API}/tenant/playground-key", json={"model": granted.name})
        assert pg.status_code == 201, pg.text
        # every change to keys, and asking for a model: 403 with a sentence that says who may
        refused = {
            "create": member.post(f"{API}/tenant/keys", json={"name": "mine"}),
            "revoke": member.post(f"{API}/tenant/keys/{key_id}/revoke"),
            "rotate": member.post(f"{API}/tenant/keys/{key_id}/rotate", json={"overlap_hours": 1}),
            "ask": member.post(f"{API}/tenant/access-requests", json={"model_id": str(other.id)}),
        }
        for action, r in refused.items():
            assert r.status_code == 403, (action, r.status_code, r.text)
            assert "admins" in r.json()["detail"], (action, r.text)
        # nothing changed: the admin's key lives, no key was made, nothing was asked
        keys = [k for k in admin.get(f"{API}/tenant/keys").json() if k["kind"] != "playground"]
        assert [(k["id"], k["state"], k["rotated_to_id"]) for k in keys] == [(key_id, "active", None)]
        asked = admin.get(f"{API}/tenant/access-requests").json()  # sign-up asked for "any model" itself
        assert [r for r in asked if r["model_id"] == str(other.id)] == []
        # the admin may do each of them
        assert admin.post(f"{API}/tenant/access-requests", json={"model_id": str(other.id)}).status_code == 201
        rot = admin.post(f"{API}/tenant/keys/{key_id}/rotate", json={"overlap_hours": 0})
        assert rot.status_code == 200, rot.text
        assert admin.post(f"{API}/tenant/keys/{rot.json()['key']['id']}/revoke").status_code == 200
    finally:
        member.client.close()


def test_the_key_use_cases_check_the_role_whichever_surface_calls(settings, db: Database) -> None:  # type: ignore[no-untyped-def]
    from baton.control.keys import KeyService

    with db.system() as uow:
        tenant = uow.tenants.add(m.Tenant(name=f"roles-{uuid.uuid4().hex[:8]}", display_name="Roles"))
        uow.commit()
        tid = tenant.id
    keys = KeyService(db, settings)
    with pytest.raises(errors.PermissionDeniedError):
        keys.issue(tenant_id=tid, name="k", created_by="console:m@example.com", role=m.UserRole.TENANT_MEMBER)
    issued = keys.issue(tenant_id=tid, name="k", created_by="console:a@example.com", role=m.UserRole.TENANT_ADMIN)
    for call in (lambda: keys.revoke(tenant_id=tid, key_id=issued.key.id, actor="m", role=m.UserRole.TENANT_MEMBER),
                 lambda: keys.rotate(tenant_id=tid, key_id=issued.key.id, actor="m", role=m.UserRole.TENANT_MEMBER)):
        with pytest.raises(errors.PermissionDeniedError):
            call()
    # an operator surface (admin API, CLI) passes no tenant role
    assert keys.revoke(tenant_id=tid, key_id=issued.key.id, actor="admin:test").state() == "revoked"
