"""The operator's Queues page shows a gateway process's view (written to Redis as a gateway does): the
model, its limit and band, and the tenant by name, on a laptop and on a phone (nothing wider than it).
A tenant's Service levels page shows its queue wait and refusals, and its requests their queue wait."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import time
import uuid

import pytest
from playwright.sync_api import expect

from baton.core import models as m
from baton.core.contracts import FLOW_VIEW_INDEX, flow_view_key, flow_view_message, indexed_set

from .conftest import Stack, operator_page, shot
from .test_console import grant, sign_up

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")]


def test_the_queues_page_renders_a_model_row(browser, stack: Stack, settings) -> None:  # type: ignore[no-untyped-def]
    import redis

    slug = f"q-{uuid.uuid4().hex[:8]}"
    with stack.db.system() as uow:
        tenant = uow.tenants.add(m.Tenant(name=slug, display_name=f"Queued {slug}"))
        uow.commit()
        tid = str(tenant.id)
    model = f"queued-{uuid.uuid4().hex[:6]}"
    process = f"browser-{uuid.uuid4().hex[:6]}"
    view = [{"model": model, "limit": 3, "running": 3, "waiting": 4, "bands": {"70": 4},
             "dispatch_per_s": 2.5, "upstream_ttft_s": 0.15, "tenants": [
                 {"tenant_id": tid, "running": 3, "waiting": 4, "prompt_tokens": 900, "completion_tokens": 300,
                  "queued_s": 2.0, "rejected": {"queue_full": 2}}]}]
    r = redis.Redis.from_url(settings.redis.url)
    pipe = r.pipeline(transaction=False)
    indexed_set(pipe, FLOW_VIEW_INDEX, flow_view_key(process), flow_view_message(process, view), 120,
                now=time.time())
    pipe.execute()
    ops = operator_page(browser, stack)
    try:
        ops.get_by_role("link", name="Queues").click()
        card = ops.locator(f'section[data-model="{model}"]')
        expect(card.get_by_role("heading", name=model)).to_be_visible()
        expect(card.get_by_role("row", name=re.compile(rf"Queued {slug}.*100\.0 %"))).to_be_visible()
        expect(card.get_by_role("row", name=re.compile(r"^70 4$"))).to_be_visible()
        expect(card.get_by_text("2 queue full")).to_be_visible()
        shot(ops, "queues-laptop")
        ops.set_viewport_size({"width": 390, "height": 844})
        ops.reload()
        expect(card.get_by_role("heading", name=model)).to_be_visible()
        assert ops.evaluate("document.documentElement.scrollWidth") <= 390
        expect(ops.locator(".error")).to_have_count(0)
        shot(ops, "queues-phone")
    finally:
        r.delete(flow_view_key(process))
        r.close()
        ops.context.close()


def test_a_tenant_sees_its_queue_wait_and_refusals(page, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    slug, _ = sign_up(page, stack)
    tid = grant(stack.db, slug, stack.model_id)
    now = dt.datetime.now(dt.UTC)
    rows = []
    for i, (status, http, code, queue_ms, ttft) in enumerate([
        ("completed", 200, None, 12.0, 40.0), ("completed", 200, None, 250.0, 300.0),
        ("failed", 429, "model_overloaded", 30000.0, None),
    ]):
        start = now - dt.timedelta(minutes=5 + i)
        rows.append({"id": uuid.uuid4(), "tenant_id": tid, "model": stack.model, "endpoint": "/v1/chat/completions",
                     "stream": True, "status": status, "http_status": http, "error_code": code, "ttft_ms": ttft,
                     "e2e_ms": 500.0, "queue_ms": queue_ms, "flow_class": "default", "started_at": start,
                     "finished_at": start + dt.timedelta(seconds=1)})
    with stack.db.tenant(tid) as uow:
        uow.requests.insert_many(rows)
        uow.commit()
    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto("/console/slo")
        flow = page.get_by_role("region", name="Queueing and refusals")
        expect(flow.get_by_role("row", name=re.compile(rf"{stack.model}.*no policy\s+3\b"))).to_be_visible()
        expect(flow.get_by_role("row", name=re.compile(r"default\s+3\b"))).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        shot(page, f"service-levels-{width}")
    page.goto("/console/requests")
    expect(page.get_by_role("cell", name=re.compile(r"30\.00 s\s*default"))).to_be_visible()
