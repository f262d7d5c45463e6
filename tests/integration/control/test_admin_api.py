"""/admin/v1 against real Postgres: resources, audit rows, ETags, problem details, admin-only access."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from types import SimpleNamespace

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import select

from baton.core import models as m

from .conftest import unique

TINY_SHAPE = {"context_length": 2048, "num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "dtype": "float32"}


def _audit(db, target_id: str, action: str) -> list[SimpleNamespace]:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        rows = uow.audit.scalars(
            select(m.AuditLog).where(m.AuditLog.target_id == target_id, m.AuditLog.action == action)
            .order_by(m.AuditLog.id)
        )
        return [SimpleNamespace(actor=r.actor, action=r.action, before=r.before, after=r.after) for r in rows]


def make_tenant(client: TestClient) -> dict:
    r = client.post("/admin/v1/tenants", json={"name": unique("t"), "display_name": "Tenant"})
    assert r.status_code == 201, r.text
    return r.json()


def make_model(client: TestClient, **over) -> dict:
    r = client.post("/admin/v1/models", json={"name": unique("tiny"), "source": "/models/tiny", **TINY_SHAPE, **over})
    assert r.status_code == 201, r.text
    return r.json()


def test_tenant_lifecycle_is_audited_and_versioned(client: TestClient, db, recorder) -> None:
    t = make_tenant(client)
    assert _audit(db, t["id"], "tenant.create")[0].after["name"] == t["name"]

    r = client.get(f"/admin/v1/tenants/{t['id']}")
    assert r.headers["etag"] == '"1"'

    r = client.patch(f"/admin/v1/tenants/{t['id']}", json={"display_name": "Renamed"}, headers={"If-Match": '"1"'})
    assert r.status_code == 200 and r.headers["etag"] == '"2"'
    row = _audit(db, t["id"], "tenant.update")[0]
    assert row.before["display_name"] == "Tenant" and row.after["display_name"] == "Renamed"
    assert row.actor == "admin:bootstrap"

    stale = client.patch(f"/admin/v1/tenants/{t['id']}", json={"display_name": "X"}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412
    assert stale.headers["content-type"].startswith("application/problem+json")
    assert stale.json()["status"] == 412 and stale.json()["code"] == "precondition_failed"

    r = client.post(f"/admin/v1/tenants/{t['id']}/suspend")
    assert r.json()["status"] == "suspended"
    assert ("tenant", uuid.UUID(t["id"])) in recorder.invalidations
    assert client.post(f"/admin/v1/tenants/{t['id']}/resume").json()["status"] == "active"

    listing = client.get("/admin/v1/tenants", params={"name": t["name"], "limit": 1}).json()
    assert listing["count"] == 1 and listing["data"][0]["id"] == t["id"]


def test_tenant_delete_takes_its_keys(client: TestClient, db) -> None:
    t = make_tenant(client)
    issued = client.post(f"/admin/v1/tenants/{t['id']}/keys", json={"name": "k1"}).json()
    assert issued["secret"].startswith("bt_live_")
    r = client.delete(f"/admin/v1/tenants/{t['id']}", headers={"If-Match": '"2"'})
    assert r.status_code == 412
    # a live key: its clients may be calling, so the operator must say force
    r = client.delete(f"/admin/v1/tenants/{t['id']}")
    assert r.status_code == 409 and r.json()["param"] == "force" and "1 live API keys" in r.json()["detail"]
    assert client.get(f"/admin/v1/tenants/{t['id']}").status_code == 200
    assert client.delete(f"/admin/v1/tenants/{t['id']}", params={"force": "true"}).status_code == 204
    assert client.get(f"/admin/v1/tenants/{t['id']}").status_code == 404
    with db.system() as uow:
        assert uow.api_keys.get(uuid.UUID(issued["key"]["id"])) is None
    before = _audit(db, t["id"], "tenant.delete")[0].before
    assert before["api_keys"] == [issued["key"]["id"]]


def test_keys_users_grants_and_limits(client: TestClient, db) -> None:
    t = make_tenant(client)
    tid = t["id"]
    model = make_model(client)
    assert client.put(f"/admin/v1/tenants/{tid}/models/{model['id']}").status_code == 204
    assert [x["id"] for x in client.get(f"/admin/v1/tenants/{tid}/models").json()] == [model["id"]]
    # a model is named by its name as well as by its id (as the CLI and the console name it)
    assert client.delete(f"/admin/v1/tenants/{tid}/models/{model['name']}").status_code == 204
    assert client.get(f"/admin/v1/tenants/{tid}/models").json() == []
    assert client.put(f"/admin/v1/tenants/{tid}/models/{model['name']}").status_code == 204
    assert [x["id"] for x in client.get(f"/admin/v1/tenants/{tid}/models").json()] == [model["id"]]
    missing = client.put(f"/admin/v1/tenants/{tid}/models/no-such-model")
    assert missing.status_code == 404 and "no-such-model" in missing.json()["detail"]

    k = client.post(f"/admin/v1/tenants/{tid}/keys", json={"name": "svc", "model_scope": [model["name"]]}).json()
    key_id = k["key"]["id"]
    assert "secret" not in client.get(f"/admin/v1/tenants/{tid}/keys/{key_id}").json()
    rotated = client.post(f"/admin/v1/tenants/{tid}/keys/{key_id}/rotate", json={"overlap_s": 60}).json()
    assert rotated["secret"] != k["secret"]
    revoked = client.post(f"/admin/v1/tenants/{tid}/keys/{rotated['key']['id']}/revoke").json()
    assert revoked["state"] == "revoked"
    bad_scope = client.post(f"/admin/v1/tenants/{tid}/keys", json={"name": "x", "model_scope": ["nope"]})
    assert bad_scope.status_code == 400 and bad_scope.json()["param"] == "model_scope"

    u = client.post(f"/admin/v1/tenants/{tid}/users",
                    json={"email": f"{unique('a')}@example.com", "password": "correct horse battery",
                          "role": "tenant_admin"})
    assert u.status_code == 201, u.text
    assert "password" not in str(_audit(db, u.json()["id"], "user.create")[0].after)
    assert client.patch(f"/admin/v1/tenants/{tid}/users/{u.json()['id']}", json={"disabled": True}).json()["disabled"]

    lim = client.put(f"/admin/v1/tenants/{tid}/rate-limit", json={"requests_per_minute": 60})
    assert lim.status_code == 200 and lim.json()["requests_per_minute"] == 60
    lim2 = client.put(f"/admin/v1/tenants/{tid}/rate-limit", json={"requests_per_minute": 30, "max_concurrency": 2})
    assert lim2.json()["id"] == lim.json()["id"]
    row = _audit(db, lim.json()["id"], "rate_limit.set")
    assert len(row) == 2 and {r.before["requests_per_minute"] if r.before else None for r in row} == {None, 60}
    klim = client.put(f"/admin/v1/tenants/{tid}/keys/{key_id}/rate-limit",
                      json={"tokens_per_minute": 1000, "max_tokens_per_request": 4096})
    assert klim.json()["api_key_id"] == key_id and klim.json()["max_tokens_per_request"] == 4096
    assert client.put(f"/admin/v1/tenants/{tid}/keys/{key_id}/rate-limit",
                      json={"max_tokens_per_request": 0}).status_code == 422
    assert len(client.get(f"/admin/v1/tenants/{tid}/rate-limits").json()) == 2
    assert client.put(f"/admin/v1/tenants/{tid}/rate-limit", json={"requests_per_minute": 0}).status_code == 422


def test_deployment_validation_generation_and_reconcile_trigger(client: TestClient, db, recorder) -> None:
    model = make_model(client)
    name = unique("dep")
    bad = client.post("/admin/v1/deployments", json={"name": name, "model_id": model["id"], "mode": "pd"})
    assert bad.status_code == 400 and "connector" in bad.json()["detail"]
    bad_engine = client.post("/admin/v1/deployments",
                             json={"name": name, "model_id": model["id"], "engine": {"no_such_setting": 1}})
    assert bad_engine.status_code == 400 and bad_engine.json()["param"].startswith("engine")
    missing = client.post("/admin/v1/deployments", json={"name": name, "model_id": str(uuid.uuid4())})
    assert missing.status_code == 404

    n = len(recorder.reconciles)
    r = client.post("/admin/v1/deployments", json={"name": name, "model_id": model["id"],
                                                   "engine": {"max_model_len": 512}})
    assert r.status_code == 201, r.text
    d = r.json()
    assert d["observed_state"] == "pending" and d["generation"] == 1
    assert len(recorder.reconciles) == n + 1

    cfg = client.get(f"/admin/v1/deployments/{d['id']}/serve-config").json()
    assert cfg["name"] == name and cfg["route_prefix"] == f"/{name}"
    assert cfg["import_path"] == "baton.dataplane.app:build_app"
    assert cfg["args"]["model"] == {"path": "/models/tiny", "served_name": model["name"], "kind": "generate",
                                    "tool_call_parser": None, "reasoning_parser": None, "chat_template": None}

    r = client.patch(f"/admin/v1/deployments/{d['id']}", headers={"If-Match": r.headers["etag"]},
                     json={"mode": "pd", "kv_connector": "nixl", "prefill": {"min": 1, "max": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["generation"] == 2 and r.json()["mode"] == "pd"
    cfg = client.get(f"/admin/v1/deployments/{d['id']}/serve-config").json()
    assert cfg["args"]["mode"] == "pd" and cfg["args"]["prefill"]["max"] == 2

    same = client.patch(f"/admin/v1/deployments/{d['id']}", json={"mode": "pd"})
    assert same.json()["generation"] == 2  # nothing changed: no new generation
    assert client.patch(f"/admin/v1/deployments/{d['id']}", json={"decode": {"min": 3, "max": 1}}).status_code == 400

    st = client.get(f"/admin/v1/deployments/{d['id']}/status").json()
    assert st["desired_state"] == "running" and st["up_to_date"] is False

    gone = client.delete(f"/admin/v1/deployments/{d['id']}")
    assert gone.status_code == 202 and gone.json()["desired_state"] == "deleted"
    assert client.patch(f"/admin/v1/deployments/{d['id']}", json={"mode": "aggregated"}).status_code == 409
    assert [a.action for a in _audit(db, d["id"], "deployment.update")] == ["deployment.update"]
    assert client.delete(f"/admin/v1/models/{model['id']}").status_code == 409


def test_a_deployment_that_served_lately_is_deleted_only_with_force(client: TestClient, db) -> None:
    import datetime as dt

    from baton.core import models as m

    model = make_model(client)
    name = unique("busy")
    d = client.post("/admin/v1/deployments", json={"name": name, "model_id": model["id"]}).json()
    t = make_tenant(client)
    with db.system() as uow:
        uow.requests.insert_many([{
            "id": uuid.uuid4(), "tenant_id": uuid.UUID(t["id"]), "model": model["name"], "deployment": name,
            "endpoint": "chat/completions", "stream": False, "status": m.RequestStatus.COMPLETED, "http_status": 200,
            "e2e_ms": 12.0, "started_at": dt.datetime.now(dt.UTC) - dt.timedelta(minutes=3),
            "finished_at": dt.datetime.now(dt.UTC) - dt.timedelta(minutes=3)}])
        uow.commit()
    r = client.delete(f"/admin/v1/deployments/{d['id']}")
    assert r.status_code == 409 and r.json()["param"] == "force" and "served 1 requests" in r.json()["detail"]
    assert client.get(f"/admin/v1/deployments/{d['id']}").json()["desired_state"] == "running"
    r = client.delete(f"/admin/v1/deployments/{d['id']}", params={"force": "true"})
    assert r.status_code == 202 and r.json()["desired_state"] == "deleted"
    assert client.delete(f"/admin/v1/deployments/{d['id']}").status_code == 202  # deleted already: idempotent


def test_a_models_serving_settings_reach_its_deployments_spec(client: TestClient, db) -> None:
    model = make_model(client, tool_call_parser="hermes", chat_template="{{ messages }}")
    assert (model["kind"], model["tool_call_parser"], model["reasoning_parser"]) == ("generate", "hermes", None)
    d = client.post("/admin/v1/deployments", json={"name": unique("srv"), "model_id": model["id"]}).json()
    args = client.get(f"/admin/v1/deployments/{d['id']}/serve-config").json()["args"]
    assert args["model"]["tool_call_parser"] == "hermes" and args["model"]["chat_template"] == "{{ messages }}"

    r = client.patch(f"/admin/v1/models/{model['id']}", json={"tool_call_parser": "", "reasoning_parser": "qwen3"})
    assert r.status_code == 200 and r.json()["tool_call_parser"] is None and r.json()["reasoning_parser"] == "qwen3"
    assert _audit(db, model["id"], "model.update")[0].after["reasoning_parser"] == "qwen3"
    args = client.get(f"/admin/v1/deployments/{d['id']}/serve-config").json()["args"]
    assert args["model"]["tool_call_parser"] is None and args["model"]["reasoning_parser"] == "qwen3"
    kind = client.patch(f"/admin/v1/models/{model['id']}", json={"kind": "embed"})
    assert kind.status_code == 409  # it has a deployment

    embed = make_model(client, kind="embed")
    bad = client.patch(f"/admin/v1/models/{embed['id']}", json={"tool_call_parser": "hermes"})
    assert bad.status_code == 400 and bad.json()["param"] == "tool_call_parser"
    assert client.post("/admin/v1/models", json={"name": unique("e"), "source": "/m", **TINY_SHAPE, "kind": "embed",
                                                 "reasoning_parser": "qwen3"}).status_code == 400
    pd = client.post("/admin/v1/deployments", json={"name": unique("epd"), "model_id": embed["id"], "mode": "pd",
                                                    "kv_connector": "nixl", "prefill": {"min": 1, "max": 1}})
    assert pd.status_code == 400 and "aggregated" in pd.json()["detail"]
    assert client.post("/admin/v1/models", json={"name": unique("x"), "source": "/m", **TINY_SHAPE,
                                                 "tool_call_parser": "Hermes!"}).status_code in (400, 422)


def test_slo_policy_assignment_and_admission(client: TestClient) -> None:
    t = make_tenant(client)
    model = make_model(client)
    p = client.post("/admin/v1/slo-policies", json={"name": unique("batch"), "ttft_ms": 5000, "tpot_ms": 200,
                                                    "priority": 10, "sheddable": True, "weight": 2.5}).json()
    gold = client.post("/admin/v1/slo-policies", json={"name": unique("gold"), "ttft_ms": 300, "tpot_ms": 30,
                                                       "priority": 90}).json()
    assert p["weight"] == 2.5 and gold["weight"] == 1.0
    assert client.get(f"/admin/v1/tenants/{t['id']}/admission").json()["slo_class"] == "default"
    a = client.post("/admin/v1/slo-assignments", json={"policy_id": p["id"], "tenant_id": t["id"]})
    assert a.status_code == 201
    assert client.post("/admin/v1/slo-assignments", json={"policy_id": p["id"]}).status_code == 422
    client.post("/admin/v1/slo-assignments", json={"policy_id": gold["id"], "tenant_id": t["id"],
                                                   "model_id": model["id"]})
    adm = client.get(f"/admin/v1/tenants/{t['id']}/admission").json()
    assert adm["sheddable"] is True and adm["shed_threshold"] < 1.0 and adm["weight"] == 2.5
    adm = client.get(f"/admin/v1/tenants/{t['id']}/admission", params={"model_id": model["id"]}).json()
    assert adm["slo_class"] == gold["name"] and adm["sheddable"] is False and adm["weight"] == 1.0
    dup = client.post("/admin/v1/slo-assignments", json={"policy_id": gold["id"], "tenant_id": t["id"]})
    assert dup.status_code == 409


def test_slo_policy_weight_is_updated_audited_and_validated(client: TestClient, db) -> None:
    p = client.post("/admin/v1/slo-policies", json={"name": unique("w"), "ttft_ms": 500, "tpot_ms": 50,
                                                    "weight": 3}).json()
    assert p["weight"] == 3.0
    assert _audit(db, p["id"], "slo_policy.create")[0].after["weight"] == 3.0
    r = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={"weight": 0.5}, headers={"If-Match": '"1"'})
    assert r.status_code == 200 and r.json()["weight"] == 0.5 and r.headers["etag"] == '"2"'
    assert client.get(f"/admin/v1/slo-policies/{p['id']}").json()["weight"] == 0.5
    row = _audit(db, p["id"], "slo_policy.update")[0]
    assert row.before["weight"] == 3.0 and row.after["weight"] == 0.5
    # a change of something else leaves the weight as it is
    r = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={"priority": 20})
    assert r.status_code == 200 and r.json()["weight"] == 0.5

    for weight in (0, 101):
        bad = client.post("/admin/v1/slo-policies", json={"name": unique("w"), "ttft_ms": 500, "tpot_ms": 50,
                                                          "weight": weight})
        assert bad.status_code == 422 and bad.headers["content-type"].startswith("application/problem+json")
        assert bad.json()["param"] == "weight"
        bad = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={"weight": weight})
        assert bad.status_code == 422 and bad.json()["param"] == "weight"
    assert client.get(f"/admin/v1/slo-policies/{p['id']}").json()["weight"] == 0.5


def test_slo_policy_queue_bounds_are_set_cleared_audited_and_validated(client: TestClient, db) -> None:
    p = client.post("/admin/v1/slo-policies", json={"name": unique("q"), "ttft_ms": 500, "tpot_ms": 50,
                                                    "max_wait_s": 5, "max_waiting": 3}).json()
    assert (p["max_wait_s"], p["max_waiting"]) == (5.0, 3)
    assert _audit(db, p["id"], "slo_policy.create")[0].after["max_waiting"] == 3
    plain = client.post("/admin/v1/slo-policies", json={"name": unique("q"), "ttft_ms": 500, "tpot_ms": 50}).json()
    assert (plain["max_wait_s"], plain["max_waiting"]) == (None, None)  # the gateway's settings apply
    # another field's change leaves them; an explicit null clears one, and only that one
    r = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={"priority": 30})
    assert r.status_code == 200 and (r.json()["max_wait_s"], r.json()["max_waiting"]) == (5.0, 3)
    r = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={"max_waiting": None, "max_wait_s": 2.5})
    assert r.status_code == 200 and (r.json()["max_wait_s"], r.json()["max_waiting"]) == (2.5, None)
    row = _audit(db, p["id"], "slo_policy.update")[-1]
    assert row.before["max_waiting"] == 3 and row.after["max_waiting"] is None
    # a null where null means nothing (a required field) changes nothing
    r = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={"weight": None})
    assert r.status_code == 200 and r.json()["weight"] == 1.0
    for field, value in (("max_wait_s", 0), ("max_wait_s", 3601), ("max_waiting", 0), ("max_waiting", 1.5)):
        bad = client.post("/admin/v1/slo-policies", json={"name": unique("q"), "ttft_ms": 500, "tpot_ms": 50,
                                                          field: value})
        assert bad.status_code == 422 and bad.json()["param"] == field, bad.text
        bad = client.patch(f"/admin/v1/slo-policies/{p['id']}", json={field: value})
        assert bad.status_code == 422 and bad.json()["param"] == field
    assert client.get(f"/admin/v1/slo-policies/{p['id']}").json()["max_wait_s"] == 2.5


def test_usage_and_requests_page_and_filter(client: TestClient, db) -> None:
    t = make_tenant(client)
    tid = uuid.UUID(t["id"])
    now = dt.datetime.now(dt.UTC)
    with db.system() as uow:
        uow.usage.insert_many([
            {"request_id": uuid.uuid4(), "tenant_id": tid, "model": "m1" if i % 2 else "m2",
             "prompt_tokens": 10, "completion_tokens": 5}
            for i in range(7)
        ])
        uow.requests.insert_many([
            {"id": uuid.uuid4(), "tenant_id": tid, "model": "m1", "endpoint": "chat", "stream": True,
             "status": m.RequestStatus.COMPLETED, "http_status": 200, "e2e_ms": 12.0,
             "started_at": now, "finished_at": now}
        ])
        uow.commit()
    page = client.get("/admin/v1/usage", params={"tenant_id": str(tid), "limit": 3, "offset": 0}).json()
    assert page["count"] == 7 and len(page["data"]) == 3
    page2 = client.get("/admin/v1/usage", params={"tenant_id": str(tid), "limit": 3, "offset": 6}).json()
    assert len(page2["data"]) == 1
    assert client.get("/admin/v1/usage", params={"tenant_id": str(tid), "model": "m1"}).json()["count"] == 3
    reqs = client.get("/admin/v1/requests", params={"tenant_id": str(tid), "status": "completed"}).json()
    assert reqs["count"] == 1
    assert client.get("/admin/v1/usage", params={"limit": 0}).status_code == 422


def test_admin_tokens(client: TestClient, admin_app) -> None:
    r = client.post("/admin/v1/admin-tokens", json={"name": unique("ops")})
    assert r.status_code == 201
    secret = r.json()["secret"]
    with TestClient(admin_app) as other:
        ok = other.get("/admin/v1/tenants", headers={"Authorization": f"Bearer {secret}"})
        assert ok.status_code == 200
        assert client.delete(f"/admin/v1/admin-tokens/{r.json()['token']['id']}").status_code == 204
        assert other.get("/admin/v1/tenants", headers={"Authorization": f"Bearer {secret}"}).status_code == 401


def test_plan_endpoint(client: TestClient) -> None:
    model = make_model(client, params_b=0.001)
    r = client.post(f"/admin/v1/models/{model['id']}/plan",
                    json={"ttft_ms": 500, "tpot_ms": 20, "prompt_tokens_mean": 1024, "output_tokens_mean": 64})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    assert body["recommended"] in {c["name"] for c in body["configs"]}
    assert body["plot_png_base64"]
    png = client.post(f"/admin/v1/models/{model['id']}/plan", params={"format": "png"})
    assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    svg = client.post(f"/admin/v1/models/{model['id']}/plan", params={"format": "svg"})
    assert b"<svg" in svg.content


# --- who may call --------------------------------------------------------------------------------

def _routes(app) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path.startswith("/admin/v1"):
            path = re.sub(r"\{[^}]+\}", str(uuid.uuid4()), route.path)
            out.extend((method, path) for method in route.methods)
    return out


def test_every_admin_route_refuses_tenant_keys_and_anonymous_callers(client: TestClient, admin_app) -> None:
    t = make_tenant(client)
    secret = client.post(f"/admin/v1/tenants/{t['id']}/keys", json={"name": "tenant-key"}).json()["secret"]
    routes = _routes(admin_app)
    assert len(routes) > 40
    with TestClient(admin_app) as anon:
        for method, path in routes:
            r = anon.request(method, path, headers={"Authorization": f"Bearer {secret}"})
            assert r.status_code == 403, (method, path, r.status_code)
            assert r.headers["content-type"].startswith("application/problem+json")
            r = anon.request(method, path, headers={"Authorization": "Bearer bt_live_made_up"})
            assert r.status_code == 403, (method, path)
            r = anon.request(method, path)
            assert r.status_code == 401, (method, path)
            assert r.headers.get("www-authenticate", "").startswith("Bearer")
            r = anon.request(method, path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401, (method, path)


@pytest.mark.parametrize("path", ["/admin/v1/tenants/not-a-uuid", "/admin/v1/deployments/1"])
def test_bad_path_parameters_are_problem_details(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 422
    assert r.json()["type"] == "urn:baton:error:invalid_request" and r.json()["errors"]  # the console's namespace too


def _file_request(db, tenant_id: str, model_id: str | None = None) -> str:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        row = uow.access_requests.add(m.AccessRequest(tenant_id=uuid.UUID(tenant_id), requested_by="console:a@x",
                                                      model_id=uuid.UUID(model_id) if model_id else None))
        uow.commit()
        return str(row.id)


def test_access_requests_are_answered_through_the_admin_api(client: TestClient, db, recorder) -> None:
    t, model = make_tenant(client), make_model(client)
    any_model = _file_request(db, t["id"])
    queue = client.get("/admin/v1/access-requests", params={"tenant_id": t["id"]}).json()
    assert [r["id"] for r in queue["data"]] == [any_model] and queue["data"][0]["state"] == "pending"
    assert queue["data"][0]["tenant_name"] == t["name"]

    # a request for any model needs the operator's choice
    r = client.post(f"/admin/v1/access-requests/{any_model}/approve")
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem+json")
    assert client.get(f"/admin/v1/tenants/{t['id']}/models").json() == []

    r = client.post(f"/admin/v1/access-requests/{any_model}/approve", json={"model_id": model["id"]})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "approved" and r.json()["model"] == model["name"]
    assert [g["id"] for g in client.get(f"/admin/v1/tenants/{t['id']}/models").json()] == [model["id"]]
    assert ("tenant", uuid.UUID(t["id"])) in recorder.invalidations
    assert _audit(db, any_model, "access_request.approve")[0].actor == "admin:bootstrap"
    # answered once: a second answer is a conflict, not a second grant
    assert client.post(f"/admin/v1/access-requests/{any_model}/decline").status_code == 409

    other = _file_request(db, t["id"], make_model(client)["id"])
    r = client.post(f"/admin/v1/access-requests/{other}/decline", json={"reason": "Pilot is full"})
    assert r.status_code == 200 and r.json()["state"] == "declined" and r.json()["reason"] == "Pilot is full"
    answered = client.get("/admin/v1/access-requests", params={"tenant_id": t["id"], "state": "all"}).json()
    assert {r["id"]: r["state"] for r in answered["data"]} == {any_model: "approved", other: "declined"}
    assert client.post(f"/admin/v1/access-requests/{uuid.uuid4()}/approve").status_code == 404
    assert client.get("/admin/v1/access-requests", params={"state": "lost"}).status_code == 422
