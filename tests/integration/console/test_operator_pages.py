"""Every operator page backend of the catalogue, SLO policies, the planner and the records, on real
Postgres through the real router: what each does, and how each refuses (a tenant's session, no CSRF
token, an unknown or malformed id, a conflicting state, an invalid body, a stale ETag)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import event

from baton.core import models as m
from baton.core.db import Database

from .conftest import Session, SignUp, add_model

API = "/console/api/ops"
SHAPE = {"source": "/nonexistent", "context_length": 2048, "num_layers": 2, "num_kv_heads": 2, "head_dim": 32,
         "dtype": "float32", "params_b": 0.01}
ID = "{id}"

#: (method, path, body) of every operator route of this module; ``{id}`` stands for a resource id.
READS = [("GET", "/overview"), ("GET", "/models"), ("GET", f"/models/{ID}"), ("GET", "/deployments"),
         ("GET", f"/deployments/{ID}"), ("GET", f"/deployments/{ID}/status"),
         ("GET", f"/deployments/{ID}/serve-config"), ("GET", "/slo-policies"), ("GET", f"/slo-policies/{ID}"),
         ("GET", "/requests"), ("GET", "/jobs"), ("GET", "/audit")]
WRITES = [("POST", "/models"), ("PATCH", f"/models/{ID}"), ("DELETE", f"/models/{ID}"),
          ("POST", f"/models/{ID}/plan"), ("POST", "/deployments"), ("POST", "/deployments/reconcile"),
          ("PATCH", f"/deployments/{ID}"), ("DELETE", f"/deployments/{ID}"), ("POST", "/slo-policies"),
          ("PATCH", f"/slo-policies/{ID}"), ("DELETE", f"/slo-policies/{ID}"), ("POST", "/slo-assignments"),
          ("DELETE", f"/slo-assignments/{ID}")]
WITH_ID = [(meth, path) for meth, path in READS + WRITES if ID in path]
#: A valid body for each route that takes one (so that only the id can be wrong).
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("PATCH", f"/models/{ID}"): {"source": "/elsewhere"},
    ("POST", f"/models/{ID}/plan"): {"ttft_ms": 500, "tpot_ms": 50},
    ("PATCH", f"/deployments/{ID}"): {"desired_state": "stopped"},
    ("PATCH", f"/slo-policies/{ID}"): {"ttft_ms": 900},
}


def _call(s: Session, method: str, path: str, *, json: Any = None, csrf: bool = True, **kw: Any) -> Any:
    headers = {"x-csrf-token": s.csrf} if csrf else {}
    headers.update(kw.pop("headers", {}))
    return s.client.request(method, API + path, json=json, headers=headers, **kw)


def _model(s: Session, **over: Any) -> dict[str, Any]:
    r = _call(s, "POST", "/models", json={"name": f"opm-{uuid.uuid4().hex[:8]}", **SHAPE, **over})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _deployment(s: Session, model_id: str, **over: Any) -> dict[str, Any]:
    r = _call(s, "POST", "/deployments", json={"name": f"opd-{uuid.uuid4().hex[:8]}", "model_id": model_id, **over})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _policy(s: Session, **over: Any) -> dict[str, Any]:
    r = _call(s, "POST", "/slo-policies", json={"name": f"opp-{uuid.uuid4().hex[:8]}", "ttft_ms": 500,
                                                "tpot_ms": 50, **over})
    assert r.status_code == 201, r.text
    return dict(r.json())


# --- what the new pages do ----------------------------------------------------------------------------

def test_model_get_update_delete(operator: Session, console_recorder) -> None:  # type: ignore[no-untyped-def]
    model = _model(operator)
    r = _call(operator, "GET", f"/models/{model['id']}")
    assert r.status_code == 200 and r.json() == model and r.headers["etag"] == '"1"'

    n = len(console_recorder.reconciles)
    stale = _call(operator, "PATCH", f"/models/{model['id']}", json={"source": "/new"}, headers={"if-match": '"7"'})
    assert stale.status_code == 412
    r = _call(operator, "PATCH", f"/models/{model['id']}", json={"source": "/new", "params_b": 0.02},
              headers={"if-match": '"1"'})
    assert r.status_code == 200, r.text
    assert r.json()["source"] == "/new" and r.json()["version"] == 2 and r.headers["etag"] == '"2"'
    assert console_recorder.reconciles[n:] == ["model changed"]

    assert _call(operator, "DELETE", f"/models/{model['id']}", headers={"if-match": '"1"'}).status_code == 412
    r = _call(operator, "DELETE", f"/models/{model['id']}")
    assert r.status_code == 204 and r.content == b""
    assert _call(operator, "GET", f"/models/{model['id']}").status_code == 404


def test_deployment_get_status_serve_config_and_reconcile(operator: Session,
                                                          console_recorder) -> None:  # type: ignore[no-untyped-def]
    model = _model(operator)
    dep = _deployment(operator, model["id"])
    r = _call(operator, "GET", f"/deployments/{dep['id']}")
    assert r.status_code == 200 and r.headers["etag"] == f'"{dep["version"]}"'
    assert r.json() == {**dep, "model": model["name"]}

    st = _call(operator, "GET", f"/deployments/{dep['id']}/status").json()
    assert st == {"id": dep["id"], "name": dep["name"], "desired_state": "running", "observed_state": "pending",
                  "observed_reason": None, "observed_at": None, "generation": 1, "observed_generation": 0,
                  "up_to_date": False}
    cfg = _call(operator, "GET", f"/deployments/{dep['id']}/serve-config").json()
    assert cfg["name"] == dep["name"] and cfg["args"]["model"]["served_name"] == model["name"]

    r = _call(operator, "POST", "/deployments/reconcile")
    assert r.status_code == 202 and r.json() == {"status": "queued"}
    assert console_recorder.reconciles[-1] == f"requested by console:{operator.email}"


def test_policy_get_update_delete_and_assignment_delete(operator: Session, sign_up: SignUp,
                                                        console_recorder) -> None:  # type: ignore[no-untyped-def]
    t = sign_up()
    pol = _policy(operator, weight=2.5)
    assert pol["weight"] == 2.5
    r = _call(operator, "GET", f"/slo-policies/{pol['id']}")
    assert r.status_code == 200 and r.json() == pol

    r = _call(operator, "PATCH", f"/slo-policies/{pol['id']}", json={"ttft_ms": 800, "sheddable": True, "weight": 4},
              headers={"if-match": '"1"'})
    assert r.status_code == 200 and r.json()["ttft_ms"] == 800 and r.json()["sheddable"] is True
    assert r.json()["weight"] == 4.0
    assert _call(operator, "GET", f"/slo-policies/{pol['id']}").json()["weight"] == 4.0
    assert console_recorder.reconciles[-1] == "SLO policy changed"
    assert console_recorder.invalidations[-1] == ("all", None)

    a = _call(operator, "POST", "/slo-assignments", json={"policy_id": pol["id"], "tenant_id": str(t.tenant_id)})
    assert a.status_code == 201, a.text
    r = _call(operator, "DELETE", f"/slo-assignments/{a.json()['id']}")
    assert r.status_code == 204
    assert console_recorder.invalidations[-1] == ("tenant", t.tenant_id)
    listing = _call(operator, "GET", "/slo-policies").json()
    assert all(x["id"] != a.json()["id"] for x in listing["assignments"])
    assert [x["weight"] for x in listing["policies"] if x["id"] == pol["id"]] == [4.0]

    assert _call(operator, "DELETE", f"/slo-policies/{pol['id']}", headers={"if-match": '"1"'}).status_code == 412
    assert _call(operator, "DELETE", f"/slo-policies/{pol['id']}").status_code == 204
    assert _call(operator, "GET", f"/slo-policies/{pol['id']}").status_code == 404


def test_requests_and_jobs_are_listed_read_only(operator: Session, sign_up: SignUp, db: Database) -> None:
    t = sign_up()
    assert t.tenant_id is not None
    rid, now = uuid.uuid4(), dt.datetime.now(dt.UTC)
    dep_name = f"opd-{uuid.uuid4().hex[:8]}"
    with db.system() as uow:
        uow.requests.insert_many([{
            "id": rid, "tenant_id": t.tenant_id, "model": "m", "deployment": dep_name, "endpoint": "/v1/chat",
            "stream": True, "status": m.RequestStatus.COMPLETED, "http_status": 200, "e2e_ms": 12.0,
            "trace_id": "cd" * 16, "started_at": now, "finished_at": now,
        }])
        job = uow.jobs.add(m.Job(kind=f"test-{uuid.uuid4().hex[:6]}", payload={"reason": "test"}))
        uow.commit()
    r = _call(operator, "GET", "/requests", params={"deployment": dep_name})
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 1 and r.json()["data"][0]["id"] == str(rid)
    assert _call(operator, "GET", "/requests", params={"trace_id": "cd" * 16, "tenant_id": str(t.tenant_id)}
                 ).json()["count"] == 1
    assert _call(operator, "GET", "/requests", params={"limit": 0}).status_code == 400
    jobs = _call(operator, "GET", "/jobs", params={"kind": job.kind}).json()
    assert jobs["count"] == 1 and jobs["data"][0]["id"] == str(job.id) and jobs["data"][0]["status"] == "queued"
    assert _call(operator, "GET", "/jobs", params={"status": "nope"}).status_code == 400
    for path in ("/requests", "/jobs"):
        assert _call(operator, "POST", path, json={}).status_code == 405


def test_audit_rows_name_their_target_and_tenant_in_one_query(operator: Session, sign_up: SignUp,
                                                              db: Database) -> None:
    t = sign_up()
    model = _model(operator)
    pol = _policy(operator)
    a = _call(operator, "POST", "/slo-assignments", json={"policy_id": pol["id"], "tenant_id": str(t.tenant_id)})
    gone = _model(operator)
    assert _call(operator, "DELETE", f"/models/{gone['id']}").status_code == 204

    rows = _call(operator, "GET", "/audit", params={"actor": f"console:{operator.email}"}).json()["data"]
    named = {(x["action"], x["target_id"]): (x["target_name"], x["tenant_name"]) for x in rows}
    assert named[("model.create", model["id"])] == (model["name"], None)
    assert named[("slo_policy.create", pol["id"])] == (pol["name"], None)
    assert named[("slo_assignment.create", a.json()["id"])] == (pol["name"], f"{t.email.split('@')[1].split('.')[0]}")
    assert named[("model.delete", gone["id"])] == (gone["name"], None)  # gone: named from the entry itself

    # a tenant's requests for access: named by the model asked for, or "any model"
    for model_id in (model["id"], None):
        r = t.post("/console/api/tenant/access-requests", json={"model_id": model_id})
        assert r.status_code in (201, 409), r.text  # a sign-up without a default grant already asked for any
    asked = _call(operator, "GET", "/audit", params={"action": "access_request.create",
                                                    "tenant_id": str(t.tenant_id)}).json()["data"]
    assert sorted(x["target_name"] for x in asked) == sorted(["any model", model["name"]])
    assert {x["tenant_name"] for x in asked} == {t.email.split("@")[1].split(".")[0]}

    # the names of a whole page take one statement, however many rows and kinds it holds
    statements: list[str] = []

    def count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        statements.append(statement)

    with db.system() as uow:
        page, _ = uow.audit.page(uow.audit.query(), limit=200, offset=0)
        event.listen(db.engine, "before_cursor_execute", count)
        try:
            names = uow.audit.names(page)
        finally:
            event.remove(db.engine, "before_cursor_execute", count)
    assert len(names) == len(page) and len(statements) == 1


def test_the_audit_log_keeps_apart_what_people_changed_and_what_baton_did(operator: Session, db: Database) -> None:
    model = _model(operator)
    with db.system() as uow:  # what the reconciler records about every deployment it sees
        uow.audit.record(actor="system:reconciler", action="deployment.observed", target_type="model",
                         target_id=model["id"])
        uow.commit()
    seen: dict[str | None, list[tuple[str, str]]] = {}
    for by in ("people", "platform", None):
        params = {"target_id": model["id"]} | ({"by": by} if by else {})
        rows = _call(operator, "GET", "/audit", params=params).json()["data"]
        seen[by] = sorted((x["actor"], x["action"]) for x in rows)
    mine = (f"console:{operator.email}", "model.create")
    assert seen == {"people": [mine], "platform": [("system:reconciler", "deployment.observed")],
                    None: sorted([mine, ("system:reconciler", "deployment.observed")])}
    assert _call(operator, "GET", "/audit", params={"by": "robots"}).status_code == 400


def test_the_admin_audit_log_names_targets_too(operator: Session, db: Database, settings) -> None:  # type: ignore[no-untyped-def]
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from baton.api.admin.deps import AdminContext
    from baton.api.admin.router import router
    from baton.api.composition import AppServices
    from baton.control.usecase import RecordingNotifier

    model = _model(operator)
    admin_settings = settings.model_copy(update={
        "security": settings.security.model_copy(update={"admin_token": SecretStr("audit-names-token")})})
    app = FastAPI()
    app.include_router(router, prefix="/admin/v1")
    app.state.admin = AdminContext.of(AppServices.build(admin_settings, db, notify=RecordingNotifier()))
    with TestClient(app, headers={"Authorization": "Bearer audit-names-token"}) as c:
        r = c.get("/admin/v1/audit", params={"target_id": model["id"]})
    assert r.status_code == 200, r.text
    assert [(x["action"], x["target_name"]) for x in r.json()["data"]] == [("model.create", model["name"])]


def test_the_planner_does_not_calibrate_from_a_saturated_box(operator: Session, sign_up: SignUp, db: Database) -> None:
    t = sign_up()
    assert t.tenant_id is not None
    model = add_model(db)
    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with db.system() as uow:  # 371 requests queued ~6.4 s each, their answers flushed at once
        uow.requests.insert_many([{
            "id": uuid.uuid4(), "tenant_id": t.tenant_id, "model": model.name, "endpoint": "/v1/chat/completions",
            "stream": True, "status": m.RequestStatus.COMPLETED, "http_status": 200, "prompt_tokens": 512,
            "completion_tokens": 128, "ttft_ms": 6400.0, "tpot_ms": 0.03, "e2e_ms": 6404.0,
            "started_at": t0 + dt.timedelta(seconds=i * 0.1),
            "finished_at": t0 + dt.timedelta(seconds=i * 0.1 + 6.404),
        } for i in range(371)])
        uow.commit()
    r = _call(operator, "POST", f"/models/{model.id}/plan",
              json={"ttft_ms": 1000, "tpot_ms": 50, "prompt_tokens_mean": 512, "output_tokens_mean": 128})
    assert r.status_code == 200, r.text
    body = r.json()
    cal = body["calibration"]
    assert cal["samples"] == 371 and cal["used"] is False and cal["used_samples"] == 0
    assert cal["rejected"] == {"coalesced": 371} and "settings" in cal["reason"]
    assert body["calibrated_from"] == 0
    assert body["feasible"] is True and body["recommendation"]["goodput_per_gpu"] > 0


# --- how they refuse ------------------------------------------------------------------------------------

def _path(path: str, id_: object | None = None) -> str:
    return path.replace(ID, str(id_ or uuid.uuid4()))


@pytest.mark.parametrize(("method", "path"), READS + WRITES)
def test_a_tenant_session_is_refused(sign_up: SignUp, method: str, path: str) -> None:
    s = sign_up()
    r = _call(s, method, _path(path), json=BODIES.get((method, path), {}))
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == "Only platform operators may open this page."


@pytest.mark.parametrize(("method", "path"), WRITES)
def test_a_change_without_the_csrf_token_is_refused(operator: Session, method: str, path: str) -> None:
    r = _call(operator, method, _path(path), json=BODIES.get((method, path), {}), csrf=False)
    assert r.status_code == 403, r.text
    assert r.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(("method", "path"), WITH_ID)
def test_an_unknown_id_is_404(operator: Session, method: str, path: str) -> None:
    r = _call(operator, method, _path(path), json=BODIES.get((method, path)))
    assert r.status_code == 404, r.text
    assert r.json()["detail"].startswith("No ")


@pytest.mark.parametrize(("method", "path"), WITH_ID)
def test_a_malformed_id_is_400_in_plain_words(operator: Session, method: str, path: str) -> None:
    r = _call(operator, method, _path(path, "not-an-id"), json=BODIES.get((method, path)))
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "not a valid id" in detail and "Input should" not in detail and "UUID" not in detail


def test_conflicting_states_are_409(operator: Session, sign_up: SignUp) -> None:
    t = sign_up()
    model = _model(operator)
    dup = _call(operator, "POST", "/models", json={"name": model["name"], **SHAPE})
    assert dup.status_code == 409 and "already exists" in dup.json()["detail"]

    dep = _deployment(operator, model["id"])
    r = _call(operator, "DELETE", f"/models/{model['id']}")
    assert r.status_code == 409 and "deployments" in r.json()["detail"]
    again = _call(operator, "POST", "/deployments", json={"name": dep["name"], "model_id": model["id"]})
    assert again.status_code == 409

    assert _call(operator, "DELETE", f"/deployments/{dep['id']}").status_code == 200
    r = _call(operator, "PATCH", f"/deployments/{dep['id']}", json={"desired_state": "stopped"})
    assert r.status_code == 409 and r.json()["detail"] == "This deployment is being deleted."
    # the row is still there until the reconciler removes it: the model is still in use
    assert _call(operator, "DELETE", f"/models/{model['id']}").status_code == 409

    pol = _policy(operator)
    assert _call(operator, "POST", "/slo-policies", json={"name": pol["name"], "ttft_ms": 1, "tpot_ms": 1}
                 ).status_code == 409
    body = {"policy_id": pol["id"], "tenant_id": str(t.tenant_id)}
    assert _call(operator, "POST", "/slo-assignments", json=body).status_code == 201
    r = _call(operator, "POST", "/slo-assignments", json=body)
    assert r.status_code == 409 and "already assigned" in r.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body", "param"), [
    ("POST", "/models", {"name": "x"}, "source"),
    ("POST", "/models", {"name": "bad name!", **SHAPE}, "name"),
    ("PATCH", f"/models/{ID}", {"dtype": "float64"}, "dtype"),
    ("PATCH", f"/models/{ID}", {"nope": 1}, "nope"),
    ("POST", f"/models/{ID}/plan", {"ttft_ms": -1}, "ttft_ms"),
    ("POST", f"/models/{ID}/plan", {"ratios": [[0, 1]]}, "ratios"),
    ("POST", "/deployments", {"name": "Bad Name", "model_id": str(uuid.uuid4())}, "name"),
    ("PATCH", f"/deployments/{ID}", {"mode": "sideways"}, "mode"),
    ("PATCH", f"/deployments/{ID}", {"decode": {"min": 3, "max": 1}}, "decode"),
    ("POST", "/slo-policies", {"name": "p", "ttft_ms": 0, "tpot_ms": 1}, "ttft_ms"),
    ("PATCH", f"/slo-policies/{ID}", {"percentile": 101}, "percentile"),
    ("POST", "/slo-policies", {"name": "p", "ttft_ms": 1, "tpot_ms": 1, "weight": 0}, "weight"),
    ("POST", "/slo-policies", {"name": "p", "ttft_ms": 1, "tpot_ms": 1, "weight": 101}, "weight"),
    ("PATCH", f"/slo-policies/{ID}", {"weight": 0}, "weight"),
    ("PATCH", f"/slo-policies/{ID}", {"weight": 101}, "weight"),
    ("POST", "/slo-assignments", {"policy_id": str(uuid.uuid4())}, None),
])
def test_an_invalid_body_is_400(operator: Session, method: str, path: str, body: dict[str, Any],
                                param: str | None) -> None:
    model = _model(operator)
    ids = {"/models": model["id"], "/deployments": _deployment(operator, model["id"])["id"] if "/deployments/" in path
           else None, "/slo-policies": _policy(operator)["id"] if "/slo-policies/" in path else None}
    target = next((v for k, v in ids.items() if path.startswith(k + "/") and v), None)
    r = _call(operator, method, _path(path, target), json=body)
    assert r.status_code == 400, r.text
    doc = r.json()
    assert doc["status"] == 400 and doc["detail"] and "Input should" not in doc["detail"]
    if param is not None:
        assert doc["param"].split(".")[0].split("[")[0] == param, doc
