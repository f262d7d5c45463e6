"""The console in a real browser: a tenant signs up, creates a key, uses it with the openai client,
sees the usage, streams in the playground and opens a request's waterfall; an operator grants a model,
creates a deployment and watches it become running; a tenant never reaches operator pages or another
tenant's data."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from playwright.sync_api import expect

from baton.core.db import Database

from .conftest import PASSWORD, Stack, operator_page, shot

pytestmark = pytest.mark.browser


def sign_up(page: Any, stack: Stack) -> tuple[str, str]:
    slug = f"acme-{uuid.uuid4().hex[:6]}"
    email = f"admin@{slug}.example.com"
    page.goto("/console/signup")
    expect(page.get_by_role("heading", name="Create an organisation")).to_be_visible()
    page.get_by_label("Organisation name").fill(f"Acme {slug[-6:]}")
    expect(page.get_by_label("Tenant id")).to_have_value(slug)
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create organisation").click()
    expect(page.get_by_role("heading", name=re.compile("Welcome"))).to_be_visible()
    return slug, email


def grant(db: Database, tenant_slug: str, model_id: uuid.UUID) -> uuid.UUID:
    with db.system() as uow:
        t = uow.tenants.by_name(tenant_slug)
        assert t is not None
        uow.tenant_models.grant(t.id, model_id)
        uow.commit()
        return t.id


def approve_in_console(browser: Any, stack: Stack, slug: str) -> None:
    """An operator signs in, finds the organisation's request for any model in the queue and grants the model."""
    ops = operator_page(browser, stack)
    ops.get_by_role("link", name="Tenants").click()
    queue = ops.get_by_test_id("access-requests")
    row = queue.get_by_role("row", name=re.compile(slug))
    approve = row.get_by_role("button", name=re.compile("Approve"))
    expect(approve).to_be_disabled()  # a request for any model: the operator chooses which
    shot(ops, "07-operator-access-queue")
    row.get_by_label("Any model: grant").select_option(label=stack.model)
    approve.click()
    expect(queue.get_by_role("row", name=re.compile(slug))).to_have_count(0)
    tenants = ops.get_by_role("table", name="Tenants")
    expect(tenants.get_by_role("row", name=re.compile(slug))).to_contain_text(stack.model)
    shot(ops, "08-operator-access-approved")
    ops.context.close()


def stat(page: Any, label: str) -> Any:
    label_el = page.locator(".stat-label", has_text=re.compile(f"^{label}$"))
    return page.locator(".stat", has=label_el).locator(".stat-value")


def test_tenant_journey(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    from openai import OpenAI

    slug, _ = sign_up(page, stack)
    # a new organisation's first page: its figures, not an error
    expect(stat(page, "Live API keys")).to_have_text("0")
    expect(stat(page, "Models you may use")).to_have_text("0")
    expect(page.get_by_role("alert")).to_have_count(0)
    # no default grant in this stack: the organisation is told it waits for an operator, who has its request
    expect(page.get_by_test_id("access-waiting")).to_contain_text("Waiting for access")
    expect(page.get_by_test_id("access-pending")).to_contain_text("is with the operators")
    shot(page, "01-tenant-overview")
    approve_in_console(browser, stack, slug)
    page.reload()
    expect(stat(page, "Models you may use")).to_have_text("1")
    expect(page.get_by_test_id("access-waiting")).to_have_count(0)
    expect(page.get_by_text(f'model="{stack.model}"')).to_be_visible()

    # A key scoped to the model; its secret is shown once.
    page.get_by_role("navigation", name="Console").get_by_role("link", name="API keys").click()
    expect(page.get_by_role("heading", name="API keys", level=1)).to_be_visible()
    page.get_by_label("Name", exact=True).fill("production")
    page.get_by_label(stack.model).check()
    page.get_by_role("button", name="Create key").click()
    secret = page.get_by_test_id("secret-value").input_value()
    assert secret.startswith("bt_live_")
    expect(page.get_by_role("button", name="Copy key")).to_be_visible()
    shot(page, "02-tenant-key-created")
    page.get_by_role("button", name="I have saved it").click()
    expect(page.get_by_test_id("secret-value")).to_have_count(0)
    expect(page.get_by_role("row", name=re.compile("production"))).to_contain_text(stack.model)

    # The key works with the official client, streaming through the gateway.
    client = OpenAI(base_url=f"{stack.url}/v1", api_key=secret, max_retries=0)
    stream = client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=5, stream=True)
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert text.strip()

    # Its usage appears (the gateway meters asynchronously; the page is reloaded until it shows).
    page.goto("/console/usage")
    deadline = time.monotonic() + 20
    while stat(page, "Requests").inner_text() != "1":
        assert time.monotonic() < deadline, "usage did not appear"
        time.sleep(0.3)
        page.reload()
    expect(stat(page, "Completion tokens")).to_have_text("5")
    expect(page.get_by_role("img", name=re.compile("Requests per hour"))).to_be_visible()
    shot(page, "03-tenant-usage")

    # The key's last use is written in the background and shows on the keys page.
    page.goto("/console/keys")
    last_used = page.get_by_role("row", name=re.compile("production")).locator("td").nth(4)
    deadline = time.monotonic() + 20
    while not re.search(r"\d{4}", last_used.inner_text()):  # a dash until the first write
        assert time.monotonic() < deadline, "the key's last use did not appear"
        time.sleep(0.3)
        page.reload()

    # The playground streams a completion with a short-lived key.
    page.goto("/console/playground")
    expect(page.get_by_label("Model")).to_have_value(stack.model)
    page.get_by_label("Your message").fill("Say something")
    page.get_by_label("Max tokens").fill("8")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("playground-status")).to_contain_text("Done", timeout=20000)
    expect(page.get_by_test_id("playground-output")).to_contain_text("tok")
    shot(page, "04-tenant-playground")
    # A second visit sends with a fresh page: the user still holds one playground key, not two.
    page.reload()
    page.get_by_label("Your message").fill("Again")
    page.get_by_label("Max tokens").fill("3")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("playground-status")).to_contain_text("Done", timeout=20000)
    page.goto("/console/keys")
    expect(page.get_by_role("rowheader", name=re.compile("^playground-"))).to_have_count(1)

    # Requests, and one request's waterfall.
    page.goto("/console/requests")
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(3, timeout=20000)
    rows.first.get_by_role("link").click()
    expect(page.get_by_text(re.compile("^Trace waterfall"))).to_be_visible()
    names = page.locator(".wf-name").all_inner_texts()
    assert names[0] == "prefill" and "decode" in names
    shot(page, "05-tenant-request-waterfall")

    page.goto("/console/slo")
    expect(page.get_by_role("heading", name="Service levels")).to_be_visible()
    expect(page.get_by_role("heading", name=stack.model)).to_be_visible()
    shot(page, "06-tenant-slo")
    page.goto("/console/models")
    expect(page.get_by_role("rowheader", name=stack.model)).to_be_visible()


