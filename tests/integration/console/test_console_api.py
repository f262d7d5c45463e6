"""The console backend on real Postgres and Redis: sessions, CSRF, throttling, keys, read models,
operator actions, and tenant isolation (a tenant never reaches another tenant's data nor operator routes)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from baton.core import models as m
from baton.core.db import Database

from .conftest import PASSWORD, Session, SignUp, add_model, grant

API = "/console/api"


def test_sign_up_sets_a_hardened_session_cookie(client, db: Database) -> None:  # type: ignore[no-untyped-def]
    slug = f"t-{uuid.uuid4().hex[:10]}"
    r = client.post(f"{API}/signup", json={"organisation": "Acme", "tenant_name": slug,
                                           "email": f"a@{slug}.example.com", "password": PASSWORD})
    assert r.status_code == 201, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/" in cookie
    token = cookie.split(";")[0].split("=", 1)[1]
    body = r.json()
    assert body["user"]["role"] == "tenant_admin" and body["tenant"]["name"] == slug
    assert token not in r.text
    # Only the token's HMAC is stored.
    with db.system() as uow:
        rows = uow.console_sessions.scalars(
            uow.console_sessions.session.query(m.ConsoleSession)  # type: ignore[arg-type]
            .filter(m.ConsoleSession.tenant_id == uuid.UUID(body["tenant"]["id"])).statement)
        assert len(rows) == 1 and token.encode() not in rows[0].token_hash
        user = uow.users.by_email(f"a@{slug}.example.com")
        assert user is not None and user.password_hash.startswith("$argon2")
    me = client.get(f"{API}/session")
    assert me.status_code == 200 and me.json()["csrf_token"] == body["csrf_token"]


def test_sign_up_rejects_duplicates_and_weak_passwords(client, sign_up: SignUp) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    r = client.post(f"{API}/signup", json={"organisation": "X", "tenant_name": f"t-{uuid.uuid4().hex[:8]}",
                                           "email": s.email.upper(), "password": PASSWORD})
    assert r.status_code == 409 and "already exists" in r.json()["detail"]
    # one password policy (baton.core.passwords) on every path: length, blank, few characters, common ones
    for weak, why in (("short", "12 characters"), (" " * 12, "only spaces"), ("a" * 12, "different characters"),
                      ("aaaaaaaaaa", "12 characters"), ("Password2026!", "too common"), ("qwertyuiop12", "too common")):
        r = client.post(f"{API}/signup", json={"organisation": "X", "tenant_name": f"t-{uuid.uuid4().hex[:8]}",
                                               "email": "new@example.com", "password": weak})
        assert r.status_code == 400 and why in r.json()["detail"], (weak, r.text)
        assert r.json()["param"] == "password"
    r = client.post(f"{API}/signup", json={"organisation": "X", "tenant_name": "Bad Name!",
                                           "email": "new2@example.com", "password": PASSWORD})
    assert r.status_code == 400 and r.json()["param"] == "tenant_name"


def test_no_session_is_401_and_sign_out_ends_it(sign_up: SignUp, client) -> None:  # type: ignore[no-untyped-def]
    assert client.get(f"{API}/tenant/keys").status_code == 401
    s = sign_up()
    assert s.get(f"{API}/tenant/keys").status_code == 200
    assert s.post(f"{API}/logout").status_code == 204
    assert s.get(f"{API}/tenant/keys").status_code == 401


def test_mutations_need_the_session_csrf_token_and_same_origin(sign_up: SignUp) -> None:
    s = sign_up()
    url = f"{API}/tenant/keys"
    assert s.client.post(url, json={"name": "k"}).status_code == 403
    assert s.client.post(url, json={"name": "k"}, headers={"x-csrf-token": "wrong"}).status_code == 403
    other = sign_up()
    assert s.client.post(url, json={"name": "k"}, headers={"x-csrf-token": other.csrf}).status_code == 403
    r = s.post(url, json={"name": "k"}, headers={"origin": "https://evil.example.com"})
    assert r.status_code == 403 and "Cross-site" in r.json()["detail"]
    # the same host and port under another scheme is another origin
    r = s.post(url, json={"name": "k"}, headers={"origin": "https://testserver"})
    assert r.status_code == 403 and "Cross-site" in r.json()["detail"]
    assert s.post(url, json={"name": "k"}, headers={"origin": "http://testserver"}).status_code == 201


def test_failed_sign_ins_are_throttled(client, sign_up: SignUp) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    for _ in range(5):
        r = client.post(f"{API}/login", json={"email": s.email, "password": "not the password"})
        assert r.status_code == 401 and r.json()["detail"] == "The email or password is not correct."
    r = client.post(f"{API}/login", json={"email": s.email, "password": PASSWORD})
    assert r.status_code == 429 and "Too many" in r.json()["detail"]
    # Unknown emails read exactly like wrong passwords.
    r = client.post(f"{API}/login", json={"email": "nobody@example.com", "password": PASSWORD})
    assert r.status_code == 401 and r.json()["detail"] == "The email or password is not correct."
    # ... from that address only: its owner, elsewhere, still signs in (a guesser cannot lock them out)
    from fastapi.testclient import TestClient

    with TestClient(client.app, client=("203.0.113.7", 40000)) as elsewhere:
        r = elsewhere.post(f"{API}/login", json={"email": s.email, "password": PASSWORD})
        assert r.status_code == 200, r.text


def test_keys_create_list_rotate_revoke(sign_up: SignUp, db: Database, settings) -> None:  # type: ignore[no-untyped-def]
    from baton.control.keys import KeyService

    s = sign_up()
    model = add_model(db)
    assert s.post(f"{API}/tenant/keys", json={"name": "k", "model_scope": [model.name]}).status_code == 400
    grant(db, s.tenant_id, model.id)  # type: ignore[arg-type]
    assert [x["name"] for x in s.get(f"{API}/tenant/models").json()] == [model.name]
    r = s.post(f"{API}/tenant/keys", json={"name": "prod", "model_scope": [model.name], "expires_in_days": 30})
    assert r.status_code == 201, r.text
    created = r.json()
    secret = created["secret"]
    assert secret.startswith("bt_live_") and created["key"]["model_scope"] == [model.name]
    assert created["key"]["state"] == "expiring"
    ident = KeyService(db, settings).authenticate(secret)
    assert ident.tenant_id == s.tenant_id
    listed = s.get(f"{API}/tenant/keys").json()
    assert [k["id"] for k in listed] == [created["key"]["id"]] and secret not in str(listed)
    rot = s.post(f"{API}/tenant/keys/{created['key']['id']}/rotate", json={"overlap_hours": 0})
    assert rot.status_code == 200 and rot.json()["secret"] != secret
    new_id = rot.json()["key"]["id"]
    assert s.post(f"{API}/tenant/keys/{new_id}/revoke").json()["state"] == "revoked"
    assert all(k["id"] != new_id for k in s.get(f"{API}/tenant/keys").json())
    pg = s.post(f"{API}/tenant/playground-key", json={"model": model.name})
    assert pg.status_code == 201 and pg.json()["key"]["model_scope"] == [model.name]
    assert pg.json()["key"]["expires_at"] is not None


def _record(db: Database, tenant_id: uuid.UUID, model: str, *, ttft: float, tpot: float | None,
            recovery: list[dict] | None = None, minutes_ago: float = 5) -> uuid.UUID:  # type: ignore[type-arg]
    rid = uuid.uuid4()
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago)
    with db.tenant(tenant_id) as uow:
        uow.requests.insert_many([{
            "id": rid, "tenant_id": tenant_id, "model": model, "endpoint": "/v1/chat/completions",
            "stream": True, "status": "completed", "http_status": 200, "prompt_tokens": 20,
            "completion_tokens": 10, "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": ttft + 9 * (tpot or 1),
            "kv_bytes": 65536, "handoff_ms": 2.0, "recovery_steps": recovery or [], "trace_id": "ab" * 16,
            "started_at": start, "finished_at": start + dt.timedelta(seconds=1),
        }])
        uow.usage.insert_many([{"request_id": rid, "tenant_id": tenant_id, "model": model, "prompt_tokens": 20,
                                "completion_tokens": 10, "created_at": start}])
        uow.commit()
    return rid


def test_usage_slo_and_waterfall(sign_up: SignUp, db: Database) -> None:
    s = sign_up()
    model = add_model(db)
    assert s.tenant_id is not None
    grant(db, s.tenant_id, model.id)
    with db.system() as uow:
        pol = uow.slo_policies.add(m.SloPolicy(name=f"gold-{uuid.uuid4().hex[:6]}", ttft_ms=100, tpot_ms=20))
        uow.slo_assignments.add(m.SloAssignment(policy_id=pol.id, tenant_id=s.tenant_id))
        uow.commit()
    good = _record(db, s.tenant_id, model.name, ttft=50, tpot=10,
                   recovery=[{"step": "retry_prefill", "start_ms": 5, "duration_ms": 8, "replica": "p1"}])
    _record(db, s.tenant_id, model.name, ttft=500, tpot=10)  # misses TTFT
    _record(db, s.tenant_id, model.name, ttft=40, tpot=None)  # one token: no TPOT
    _record(db, s.tenant_id, model.name, ttft=60, tpot=50)  # misses TPOT

    usage = s.get(f"{API}/tenant/usage", params={"hours": 24}).json()
    assert usage["totals"]["requests"] == 4 and usage["totals"]["completion_tokens"] == 40
    assert usage["bucket"] == "hour" and len(usage["series"]) >= 24
    assert sum(p["requests"] for p in usage["series"]) == 4

    slo = s.get(f"{API}/tenant/slo").json()["models"]
    assert len(slo) == 1 and slo[0]["requests"] == 4 and slo[0]["good"] == 2
    assert slo[0]["attainment"] == 0.5 and slo[0]["policy"]["ttft_ms"] == 100
    assert slo[0]["ttft_ms"]["p50"] is not None and slo[0]["goodput_rps"] > 0

    listed = s.get(f"{API}/tenant/requests").json()
    assert listed["count"] == 4
    detail = s.get(f"{API}/tenant/requests/{good}").json()
    kinds = [w["kind"] for w in detail["waterfall"]]
    assert kinds == ["prefill", "kv_handoff", "decode", "recovery"]
    pre, handoff, decode, rec = detail["waterfall"]
    assert pre["duration_ms"] == 48 and handoff["start_ms"] == 48 and decode["start_ms"] == 50
    assert rec["name"] == "recovery: retry_prefill" and "replica=p1" in rec["detail"]


def test_a_tenant_never_reaches_another_tenants_data(sign_up: SignUp, db: Database) -> None:
    a, b = sign_up(), sign_up()
    assert a.tenant_id and b.tenant_id
    model = add_model(db)
    grant(db, b.tenant_id, model.id)
    b_req = _record(db, b.tenant_id, model.name, ttft=10, tpot=5)
    b_key = b.post(f"{API}/tenant/keys", json={"name": "b-key"}).json()["key"]["id"]

    assert a.get(f"{API}/tenant/requests/{b_req}").status_code == 404
    assert a.get(f"{API}/tenant/requests").json()["count"] == 0
    assert a.get(f"{API}/tenant/usage").json()["totals"]["requests"] == 0
    assert a.get(f"{API}/tenant/slo").json()["models"] == []
    assert a.get(f"{API}/tenant/models").json() == []
    assert a.get(f"{API}/tenant/keys").json() == []
    assert a.post(f"{API}/tenant/keys/{b_key}/revoke").status_code == 404
    assert a.post(f"{API}/tenant/keys/{b_key}/rotate", json={}).status_code == 404
    assert a.post(f"{API}/tenant/keys", json={"name": "x", "model_scope": [model.name]}).status_code == 400
    assert b.get(f"{API}/tenant/keys").json()[0]["state"] == "active"
    assert b.get(f"{API}/tenant/requests/{b_req}").status_code == 200


@pytest.mark.parametrize("method,path", [
    ("GET", "/ops/overview"), ("GET", "/ops/tenants"), ("GET", "/ops/deployments"), ("GET", "/ops/audit"),
    ("GET", "/ops/models"), ("GET", "/ops/slo-policies"), ("POST", "/ops/deployments"),
    ("POST", "/ops/slo-policies"), ("PUT", f"/ops/tenants/{uuid.uuid4()}/models/{uuid.uuid4()}"),
])
def test_a_tenant_session_gets_403_on_operator_routes(sign_up: SignUp, method: str, path: str) -> None:
    s = sign_up()
    r = s.client.request(method, API + path, headers={"x-csrf-token": s.csrf}, json={})
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == "Only platform operators may open this page."


def test_operator_manages_tenants_deployments_and_policies(operator: Session, sign_up: SignUp, db: Database,
                                                           console_recorder) -> None:  # type: ignore[no-untyped-def]
    t = sign_up()
    model = add_model(db)
    assert operator.get(f"{API}/tenant/keys").status_code == 403
    tenants = operator.get(f"{API}/ops/tenants").json()
    assert any(x["id"] == str(t.tenant_id) for x in tenants)
    assert operator.put(f"{API}/ops/tenants/{t.tenant_id}/models/{model.id}").status_code == 204
    assert [x["name"] for x in t.get(f"{API}/tenant/models").json()] == [model.name]

    pol = operator.post(f"{API}/ops/slo-policies", json={"name": f"p-{uuid.uuid4().hex[:6]}", "ttft_ms": 500,
                                                         "tpot_ms": 50})
    assert pol.status_code == 201, pol.text
    name = f"d-{uuid.uuid4().hex[:8]}"
    r = operator.post(f"{API}/ops/deployments", json={
        "name": name, "model_id": str(model.id), "mode": "aggregated", "decode": {"min": 1, "max": 1},
        "slo_policy_id": pol.json()["id"]})
    assert r.status_code == 201, r.text
    assert r.json()["observed_state"] == "pending"
    assert "deployment created" in console_recorder.reconciles
    deps = operator.get(f"{API}/ops/deployments").json()
    assert any(d["name"] == name and d["model"] == model.name for d in deps)
    bad = operator.post(f"{API}/ops/deployments", json={"name": "Bad Name", "model_id": str(model.id)})
    assert bad.status_code == 400

    audit = operator.get(f"{API}/ops/audit", params={"target_type": "deployment"}).json()["data"]
    assert any(a["action"] == "deployment.create" and a["actor"] == f"console:{operator.email}" for a in audit)
    overview = operator.get(f"{API}/ops/overview").json()
    assert overview["tenants"] >= 1 and overview["deployments"].get("pending", 0) >= 1

    plan = operator.post(f"{API}/ops/models/{model.id}/plan", json={"ttft_ms": 500, "tpot_ms": 50})
    assert plan.status_code == 200, plan.text
    assert plan.json()["recommended"] and plan.json()["plot_png_base64"]
    assert plan.json()["feasible"] is True and plan.json()["recommendation"]["name"] == plan.json()["recommended"]
    none = operator.post(f"{API}/ops/models/{model.id}/plan", json={"ttft_ms": 1, "tpot_ms": 50, "calibrate": False})
    assert none.status_code == 200, none.text
    body = none.json()
    assert body["feasible"] is False and body["recommended"] is None and body["recommendation"] is None
    assert body["closest"]["name"] and body["to_meet"] and body["plot_png_base64"]
    assert body["calibration"] == {"samples": 0, "used": False, "used_samples": 0, "rejected": {},
                                   "reason": "calibration turned off: figures from the settings"}


def test_static_front_end_and_unknown_api_routes(client) -> None:  # type: ignore[no-untyped-def]
    r = client.get("/console/keys")
    assert r.status_code in (200, 503) and r.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    r = client.get("/console/api/nothing-here")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert client.get("/", follow_redirects=False).headers["location"] == "/console/"


def test_a_new_tenants_overview_answers_from_the_first_minute(sign_up: SignUp) -> None:
    s = sign_up()  # a fresh organisation: no models granted, no keys, no usage yet
    r = s.get(f"{API}/tenant/overview")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tenant"]["id"] == str(s.tenant_id)
    assert body["models"] == 0 and body["live_keys"] == 0
    assert s.get(f"{API}/tenant/overview").status_code == 200  # and again, on a second load


def test_the_overview_names_a_chat_model_first_for_its_chat_example(sign_up: SignUp, db: Database) -> None:
    s = sign_up()
    embed, chat = add_model(db, f"a-embed-{uuid.uuid4().hex[:6]}"), add_model(db, f"z-chat-{uuid.uuid4().hex[:6]}")
    with db.system() as uow:
        uow.models.require(embed.id).kind = "embed"
        uow.commit()
    for mod in (embed, chat):
        grant(db, s.tenant_id, mod.id)  # type: ignore[arg-type]
    assert s.get(f"{API}/tenant/overview").json()["models_granted"] == [chat.name, embed.name]
