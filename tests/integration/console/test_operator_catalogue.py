"""The console's operator pages for models, deployments and SLO policies call the control plane's use
cases directly: the admin API's validation, preconditions and audit rows, acting as ``console:<email>``."""

from __future__ import annotations

import uuid

from baton.core.db import Database

from .conftest import Session, SignUp

API = "/console/api"


def test_operator_catalogue_round_trip(operator: Session, sign_up: SignUp, db: Database,
                                       console_recorder) -> None:  # type: ignore[no-untyped-def]
    t = sign_up()
    mname = f"op-model-{uuid.uuid4().hex[:6]}"
    r = operator.post(f"{API}/ops/models", json={"name": mname, "source": "/nonexistent", "context_length": 2048,
                                                 "num_layers": 2, "num_kv_heads": 2, "head_dim": 32,
                                                 "dtype": "float32", "params_b": 0.01},
                      headers={"x-request-id": "op-req-1"})
    assert r.status_code == 201, r.text
    model = r.json()
    assert model["name"] == mname and model["version"] == 1
    assert any(x["id"] == model["id"] for x in operator.get(f"{API}/ops/models").json())

    name = f"d-{uuid.uuid4().hex[:8]}"
    r = operator.post(f"{API}/ops/deployments", json={"name": name, "model_id": model["id"]})
    assert r.status_code == 201, r.text
    dep = r.json()
    assert dep["model"] == mname and dep["generation"] == 1

    stale = operator.patch(f"{API}/ops/deployments/{dep['id']}", json={"decode": {"min": 1, "max": 2}},
                           headers={"if-match": '"999"'})
    assert stale.status_code == 412, stale.text
    r = operator.patch(f"{API}/ops/deployments/{dep['id']}", json={"decode": {"min": 1, "max": 2}},
                       headers={"if-match": f'"{dep["version"]}"'})
    assert r.status_code == 200, r.text
    assert r.json()["decode"] == {"min": 1, "max": 2} and r.json()["generation"] == 2
    assert "deployment changed" in console_recorder.reconciles
    bad = operator.patch(f"{API}/ops/deployments/{dep['id']}", json={"decode": {"min": 3, "max": 2}})
    assert bad.status_code == 400 and bad.json()["param"] == "decode"

    pol = operator.post(f"{API}/ops/slo-policies", json={"name": f"p-{uuid.uuid4().hex[:6]}", "ttft_ms": 400,
                                                         "tpot_ms": 40}).json()
    a = operator.post(f"{API}/ops/slo-assignments", json={"policy_id": pol["id"], "tenant_id": str(t.tenant_id)})
    assert a.status_code == 201, a.text
    listing = operator.get(f"{API}/ops/slo-policies").json()
    assert any(p["id"] == pol["id"] for p in listing["policies"])
    assert any(x["id"] == a.json()["id"] for x in listing["assignments"])
    assert ("tenant", t.tenant_id) in console_recorder.invalidations

    r = operator.client.delete(f"{API}/ops/deployments/{dep['id']}", headers={"x-csrf-token": operator.csrf})
    assert r.status_code == 200, r.text
    assert r.json()["desired_state"] == "deleted"

    audit = operator.get(f"{API}/ops/audit", params={"limit": 500}).json()["data"]
    mine = {(x["action"], x["target_id"]) for x in audit if x["actor"] == f"console:{operator.email}"}
    assert {("model.create", model["id"]), ("deployment.create", dep["id"]), ("deployment.update", dep["id"]),
            ("deployment.delete", dep["id"]), ("slo_policy.create", pol["id"]),
            ("slo_assignment.create", a.json()["id"])} <= mine
    with db.system() as uow:
        row = next(x for x in uow.audit.page(uow.audit.query(target_type="model"), limit=500, offset=0)[0]
                   if x.target_id == model["id"])
        assert row.request_id == "op-req-1"