def test_tenant_cannot_reach_operator_pages_or_other_tenants(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    slug_b, _ = sign_up(page, stack)
    tenant_b = grant(stack.db, slug_b, stack.model_id)
    key_b = page.evaluate("""async () => {
        const s = await (await fetch('/console/api/session')).json();
        const r = await fetch('/console/api/tenant/keys', {method: 'POST', headers: {'Content-Type': 'application/json',
            'X-CSRF-Token': s.csrf_token}, body: JSON.stringify({name: 'b-key'})});
        return (await r.json()).key.id;
    }""")
    assert key_b

    ctx_a = browser.new_context(base_url=stack.url, viewport={"width": 1440, "height": 900})
    a = ctx_a.new_page()
    try:
        sign_up(a, stack)
        a.goto("/console/ops/tenants")
        expect(a.get_by_role("alert")).to_contain_text("Only platform operators may open this page.")
        expect(a.get_by_role("heading", name="Permission denied")).to_be_visible()
        shot(a, "07-tenant-forbidden-operator-page")
        codes = a.evaluate("""async ([keyB, tenantB]) => {
            const s = await (await fetch('/console/api/session')).json();
            const h = {'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token};
            const out = {};
            for (const p of ['overview', 'tenants', 'deployments', 'audit', 'models', 'slo-policies'])
                out['ops/' + p] = (await fetch('/console/api/ops/' + p)).status;
            out.revoke = (await fetch(`/console/api/tenant/keys/${keyB}/revoke`, {method: 'POST', headers: h})).status;
            out.keys = (await (await fetch('/console/api/tenant/keys')).json()).length;
            out.nocsrf = (await fetch('/console/api/tenant/keys', {method: 'POST',
                headers: {'Content-Type': 'application/json'}, body: '{"name":"x"}'})).status;
            return out;
        }""", [key_b, str(tenant_b)])
        assert {k: v for k, v in codes.items() if k.startswith("ops/")} == dict.fromkeys(
            ["ops/overview", "ops/tenants", "ops/deployments", "ops/audit", "ops/models", "ops/slo-policies"], 403)
        assert codes["revoke"] == 404 and codes["keys"] == 0 and codes["nocsrf"] == 403
    finally:
        ctx_a.close()
    # B's key is untouched.
    page.goto("/console/keys")
    expect(page.get_by_role("row", name=re.compile("b-key"))).to_contain_text("active")


def test_operator_creates_a_deployment_and_sees_it_running(page, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    slug, _ = sign_up(page, stack)
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in to Baton")).to_be_visible()

    page.get_by_label("Email").fill(stack.operator_email)
    page.get_by_label("Password").fill("wrong password!")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("The email or password is not correct.")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Platform health")).to_be_visible()

    page.get_by_role("link", name="Tenants").click()
    page.get_by_label("Tenant", exact=True).select_option(label=slug)
    page.get_by_label("Model", exact=True).select_option(label=stack.model)
    page.get_by_role("button", name="Grant").click()
    tenants = page.get_by_role("table", name="Tenants")
    expect(tenants.get_by_role("row", name=re.compile(slug))).to_contain_text(stack.model)
    shot(page, "08-operator-tenants")

    page.get_by_role("link", name="SLO policies").click()
    gold = f"gold-{uuid.uuid4().hex[:8]}"  # other tests' policies share the database
    page.get_by_label("Name").fill(gold)
    page.get_by_label("TTFT target (ms)").fill("800")
    page.get_by_label("TPOT target (ms)").fill("60")
    page.get_by_role("button", name="Create policy").click()
    expect(page.get_by_role("rowheader", name=gold, exact=True)).to_have_count(1)

    name = f"chat-{uuid.uuid4().hex[:6]}"
    page.get_by_role("link", name="Deployments").click()
    page.get_by_label("Name").fill(name)
    page.get_by_label("Model").select_option(label=stack.model)
    page.get_by_label("Prefill/decode split").check()
    page.get_by_role("button", name="Create deployment").click()
    row = page.get_by_test_id(f"deployment-{name}")
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("running", timeout=30000)
    expect(row).to_contain_text("P/D: prefill 1\u20131, decode 1\u20131 (nixl)")
    shot(page, "09-operator-deployments")

    page.get_by_role("link", name="Health").click()
    expect(page.get_by_role("listitem").filter(has_text=name)).to_contain_text("running")
    shot(page, "10-operator-health")

    page.get_by_role("link", name="Planner").click()
    page.get_by_label("Model").select_option(label=stack.model)
    page.get_by_role("button", name="Plan").click()
    expect(page.get_by_test_id("plan-recommended")).not_to_be_empty(timeout=30000)
    expect(page.get_by_role("img", name=re.compile("Planner plot"))).to_be_visible()
    shot(page, "11-operator-planner")

    # an SLO nothing meets: no recommendation, the closest configuration and what would meet it
    page.get_by_label("TTFT SLO (ms)").fill("1")
    page.get_by_role("button", name="Plan").click()
    infeasible = page.get_by_test_id("plan-infeasible")
    expect(infeasible).to_contain_text("Nothing meets this SLO", timeout=30000)
    expect(infeasible).to_contain_text("Closest:")
    expect(page.get_by_test_id("plan-recommended")).to_have_count(0)
    expect(page.get_by_role("img", name=re.compile("nothing meets it"))).to_be_visible()
    shot(page, "11b-operator-planner-nothing-meets")

    page.get_by_role("link", name="Audit log").click()
    # the reconciler records what it observes; other tests' deployments fill pages with it
    page.get_by_label("Made by").select_option(label="people and tokens")
    expect(page.get_by_role("cell", name="system:reconciler")).to_have_count(0)
    expect(page.get_by_role("rowheader", name="deployment.create").first).to_be_visible()
    created = page.get_by_role("row", name=re.compile("deployment.create")).first
    expect(created).to_contain_text(f"console:{stack.operator_email}")
    expect(created).to_contain_text(f"deployment {name}")  # the target by its name, not an id
    shot(page, "12-operator-audit")

    # Operators are not tenants: tenant pages say so.
    page.goto("/console/keys")
    expect(page.get_by_role("heading", name="Permission denied")).to_be_visible()


def test_a_member_sees_the_keys_but_no_action_the_api_refuses_them(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    slug, _ = sign_up(page, stack)
    tenant_id = grant(stack.db, slug, stack.model_id)
    page.goto("/console/keys")
    page.get_by_label("Name", exact=True).fill("admins-key")
    page.get_by_role("button", name="Create key").click()
    expect(page.get_by_test_id("secret-value")).to_be_visible()
    expect(page.get_by_role("row", name=re.compile("admins-key"))).to_be_visible()
    # an operator adds a member; the member signs in
    member = f"member-{uuid.uuid4().hex[:6]}@{slug}.example.com"
    ops = operator_page(browser, stack)
    made = ops.evaluate("""async ([tid, email, password]) => {
        const s = await (await fetch('/console/api/session')).json();
        const r = await fetch(`/console/api/ops/tenants/${tid}/users`, {method: 'POST', headers: {
            'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token},
            body: JSON.stringify({email, password, role: 'tenant_member'})});
        return r.status;
    }""", [str(tenant_id), member, PASSWORD])
    ops.context.close()
    assert made == 201
    ctx = browser.new_context(base_url=stack.url, viewport={"width": 390, "height": 844})  # a phone
    m_page = ctx.new_page()
    try:
        m_page.goto("/console/")
        expect(m_page.get_by_role("heading", name="Sign in to Baton")).to_be_visible()
        m_page.get_by_label("Email").fill(member)
        m_page.get_by_label("Password").fill(PASSWORD)
        m_page.get_by_role("button", name="Sign in").click()
        expect(m_page.get_by_role("heading", name=re.compile("Welcome"))).to_be_visible()
        m_page.goto("/console/keys")
        expect(m_page.get_by_role("row", name=re.compile("admins-key"))).to_be_visible()
        expect(m_page.get_by_test_id("member-note")).to_contain_text("admins create, rotate and revoke keys")
        expect(m_page.get_by_role("button", name=re.compile("Create key|Revoke|Rotate"))).to_have_count(0)
        shot(m_page, "09-member-keys")
    finally:
        ctx.close()
