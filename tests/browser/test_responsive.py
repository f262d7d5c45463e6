"""Every console page on a phone (390 x 844) and a laptop (1366 x 768): nothing wider than the screen, no
error banner, no script error. A new tenant from its sign-up (with a running batch), and an operator."""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from .conftest import PASSWORD, Stack, shot
from .test_console import grant, sign_up

pytestmark = pytest.mark.browser

TENANT_PAGES = ["/console/", "/console/keys", "/console/models", "/console/usage", "/console/slo",
                "/console/requests", "/console/batches", "/console/playground"]
OPERATOR_PAGES = ["/console/ops", "/console/ops/tenants", "/console/ops/models", "/console/ops/deployments",
                  "/console/ops/queues", "/console/ops/batches", "/console/ops/slo", "/console/ops/planner",
                  "/console/ops/users", "/console/ops/tokens", "/console/ops/audit"]
VIEWPORTS = {"phone": (390, 844), "laptop": (1366, 768)}


@pytest.fixture(params=list(VIEWPORTS))
def sized(request, browser, stack: Stack) -> Iterator[tuple[str, Any, list[str]]]:  # type: ignore[no-untyped-def]
    w, h = VIEWPORTS[request.param]
    ctx = browser.new_context(base_url=stack.url, viewport={"width": w, "height": h})
    ctx.set_default_timeout(15000)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # script errors; a failed fetch is logged too, and the first /session check before sign-in is a 401
    pg.on("console", lambda m: errors.append(m.text)
          if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
    yield request.param, pg, errors
    ctx.close()


def _check(page: Any, path: str, width: int) -> None:
    page.goto(path)
    expect(page.locator("h1").first).to_be_visible()
    page.wait_for_load_state("networkidle")
    expect(page.locator(".error")).to_have_count(0)
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{path} is {scroll} px wide on a {width} px screen"


def _running_batch(stack: Stack, tenant_id: uuid.UUID) -> None:
    """A batch of three requests for a model no gateway serves (so it keeps running), one of them done: the
    Batches pages show their tables, with a progress bar and a cancel button."""
    from baton.control import batches

    model = f"batch-only-{uuid.uuid4().hex[:6]}"
    body = b"".join(b'{"custom_id": "r%d", "url": "/v1/chat/completions", "body": {"model": "%s"}}\n'
                    % (i, model.encode()) for i in range(3))
    f = batches.store_file(stack.db, tenant_id=tenant_id, key_id=None, purpose="batch", filename="in.jsonl",
                           source=io.BytesIO(body), part_bytes=1 << 16, max_bytes=1 << 20, max_lines=10)
    batches.create_batch(stack.db, tenant_id=tenant_id, key_id=None, allowed=[model], max_lines=10,
                         req=batches.NewBatch(f["id"], "/v1/chat/completions", "24h", None))
    line = batches.claim(stack.db, models=[model], limit=1, lease_s=600)[0]
    assert batches.finish(stack.db, line, ok=True, response={"status_code": 200, "body": {}})


def _a_tenant(stack: Stack) -> uuid.UUID:
    from baton.core import models as m

    with stack.db.system() as uow:
        tenant = uow.tenants.add(m.Tenant(name=f"batcher-{uuid.uuid4().hex[:6]}", display_name="Batcher"))
        uow.commit()
        return tenant.id


def test_a_new_tenants_pages_fit_the_screen(sized, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    name, page, errors = sized
    width = VIEWPORTS[name][0]
    page.goto("/console/signup")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    slug, _ = sign_up(page, stack)
    _running_batch(stack, grant(stack.db, slug, stack.model_id))
    for path in TENANT_PAGES:
        _check(page, path, width)
    shot(page, f"responsive-{name}-tenant-playground")
    page.goto("/console/batches")  # the running batch: one of its three requests done, and it may be cancelled
    expect(page.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "1")
    expect(page.get_by_role("button", name=re.compile("Cancel"))).to_be_visible()
    shot(page, f"responsive-{name}-tenant-batches")
    assert errors == []


def _long_named_policy(stack: Stack) -> None:
    """A policy whose name cannot wrap (as an API client may name one), with every column filled: the
    policies table is the widest of the operators' pages."""
    from baton.core import models as m

    with stack.db.system() as uow:
        uow.slo_policies.add(m.SloPolicy(name="policy-" + uuid.uuid4().hex * 2 + "-without-a-space-to-wrap-at",
                                         ttft_ms=500, tpot_ms=50, priority=90, weight=12.5, max_wait_s=1800.5,
                                         max_waiting=100000))
        uow.commit()


def _long_sourced_model(stack: Stack) -> None:
    """A model whose weights are at a long path with no space (a test's temporary folder, a mounted volume):
    the models table's widest cell, wider than a laptop's screen unless a cell can wrap a path."""
    from baton.core import models as m

    with stack.db.system() as uow:
        uow.models.add(m.Model(name=f"deep-{uuid.uuid4().hex[:6]}",
                               source="/mnt/weights/" + "/".join(uuid.uuid4().hex for _ in range(4)) + "/tiny-llama",
                               context_length=2048, num_layers=4, num_kv_heads=4, head_dim=64, dtype="bfloat16"))
        uow.commit()


def test_the_operators_pages_fit_the_screen(sized, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    name, page, errors = sized
    width = VIEWPORTS[name][0]
    _long_named_policy(stack)
    _long_sourced_model(stack)
    _running_batch(stack, _a_tenant(stack))
    page.goto("/console/login")
    page.get_by_label("Email").fill(stack.operator_email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name=re.compile("Platform health"))).to_be_visible()
    for path in OPERATOR_PAGES:
        _check(page, path, width)
        shot(page, f"responsive-{name}-{path.rsplit('/', 1)[-1]}")
    # the planner's plot: its two charts side by side on a laptop, one above the other on a phone
    page.goto("/console/ops/planner")
    page.get_by_label("Model").select_option(label=stack.model)
    page.get_by_role("button", name="Plan").click()
    img = page.get_by_role("img", name=re.compile("Planner plot"))
    expect(img).to_be_visible(timeout=30000)
    w, h = img.evaluate("i => [i.naturalWidth, i.naturalHeight]")
    assert (h > w) if name == "phone" else (w > h), (name, w, h)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    shot(page, f"responsive-{name}-planner-plot")
    assert errors == []
