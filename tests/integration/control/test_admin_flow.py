"""``GET /admin/v1/flow`` on real Postgres and Redis: the gateway processes' views merged per model and
tenant, tenants named from Postgres; admin-only. And the request records' flow-control fields.

The views live in a Redis database of their own here (gateways of a test run beside this one write theirs
to the usual one)."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from baton.core.contracts import (
    ENGINE_LOAD_INDEX,
    ENGINE_LOAD_PREFIX,
    FLOW_VIEW_INDEX,
    FLOW_VIEW_PREFIX,
    EngineLoad,
    engine_load_key,
    engine_load_message,
    flow_view_key,
    flow_view_message,
    indexed_set,
)

from .conftest import ADMIN_TOKEN, unique

#: The Redis database this module's views live in.
FLOW_DB = 14


def _clear(r) -> None:  # type: ignore[no-untyped-def]
    for prefix in (FLOW_VIEW_PREFIX, ENGINE_LOAD_PREFIX):
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)
    r.delete(FLOW_VIEW_INDEX, ENGINE_LOAD_INDEX)


def _put(r, index: str, key: str, value: bytes) -> None:  # type: ignore[no-untyped-def]
    pipe = r.pipeline(transaction=False)
    indexed_set(pipe, index, key, value, 60, now=time.time())
    pipe.execute()


@pytest.fixture(scope="module")
def flow_redis(admin_settings) -> Iterator[object]:  # type: ignore[no-untyped-def]
    import redis

    url = urlsplit(admin_settings.redis.url)._replace(path=f"/{FLOW_DB}").geturl()
    r = redis.Redis.from_url(url)
    _clear(r)
    yield r
    _clear(r)
    r.close()


@pytest.fixture(scope="module")
def flow_client(admin_settings, db, recorder, flow_redis) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    from fastapi import FastAPI

    from baton.api.admin.deps import AdminContext
    from baton.api.admin.router import router
    from baton.api.composition import AppServices

    app = FastAPI()
    app.include_router(router, prefix="/admin/v1")
    app.state.admin = AdminContext.of(AppServices.build(admin_settings, db, redis_client=flow_redis, notify=recorder))
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        yield c


def _tenant_row(tid: str, **kw: object) -> dict[str, object]:
    return {"tenant_id": tid, "running": 0, "waiting": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "queued_s": 0.0, "rejected": {}, **kw}


def test_two_processes_views_merge_per_model_and_tenant(flow_client: TestClient, flow_redis) -> None:  # type: ignore[no-untyped-def]
    _clear(flow_redis)
    t1 = flow_client.post("/admin/v1/tenants", json={"name": unique("fa"), "display_name": "Flow A"}).json()
    t2 = flow_client.post("/admin/v1/tenants", json={"name": unique("fb"), "display_name": "Flow B"}).json()
    gone = str(uuid.uuid4())
    model = unique("flow-model")
    a = [{"model": model, "limit": 4, "running": 3, "waiting": 2, "bands": {"80": 1, "50": 1},
          "dispatch_per_s": 2.0, "upstream_ttft_s": 0.2, "gradient": 1.2, "tpot_floor_s": 0.01, "tpot_s": 0.012,
          "engine_pressure": "decode engines queue 2.0 beside 3.0 running",
          "tenants": [_tenant_row(t1["id"], running=2, waiting=1, prompt_tokens=300, completion_tokens=100,
                                  queued_s=1.5, rejected={"queue_full": 1}),
                      _tenant_row(t2["id"], running=1, waiting=1, prompt_tokens=100, queued_s=0.5)]}]
    b = [{"model": model, "limit": 2, "running": 1, "waiting": 0, "bands": {"50": 0}, "dispatch_per_s": 1.0,
          "upstream_ttft_s": 0.3, "tenants": [_tenant_row(t1["id"], running=1, prompt_tokens=100,
                                                         completion_tokens=200, rejected={"ttl": 2}),
                                              _tenant_row(gone, waiting=0)]},
         {"model": "warming-up", "limit": None, "running": 1, "waiting": 0, "bands": {}, "dispatch_per_s": None,
          "upstream_ttft_s": None, "tenants": []}]
    _put(flow_redis, FLOW_VIEW_INDEX, flow_view_key("gw-a:1"), flow_view_message("gw-a:1", a))
    _put(flow_redis, FLOW_VIEW_INDEX, flow_view_key("gw-b:2"), flow_view_message("gw-b:2", b))
    _put(flow_redis, FLOW_VIEW_INDEX, flow_view_key("gw-broken:3"), b"not json")
    # a view whose key expired (or was never there) is left out, its index entry notwithstanding
    _put(flow_redis, FLOW_VIEW_INDEX, flow_view_key("gw-gone:4"), flow_view_message("gw-gone:4", a))
    flow_redis.delete(flow_view_key("gw-gone:4"))
    # keys that only look like views are not views: readers never scan the keyspace
    flow_redis.set(flow_view_key("gw-unindexed:5"), flow_view_message("gw-unindexed:5", a), ex=60)
    # the engines' own load reports, as baton.dataplane.engine_load writes them (one model has no gateway view)
    now = time.time()
    for load in (EngineLoad(model=model, engine="h:11", role="prefill", running=1.0, waiting=0.0, kv_usage=0.1,
                            steps=9, at=now - 0.4),
                 EngineLoad(model=model, engine="h:12", role="decode", running=3.0, waiting=2.0, kv_usage=0.5,
                            steps=9, at=now - 0.2),
                 EngineLoad(model="idle-model", engine="h:13", role="both", running=0.0, waiting=0.0, kv_usage=0.0,
                            steps=1, at=now - 20)):
        _put(flow_redis, ENGINE_LOAD_INDEX, engine_load_key(load.model, load.engine), engine_load_message(load))
    _put(flow_redis, ENGINE_LOAD_INDEX, ENGINE_LOAD_PREFIX + "broken:1", b"{")

    r = flow_client.get("/admin/v1/flow")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["processes"] == ["gw-a:1", "gw-b:2"]
    by_model = {m["model"]: m for m in body["models"]}
    assert set(by_model) == {model, "warming-up", "idle-model"}
    assert [(e["engine"], e["role"]) for e in by_model["idle-model"]["engines"]] == [("h:13", "both")]
    assert by_model["idle-model"]["engines"][0]["age_s"] >= 19 and by_model["idle-model"]["processes"] == []
    assert by_model["warming-up"]["limit"] is None and by_model["warming-up"]["running"] == 1
    m = by_model[model]
    assert (m["limit"], m["running"], m["waiting"], m["dispatch_per_s"]) == (6, 4, 2, 3.0)
    assert m["bands"] == [{"priority": 80, "waiting": 1}, {"priority": 50, "waiting": 1}]
    assert m["rejected"] == {"queue_full": 1, "ttl": 2}
    assert [p["process"] for p in m["processes"]] == ["gw-a:1", "gw-b:2"]
    assert m["processes"][0]["gradient"] == 1.2 and m["processes"][1]["gradient"] is None
    assert m["processes"][0]["engine_pressure"].startswith("decode") and m["processes"][1]["engine_pressure"] is None
    engines = {e["role"]: e for e in m["engines"]}
    assert set(engines) == {"prefill", "decode"} and engines["decode"]["waiting"] == 2.0
    assert engines["decode"]["kv_usage"] == 0.5 and 0 <= engines["decode"]["age_s"] < 10
    tenants = {t["tenant_id"]: t for t in m["tenants"]}
    first = tenants[t1["id"]]
    assert (first["tenant_name"], first["display_name"]) == (t1["name"], "Flow A")
    assert (first["running"], first["waiting"], first["prompt_tokens"], first["completion_tokens"]) == (3, 1, 400, 300)
    assert first["queued_s"] == 1.5 and first["rejected"] == {"queue_full": 1, "ttl": 2}
    assert first["token_share"] == pytest.approx(700 / 800)
    assert tenants[t2["id"]]["tenant_name"] == t2["name"] and tenants[t2["id"]]["token_share"] == pytest.approx(1 / 8)
    assert tenants[gone]["tenant_name"] is None and tenants[gone]["token_share"] == 0
    assert m["tenants"][0]["tenant_id"] == t1["id"]  # most tokens first


def test_no_views_is_an_empty_list(flow_client: TestClient, flow_redis) -> None:  # type: ignore[no-untyped-def]
    _clear(flow_redis)
    r = flow_client.get("/admin/v1/flow")
    assert r.status_code == 200 and r.json() == {"processes": [], "models": []}


def test_the_flow_view_is_for_admins_only(flow_client: TestClient) -> None:
    bare = flow_client.get("/admin/v1/flow", headers={"Authorization": ""})
    assert bare.status_code == 401 and bare.headers["content-type"].startswith("application/problem+json")
    wrong = flow_client.get("/admin/v1/flow", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    tenant_key = flow_client.get("/admin/v1/flow", headers={"Authorization": "Bearer bt_live_" + "x" * 40})
    assert tenant_key.status_code == 403 and tenant_key.json()["code"] == "permission_denied"


def test_request_records_show_the_queue_wait_and_class(client: TestClient, db) -> None:  # type: ignore[no-untyped-def]
    t = client.post("/admin/v1/tenants", json={"name": unique("fr"), "display_name": "Records"}).json()
    tid = uuid.UUID(t["id"])
    now = dt.datetime.now(dt.UTC)
    rows = []
    for i, (status, http, code, queue_ms, cls) in enumerate([
        ("completed", 200, None, 12.5, "gold"),
        ("failed", 429, "model_overloaded", 30000.0, "batch"),
        ("completed", 200, None, None, None),
    ]):
        start = now - dt.timedelta(seconds=10 - i)
        rows.append({"id": uuid.uuid4(), "tenant_id": tid, "model": "m", "endpoint": "/v1/chat/completions",
                     "stream": False, "status": status, "http_status": http, "error_code": code, "e2e_ms": 5.0,
                     "queue_ms": queue_ms, "flow_class": cls, "started_at": start,
                     "finished_at": start + dt.timedelta(milliseconds=5)})
    with db.system() as uow:
        uow.requests.insert_many(rows)
        uow.commit()
    listed = client.get("/admin/v1/requests", params={"tenant_id": t["id"]}).json()
    assert listed["count"] == 3
    got = [(r["queue_ms"], r["flow_class"], r["http_status"], r["error_code"]) for r in listed["data"]]
    assert got == [(None, None, 200, None), (30000.0, "batch", 429, "model_overloaded"), (12.5, "gold", 200, None)]
