"""Merging the gateway processes' flow-control views (pure): sums per model, bands, tenants and their share."""

from __future__ import annotations

import uuid

from baton.control.flow import flow_tenant_ids, merge_flow_views

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


def _tenant(tid: uuid.UUID, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {"tenant_id": str(tid), "running": 0, "waiting": 0, "prompt_tokens": 0,
                              "completion_tokens": 0, "queued_s": 0.0, "rejected": {}}
    row.update(kw)
    return row


VIEWS = [
    ("gw-b:2", [
        {"model": "m", "limit": 2, "running": 1, "waiting": 0, "bands": {"50": 0}, "dispatch_per_s": 1.0,
         "upstream_ttft_s": 0.3, "tenants": [_tenant(T1, running=1, prompt_tokens=100, completion_tokens=200,
                                                     queued_s=0.25, rejected={"queue_full": 2, "ttl": 1})]},
        {"model": "idle", "limit": None, "running": 1, "waiting": 0, "bands": {}, "dispatch_per_s": None,
         "upstream_ttft_s": None, "tenants": []},
    ]),
    ("gw-a:1", [
        {"model": "m", "limit": 4, "running": 3, "waiting": 2, "bands": {"80": 1, "50": 1}, "dispatch_per_s": 2.0,
         "upstream_ttft_s": 0.2, "gradient": 1.1, "tpot_floor_s": 0.01, "tpot_s": 0.012, "part": 4.67,
         "tenants": [_tenant(T1, running=2, waiting=1, prompt_tokens=300, completion_tokens=100, queued_s=1.5,
                             rejected={"queue_full": 1}),
                     _tenant(T2, running=1, waiting=1, prompt_tokens=100, queued_s=0.5),
                     {"tenant_id": "not-a-uuid", "running": 9}]},
        "not a view",
        {"limit": 3},
    ]),
]


def test_views_add_up_per_model_band_and_tenant() -> None:
    out = merge_flow_views(VIEWS, {T1: ("acme", "Acme")})  # type: ignore[arg-type]
    assert out.processes == ["gw-a:1", "gw-b:2"]
    assert [m.model for m in out.models] == ["idle", "m"]
    idle, m = out.models
    assert idle.limit is None and idle.running == 1 and idle.tenants == [] and idle.dispatch_per_s is None
    assert (m.limit, m.running, m.waiting, m.dispatch_per_s) == (6, 4, 2, 3.0)
    assert [(b.priority, b.waiting) for b in m.bands] == [(80, 1), (50, 1)]
    assert m.rejected == {"queue_full": 3, "ttl": 1}
    assert [p.process for p in m.processes] == ["gw-a:1", "gw-b:2"] and m.processes[0].gradient == 1.1
    assert [p.part for p in m.processes] == [4.67, None]  # a split part where one is in force
    t1, t2 = m.tenants
    assert (t1.tenant_id, t1.tenant_name, t1.display_name) == (T1, "acme", "Acme")
    assert (t1.running, t1.waiting, t1.prompt_tokens, t1.completion_tokens) == (3, 1, 400, 300)
    assert t1.queued_s == 1.75 and t1.rejected == {"queue_full": 3, "ttl": 1}
    assert t1.token_share == 700 / 800 and t2.token_share == 100 / 800
    assert t2.tenant_name is None and t2.rejected == {}


def test_no_views_no_models_and_no_tokens_no_share() -> None:
    assert merge_flow_views([]).models == [] and merge_flow_views([]).processes == []
    out = merge_flow_views([("p", [{"model": "m", "limit": 1, "tenants": [_tenant(T1, waiting=1)]}])])
    assert out.models[0].tenants[0].token_share is None and out.models[0].bands == []


def test_tenant_ids_of_the_views() -> None:
    assert flow_tenant_ids(VIEWS) == {T1, T2}  # type: ignore[arg-type]
