"""Flow control in the gateway process (real Postgres and Redis, the stub upstream as the engine): a
heavy tenant queues and is pushed back with 429 + Retry-After; a light tenant goes at once; a higher
band goes first; a wait past its TTL is a 429; the queue wait reaches the records, the metrics and the trace.

The model's limit is pinned at 2 (initial = max = 2, tolerances no stub latency reaches) so that what
is queued is known; how the limit is learned is tested in ``tests/unit/gateway/test_capacity.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from baton.core import models as m
from baton.core.db import Database
from baton.core.settings import FlowControlSettings, Settings

from .conftest import KeyService, TenantKey, add_model, create_tenant_key, request_rows, serve, wait_for

TOKENS = 8
TOKEN_DELAY_S = 0.5  # a stream holds its place 4 s
TTL_S = 6.0  # the first two queued go after one stream (4 s), the next two would wait two (8 s)


@pytest.fixture(scope="module")
def flow_model(db: Database) -> str:
    name = f"gw-flow-{uuid.uuid4().hex[:6]}"
    add_model(db, name, 4096)
    return name


@pytest.fixture(scope="module")
def flow_url(gw_settings: Settings, flow_model: str, stub_url: str) -> Iterator[str]:
    from baton.api.app import create_app

    flow = FlowControlSettings(initial_limit=2, max_limit=2, min_samples=1, tolerance=1000.0, ttft_tolerance=1000.0,
                               queue_max=4,
                               ttl_s=TTL_S)
    gateway = gw_settings.gateway.model_copy(update={
        "upstreams": {**gw_settings.gateway.upstreams, flow_model: f"{stub_url}/v1"}, "flow": flow})
    telemetry = gw_settings.telemetry.model_copy(update={"metrics_tenant_labels": True})  # counted per tenant below
    with serve(create_app(gw_settings.model_copy(update={"gateway": gateway, "telemetry": telemetry}),
                          optional_routers=())) as url:
        yield url


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    first_token: float | None = None  # monotonic
    done: float | None = None


def stream(url: str, key: TenantKey, model: str, answer: Answer, *, delay: float = TOKEN_DELAY_S) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS, "stream": True,
            "stub_token_delay": delay}
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                                           headers=key.headers) as r:
        answer.status, answer.headers = r.status_code, dict(r.headers)
        for line in r.iter_lines():
            if answer.first_token is None and line.startswith("data: {") and '"content"' in line:
                answer.first_token = time.monotonic()
            answer.body += line.encode() + b"\n"
    answer.done = time.monotonic()


def start(url: str, key: TenantKey, model: str, **kw: Any) -> tuple[Answer, threading.Thread]:
    answer = Answer()
    thread = threading.Thread(target=stream, args=(url, key, model, answer), kwargs=kw, daemon=True)
    thread.start()
    return answer, thread


def warm(url: str, key: TenantKey, model: str) -> None:
    """One completed stream: the model's limit has a view from here on."""
    answer = Answer()
    stream(url, key, model, answer, delay=0.0)
    assert answer.status == 200


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_heavy_tenant_queues_and_is_pushed_back_while_a_light_one_goes_at_once(
        flow_url: str, flow_model: str, db: Database, keys: KeyService) -> None:
    heavy = create_tenant_key(db, keys, [flow_model])
    light = create_tenant_key(db, keys, [flow_model])
    warm(flow_url, heavy, flow_model)
    running = [start(flow_url, heavy, flow_model) for _ in range(2)]
    wait_for(lambda: all(a.first_token for a, _ in running))
    queued = [start(flow_url, heavy, flow_model) for _ in range(4)]
    wait_for(lambda: metric(flow_url, "baton_flow_waiting", model=flow_model) == 4)

    # the queue is full: the heavy tenant's next request is refused at once, with Retry-After
    refused = Answer()
    stream(flow_url, heavy, flow_model, refused)
    assert refused.status == 429 and int(refused.headers["retry-after"]) >= 1
    assert b"model_overloaded" in refused.body

    # the light tenant, with nothing running, goes ahead of the heavy tenant's four waiting requests
    light_answer = Answer()
    stream(flow_url, light, flow_model, light_answer, delay=0.0)
    assert light_answer.status == 200 and light_answer.first_token is not None
    assert all(a.first_token is None for a, _ in queued)  # they still wait for a place

    for _, thread in [*running, *queued]:
        thread.join(timeout=30)
    outcomes = sorted(a.status for a, _ in queued)
    assert outcomes == [200, 200, 429, 429], outcomes  # two went after a stream ended, two waited past the TTL
    ttl = [a for a, _ in queued if a.status == 429]
    assert all(int(a.headers["retry-after"]) >= 1 for a in ttl)

    # the records carry the wait and the class; refusals are recorded with their status
    rows = wait_for(lambda: (r := request_rows(db, heavy.tenant_id)) and len(r) == 8 and r)
    by_status: dict[int, list[m.RequestRecord]] = {}
    for row in rows:
        by_status.setdefault(row.http_status, []).append(row)
    assert len(by_status[429]) == 3 and {r.error_code for r in by_status[429]} == {"model_overloaded"}
    waited = sorted(r.queue_ms for r in by_status[200] if r.queue_ms is not None)
    assert len(waited) == 5 and waited[-1] > 1000  # the two queued ones waited for a stream to end
    assert all(r.flow_class == "default" for r in rows)
    [light_row] = wait_for(lambda: request_rows(db, light.tenant_id))
    assert light_row.http_status == 200 and light_row.queue_ms is not None and light_row.queue_ms < waited[-1]

    # and the metrics count them per tenant and reason
    assert metric(flow_url, "baton_flow_rejected_total", tenant=str(heavy.tenant_id), reason="queue_full") == 1
    assert metric(flow_url, "baton_flow_rejected_total", tenant=str(heavy.tenant_id), reason="ttl") == 2
    assert metric(flow_url, "baton_flow_limit", model=flow_model) == 2
    wait_for(lambda: metric(flow_url, "baton_flow_tokens_total", tenant=str(light.tenant_id), kind="completion")
             == TOKENS)


