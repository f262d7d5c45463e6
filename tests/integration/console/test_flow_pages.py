"""The console's flow-control pages on real Postgres and Redis: the operators' merged queues (``/ops/flow``),
a tenant's service levels under flow control (``/tenant/flow``), and the queue wait and SLO class of its
request records."""

from __future__ import annotations

import datetime as dt
import time
import uuid

from baton.core import models as m
from baton.core.contracts import FLOW_VIEW_INDEX, flow_view_key, flow_view_message, indexed_set
from baton.core.db import Database

from .conftest import Session, SignUp, add_model, grant

API = "/console/api"


def test_operators_see_the_merged_queues_with_tenant_names(console_app, operator: Session,  # type: ignore[no-untyped-def]
                                                          sign_up: SignUp) -> None:
    s = sign_up()
    redis = console_app.state.console.redis
    model = f"flow-{uuid.uuid4().hex[:8]}"
    process = f"test-{uuid.uuid4().hex[:6]}"
    row = {"tenant_id": str(s.tenant_id), "running": 2, "waiting": 3, "prompt_tokens": 50, "completion_tokens": 10,
           "queued_s": 0.7, "rejected": {"queue_full": 1}}
    view = [{"model": model, "limit": 2, "running": 2, "waiting": 3, "bands": {"50": 3}, "dispatch_per_s": 1.5,
             "upstream_ttft_s": 0.1, "tenants": [row]}]
    pipe = redis.pipeline(transaction=False)
    indexed_set(pipe, FLOW_VIEW_INDEX, flow_view_key(process), flow_view_message(process, view), 30,
                now=time.time())
    pipe.execute()
    try:
        r = operator.get(f"{API}/ops/flow")
        assert r.status_code == 200, r.text
        body = r.json()
        assert process in body["processes"]
        (mine,) = [x for x in body["models"] if x["model"] == model]
        assert (mine["limit"], mine["running"], mine["waiting"]) == (2, 2, 3)
        assert mine["bands"] == [{"priority": 50, "waiting": 3}]
        (t,) = mine["tenants"]
        assert t["tenant_name"].startswith("t-") and t["display_name"].startswith("Org ")
        assert t["token_share"] == 1.0 and t["rejected"] == {"queue_full": 1}
    finally:
        redis.delete(flow_view_key(process))
    denied = s.get(f"{API}/ops/flow")
    assert denied.status_code == 403


def _rec(db: Database, tenant_id: uuid.UUID, model: str, *, status: str = "completed", http: int = 200,
         code: str | None = None, ttft: float | None = None, queue_ms: float | None = None,
         cls: str | None = None, minutes_ago: float = 5) -> uuid.UUID:
    rid = uuid.uuid4()
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago)
    with db.tenant(tenant_id) as uow:
        uow.requests.insert_many([{
            "id": rid, "tenant_id": tenant_id, "model": model, "endpoint": "/v1/chat/completions",
            "stream": True, "status": status, "http_status": http, "error_code": code, "ttft_ms": ttft,
            "e2e_ms": (ttft or 0) + 10, "queue_ms": queue_ms, "flow_class": cls, "started_at": start,
            "finished_at": start + dt.timedelta(seconds=1),
        }])
        uow.commit()
    return rid


def test_a_tenants_service_levels_under_flow_control(sign_up: SignUp, db: Database) -> None:
    s, other = sign_up(), sign_up()
    assert s.tenant_id is not None
    model = add_model(db)
    grant(db, s.tenant_id, model.id)
    gold = f"gold-{uuid.uuid4().hex[:6]}"
    with db.system() as uow:
        pol = uow.slo_policies.add(m.SloPolicy(name=gold, ttft_ms=100, tpot_ms=20))
        uow.slo_assignments.add(m.SloAssignment(policy_id=pol.id, tenant_id=s.tenant_id))
        uow.commit()
    queued = _rec(db, s.tenant_id, model.name, ttft=50, queue_ms=10, cls=gold)
    _rec(db, s.tenant_id, model.name, ttft=500, queue_ms=30, cls=gold)  # misses TTFT
    _rec(db, s.tenant_id, model.name, status="failed", http=429, code="model_overloaded", queue_ms=3000, cls=gold)
    _rec(db, s.tenant_id, model.name, status="failed", http=503, code="model_unavailable", cls=gold)
    _rec(db, s.tenant_id, model.name, ttft=40)  # before flow control: no wait, no class
    _rec(db, s.tenant_id, model.name, ttft=40, queue_ms=0, cls=gold, minutes_ago=180)  # outside the hour

    out = s.get(f"{API}/tenant/flow", params={"hours": 1}).json()
    (mm,) = out["models"]
    assert mm["model"] == model.name and mm["requests"] == 5 and mm["queued"] == 3
    assert mm["refused"] == 1 and mm["unavailable"] == 1
    assert mm["queue_ms"]["p50"] == 30 and 2900 < mm["queue_ms"]["p99"] <= 3000
    assert mm["policy"] == {"name": gold, "ttft_ms": 100}
    assert mm["ttft_met"] == 2 and mm["ttft_attainment"] == 2 / 5
    classes = {c["flow_class"]: c for c in mm["classes"]}
    assert set(classes) == {gold, None}
    assert classes[gold]["requests"] == 4 and classes[gold]["refused"] == 1 and classes[gold]["queued"] == 3
    assert classes[None]["requests"] == 1 and classes[None]["queue_ms"] == {"p50": None, "p99": None}
    day = s.get(f"{API}/tenant/flow", params={"hours": 24}).json()["models"][0]
    assert day["requests"] == 6 and day["ttft_met"] == 3

    listed = s.get(f"{API}/tenant/requests").json()["data"]
    assert {(r["queue_ms"], r["flow_class"]) for r in listed} >= {(3000.0, gold), (None, None)}
    detail = s.get(f"{API}/tenant/requests/{queued}").json()
    assert detail["queue_ms"] == 10 and detail["flow_class"] == gold

    assert other.get(f"{API}/tenant/flow").json()["models"] == []
    assert s.get(f"{API}/tenant/flow", params={"hours": 0}).status_code in (400, 422)


def test_operator_request_records_show_the_queue_wait(operator: Session, sign_up: SignUp, db: Database) -> None:
    s = sign_up()
    assert s.tenant_id is not None
    _rec(db, s.tenant_id, "some-model", ttft=20, queue_ms=42.0, cls="default")
    data = operator.get(f"{API}/ops/requests", params={"tenant_id": str(s.tenant_id)}).json()["data"]
    assert [(r["queue_ms"], r["flow_class"]) for r in data] == [(42.0, "default")]
