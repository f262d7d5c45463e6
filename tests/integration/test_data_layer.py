"""The unit of work, repositories, row-level security and error translation on real Postgres."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import text

from baton.core import errors
from baton.core import models as m
from baton.core.db import Database
from baton.core.dberrors import translated


def _tenant(db: Database, name: str | None = None) -> m.Tenant:
    name = name or f"t-{uuid.uuid4().hex[:10]}"
    with db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=name, display_name=name.upper()))
        uow.commit()
    return t


def _model(db: Database) -> m.Model:
    with db.system() as uow:
        model = uow.models.add(m.Model(name=f"m-{uuid.uuid4().hex[:8]}", source="/models/x", context_length=4096,
                                       num_layers=2, num_kv_heads=2, head_dim=32, dtype="float32"))
        uow.commit()
    return model


def _fill_tenant(db: Database, tenant: m.Tenant, model: m.Model) -> None:
    now = dt.datetime.now(dt.UTC)
    with db.tenant(tenant.id) as uow:
        key = uow.api_keys.add(m.ApiKey(tenant_id=tenant.id, name="k", prefix="bt_live_x",
                                        key_hash=uuid.uuid4().bytes * 2, created_by="test"))
        uow.users.add(m.User(tenant_id=tenant.id, email=f"{tenant.name}@example.com", password_hash="x",
                             role=m.UserRole.TENANT_ADMIN))
        uow.tenant_models.grant(tenant.id, model.id)
        uow.rate_limits.upsert(tenant.id, None, requests_per_minute=60, tokens_per_minute=None,
                               max_concurrency=None)
        uow.usage.insert_many([{"request_id": uuid.uuid4(), "tenant_id": tenant.id, "api_key_id": key.id,
                                "model": model.name, "prompt_tokens": 3, "completion_tokens": 4}])
        uow.requests.insert_many([{"id": uuid.uuid4(), "tenant_id": tenant.id, "model": model.name,
                                   "endpoint": "chat", "stream": True, "status": m.RequestStatus.COMPLETED,
                                   "http_status": 200, "e2e_ms": 1.0, "started_at": now, "finished_at": now}])
        uow.commit()


TENANT_TABLES = ["api_keys", "users", "tenant_models", "rate_limits", "usage_records", "request_records"]


def test_a_tenant_session_reads_none_of_another_tenants_rows(db: Database) -> None:
    model = _model(db)
    a, b = _tenant(db), _tenant(db)
    _fill_tenant(db, a, model)
    _fill_tenant(db, b, model)
    with db.tenant(a.id) as uow:
        for table in TENANT_TABLES:
            # Deliberately without WHERE tenant_id: the database itself must hide B's rows.
            tenants = uow.session.execute(text(f"SELECT DISTINCT tenant_id FROM {table}")).scalars().all()
            assert tenants == [a.id], table
        visible = uow.session.execute(text("SELECT id FROM tenants")).scalars().all()
        assert visible == [a.id]
    with db.system() as uow:
        seen = set(uow.session.execute(text("SELECT DISTINCT tenant_id FROM api_keys")).scalars())
        assert {a.id, b.id} <= seen


def test_a_tenant_session_cannot_write_into_another_tenant(db: Database) -> None:
    a, b = _tenant(db), _tenant(db)
    with db.tenant(a.id) as uow, pytest.raises(errors.BatonError):
        uow.api_keys.add(m.ApiKey(tenant_id=b.id, name="sneaky", prefix="p", key_hash=uuid.uuid4().bytes * 2,
                                  created_by="a"))


def test_without_a_scope_tenant_tables_show_nothing(db: Database) -> None:
    a = _tenant(db)
    _fill_tenant(db, a, _model(db))
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_keys")).scalar() == 0


def test_scope_survives_a_commit_inside_one_unit_of_work(db: Database) -> None:
    a = _tenant(db)
    with db.tenant(a.id) as uow:
        uow.rate_limits.upsert(a.id, None, requests_per_minute=1, tokens_per_minute=None, max_concurrency=None)
        uow.commit()
        assert [r.tenant_id for r in uow.rate_limits.for_tenant(a.id)] == [a.id]


def test_duplicate_name_is_a_conflict(db: Database) -> None:
    t = _tenant(db)
    with db.system() as uow, pytest.raises(errors.ConflictError, match="tenant with this name"):
        uow.tenants.add(m.Tenant(name=t.name, display_name="again"))


def test_missing_tenant_is_not_found(db: Database) -> None:
    with db.system() as uow, pytest.raises(errors.NotFoundError, match="tenant does not exist"):
        uow.api_keys.add(m.ApiKey(tenant_id=uuid.uuid4(), name="k", prefix="p",
                                  key_hash=uuid.uuid4().bytes * 2, created_by="x"))


def test_bad_values_are_validation_errors(db: Database) -> None:
    with db.system() as uow, pytest.raises(errors.ValidationError, match="lower-case"):
        uow.tenants.add(m.Tenant(name="Not A Slug", display_name="x"))
    model = _model(db)
    with db.system() as uow, pytest.raises(errors.ValidationError, match="P/D mode needs a KV connector"):
        uow.deployments.add(m.Deployment(name="d-" + uuid.uuid4().hex[:6], model_id=model.id,
                                         mode=m.DeploymentMode.PD, prefill_min_replicas=1,
                                         prefill_max_replicas=1))
    with db.system() as uow, pytest.raises(errors.ValidationError, match="Decode replicas"):
        uow.deployments.add(m.Deployment(name="d-" + uuid.uuid4().hex[:6], model_id=model.id,
                                         mode=m.DeploymentMode.AGGREGATED, decode_min_replicas=3,
                                         decode_max_replicas=2))


def test_removing_a_model_in_use_is_a_conflict(db: Database) -> None:
    model = _model(db)
    with db.system() as uow:
        uow.deployments.add(m.Deployment(name="d-" + uuid.uuid4().hex[:6], model_id=model.id,
                                         mode=m.DeploymentMode.AGGREGATED))
        uow.commit()
    with db.system() as uow, pytest.raises(errors.ConflictError, match="still in use"):
        uow.models.delete(uow.models.require(model.id))


def test_concurrent_updates_are_refused(db: Database) -> None:
    t = _tenant(db)
    with db.system() as first, db.system() as second:
        one, two = first.tenants.require(t.id), second.tenants.require(t.id)
        one.display_name = "first"
        first.commit()
        two.display_name = "second"
        with pytest.raises(errors.PreconditionFailedError):
            second.commit()


def test_leaving_without_commit_rolls_back(db: Database) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with db.system() as uow:
        uow.tenants.add(m.Tenant(name=name, display_name="x"))
    with db.system() as uow:
        assert uow.tenants.by_name(name) is None


def test_usage_writes_are_idempotent_per_request(db: Database) -> None:
    t = _tenant(db)
    rid = uuid.uuid4()
    row = {"request_id": rid, "tenant_id": t.id, "model": "m", "prompt_tokens": 1, "completion_tokens": 2}
    with db.tenant(t.id) as uow:
        assert uow.usage.insert_many([row]) == 1
        assert uow.usage.insert_many([row]) == 0
        uow.commit()


def test_audit_log_is_append_only_for_services(db: Database) -> None:
    with db.system() as uow:
        entry = uow.audit.record(actor="test", action="create", target_type="tenant", after={"a": 1})
        uow.commit()
    for statement in ("UPDATE audit_log SET actor = 'x' WHERE id = :i", "DELETE FROM audit_log WHERE id = :i"):
        with db.system() as uow, pytest.raises(errors.ServerError), translated():
            uow.session.execute(text(statement), {"i": entry.id})
    with db.system() as uow:
        assert uow.audit.require(entry.id).actor == "test"