def test_a_higher_band_goes_before_the_waiting_lower_band(flow_url: str, flow_model: str, db: Database,
                                                          keys: KeyService) -> None:
    low = create_tenant_key(db, keys, [flow_model])
    high = create_tenant_key(db, keys, [flow_model])
    with db.system() as uow:
        policy = uow.slo_policies.add(m.SloPolicy(name=f"gold-{uuid.uuid4().hex[:6]}", ttft_ms=500, tpot_ms=100,
                                                  priority=90))
        uow.session.flush()
        uow.slo_assignments.add(m.SloAssignment(policy_id=policy.id, tenant_id=high.tenant_id))
        uow.commit()
        gold = policy.name
    warm(flow_url, low, flow_model)
    # the two running streams hold the model's limit for 4 s: long enough for the waits below on a busy machine.
    # They end half a second apart, so their slots free one at a time: a slot that frees goes to the highest
    # band waiting (two freed at once would start the high and a low request together, and which first
    # token reaches its client first would be a race, not the order of the bands)
    running = [start(flow_url, low, flow_model)]
    time.sleep(0.5)
    running.append(start(flow_url, low, flow_model))
    wait_for(lambda: all(a.first_token for a, _ in running))
    low_waiting = [start(flow_url, low, flow_model, delay=0.0) for _ in range(2)]
    wait_for(lambda: metric(flow_url, "baton_flow_waiting", model=flow_model) == 2)
    # the high band's tenant runs one request, then queues a second behind the low band's two
    first_high = start(flow_url, high, flow_model)
    wait_for(lambda: first_high[0].first_token)
    second_high = start(flow_url, high, flow_model, delay=0.0)
    wait_for(lambda: metric(flow_url, "baton_flow_waiting", model=flow_model, band="90") == 1)
    for _, thread in [*running, *low_waiting, first_high, second_high]:
        thread.join(timeout=30)
    assert second_high[0].status == 200 and all(a.status == 200 for a, _ in low_waiting)
    assert second_high[0].first_token < min(a.first_token for a, _ in low_waiting)  # type: ignore[operator]
    rows = wait_for(lambda: (r := request_rows(db, high.tenant_id)) and len(r) == 2 and r)
    assert {r.flow_class for r in rows} == {gold}
