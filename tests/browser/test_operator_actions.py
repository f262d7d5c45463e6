"""An operator's destructive actions ask first, and a suspended organisation's user is told why."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from .conftest import Stack, operator_page, shot
from .test_console import sign_up

pytestmark = pytest.mark.browser


def test_suspend_asks_first_and_the_tenants_user_is_told_why(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    slug, _ = sign_up(page, stack)  # the tenant stays signed in in `page`
    ops = operator_page(browser, stack)
    ops.goto("/console/ops/tenants")
    row = ops.get_by_role("table", name="Tenants").get_by_role("row", name=re.compile(slug))
    expect(row).to_contain_text("waiting for access")
    dialogs: list[str] = []

    def dismiss(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    ops.once("dialog", dismiss)
    row.get_by_role("button", name=re.compile("Suspend")).click()
    assert dialogs and slug in dialogs[0] and "stop working" in dialogs[0]
    ops.reload()
    expect(ops.get_by_role("table", name="Tenants").get_by_role("row", name=re.compile(slug))).to_contain_text("active")

    ops.once("dialog", lambda d: d.accept())
    tenants = ops.get_by_role("table", name="Tenants")
    tenants.get_by_role("row", name=re.compile(slug)).get_by_role("button", name=re.compile("Suspend")).click()
    expect(tenants.get_by_role("row", name=re.compile(slug))).to_contain_text("suspended")
    shot(ops, "operator-suspended")

    page.reload()
    expect(page.get_by_role("alert").first).to_contain_text("This organisation is suspended")
    shot(page, "tenant-suspended")
    ops.context.close()


def test_a_declined_request_asks_first_and_the_organisation_sees_why(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    slug, _ = sign_up(page, stack)  # no default grant here: sign-up filed a request for any model
    ops = operator_page(browser, stack)
    ops.goto("/console/ops/tenants")
    row = ops.get_by_test_id("access-requests").get_by_role("row", name=re.compile(slug))
    prompts: list[str] = []

    def dismiss(d: Any) -> None:
        prompts.append(d.message)
        d.dismiss()

    ops.once("dialog", dismiss)
    row.get_by_role("button", name=re.compile("Decline")).click()
    assert prompts and slug in prompts[0] and "reason" in prompts[0]
    ops.reload()
    expect(ops.get_by_test_id("access-requests").get_by_role("row", name=re.compile(slug))).to_have_count(1)

    ops.once("dialog", lambda d: d.accept("The pilot is full this month"))
    ops.get_by_test_id("access-requests").get_by_role("row", name=re.compile(slug)).get_by_role(
        "button", name=re.compile("Decline")).click()
    expect(ops.get_by_test_id("access-requests").get_by_role("row", name=re.compile(slug))).to_have_count(0)
    ops.context.close()

    # The organisation reads the answer, and may ask again (for a particular model this time).
    page.goto("/console/models")
    expect(page.get_by_test_id("answered-requests")).to_contain_text("The pilot is full this month")
    page.get_by_test_id("catalogue").get_by_role("button", name=re.compile(f"Request access to {stack.model}")).click()
    catalogue = page.get_by_test_id("catalogue")
    expect(catalogue.get_by_role("row", name=re.compile(stack.model))).to_contain_text("requested")
    shot(page, "tenant-access-declined-and-asked-again")
    page.goto("/console/")
    expect(page.get_by_test_id("access-pending")).to_contain_text(stack.model)


def test_the_catalogue_grants_and_policies_are_managed_from_the_console(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    """Every catalogue capability has a page: add a model, revoke a grant, unassign and delete a policy and
    delete a model, each destructive step asking first (a dismissed question changes nothing)."""
    import uuid

    slug, _ = sign_up(page, stack)
    ops = operator_page(browser, stack)
    name = f"extra-{uuid.uuid4().hex[:6]}"
    ops.get_by_role("link", name="Models").click()
    expect(ops.get_by_role("heading", name="Models", level=1)).to_be_visible()
    ops.get_by_label("Name").fill(name)
    ops.get_by_label("Weights (folder on the workers)").fill("/models/extra")
    ops.get_by_label("Context (tokens)").fill("4096")
    ops.get_by_label("Tool-call parser (optional, e.g. hermes)").fill("hermes")
    ops.get_by_role("button", name="Add model").click()
    expect(ops.get_by_role("rowheader", name=name)).to_be_visible()
    expect(ops.get_by_role("row", name=re.compile(name))).to_contain_text("tools (hermes)")
    embed = f"embed-{uuid.uuid4().hex[:6]}"
    ops.get_by_label("Name").fill(embed)
    ops.get_by_label("Weights (folder on the workers)").fill("/models/embed")
    ops.get_by_label("Serves").select_option(label="embeddings")
    expect(ops.get_by_label("Tool-call parser (optional, e.g. hermes)")).to_have_count(0)  # not for embeddings
    ops.get_by_role("button", name="Add model").click()
    expect(ops.get_by_role("row", name=re.compile(embed))).to_contain_text("embeddings")
    ops.get_by_label("Context (tokens)").fill("-3")  # refused by the form itself (min 1): nothing is sent
    ops.get_by_label("Name").fill("bad name with spaces")
    ops.get_by_role("button", name="Add model").click()
    expect(ops.get_by_role("rowheader", name="bad name with spaces")).to_have_count(0)
    shot(ops, "operator-models")

    # grant it, then revoke it (asked first)
    ops.get_by_role("link", name="Tenants").click()
    ops.get_by_label("Tenant", exact=True).select_option(label=slug)
    ops.get_by_label("Model", exact=True).select_option(label=name)
    ops.get_by_role("button", name="Grant").click()
    row = ops.get_by_role("table", name="Tenants").get_by_role("row", name=re.compile(slug))
    expect(row).to_contain_text(name)
    asked: list[str] = []
    ops.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    row.get_by_role("button", name=f"Revoke {name} from {slug}").click()
    assert asked and name in asked[0] and slug in asked[0]
    ops.reload()
    expect(row).to_contain_text(name)
    ops.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name=f"Revoke {name} from {slug}").click()
    expect(row).not_to_contain_text(name)

    # a policy assigned to the model: unassign, then delete (both asked first)
    policy = f"silver-{uuid.uuid4().hex[:4]}"
    ops.get_by_role("link", name="SLO policies").click()
    ops.get_by_label("Name").fill(policy)
    ops.get_by_role("button", name="Create policy").click()
    ops.get_by_label("Policy", exact=True).select_option(label=policy)
    ops.get_by_label("Model", exact=True).select_option(label=name)
    ops.get_by_role("button", name="Assign", exact=True).click()
    prow = ops.get_by_role("row", name=re.compile(f"^{policy}"))
    expect(prow).to_contain_text(f"any tenant / {name}")
    ops.once("dialog", lambda d: d.accept())
    prow.get_by_role("button", name=re.compile("^Unassign")).click()
    expect(prow).to_contain_text("not assigned")
    ops.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    prow.get_by_role("button", name=f"Delete {policy}").click()
    assert policy in asked[-1]
    ops.reload()
    expect(ops.get_by_role("rowheader", name=policy, exact=True)).to_have_count(1)
    ops.once("dialog", lambda d: d.accept())
    ops.get_by_role("row", name=re.compile(f"^{policy}")).get_by_role("button", name=f"Delete {policy}").click()
    expect(ops.get_by_role("rowheader", name=policy, exact=True)).to_have_count(0)

    # a model no deployment uses can go, once confirmed
    ops.get_by_role("link", name="Models").click()
    ops.once("dialog", lambda d: d.accept())
    ops.get_by_role("button", name=f"Delete {name}").click()
    expect(ops.get_by_role("rowheader", name=name)).to_have_count(0)
    ops.context.close()


def test_an_operator_sets_a_tenants_rate_limit_and_the_gateway_enforces_it(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    import openai

    from .test_console import grant

    slug, _ = sign_up(page, stack)
    grant(stack.db, slug, stack.model_id)
    page.goto("/console/keys")
    page.get_by_label("Name", exact=True).fill("limited")
    page.get_by_role("button", name="Create key").click()
    secret = page.get_by_test_id("secret-value").input_value()

    ops = operator_page(browser, stack)
    ops.goto("/console/ops/tenants")
    form = ops.get_by_test_id("rate-limits")
    form.get_by_label("Organisation").select_option(label=slug)
    expect(form.get_by_test_id("limits-now")).to_contain_text("no tenant-wide limit")
    form.get_by_label("Requests per minute").fill("2")
    form.get_by_label("Tokens per request").fill("500")
    form.get_by_role("button", name="Set limits").click()
    expect(form.get_by_test_id("limits-now")).to_contain_text("2 requests/min")
    expect(form.get_by_test_id("limits-now")).to_contain_text("500 tokens per request")
    shot(ops, "operator-rate-limits")

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=secret, max_retries=0)
    ask = dict(model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    client.chat.completions.create(**ask)
    client.chat.completions.create(**ask)
    with pytest.raises(openai.BadRequestError, match="500 tokens per request"):  # the cap, before the limiter
        client.chat.completions.create(**{**ask, "max_tokens": 1000})
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**ask)

    # removing the limit asks first (this stack's gateway hears of it only when its key cache expires: no
    # invalidation fan-out here; tests/integration/gateway covers that)
    ops.once("dialog", lambda d: d.dismiss())
    form.get_by_role("button", name="Remove limits").click()
    expect(form.get_by_test_id("limits-now")).to_contain_text("2 requests/min")
    ops.once("dialog", lambda d: d.accept())
    form.get_by_role("button", name="Remove limits").click()
    expect(form.get_by_test_id("limits-now")).to_contain_text("no tenant-wide limit")
    ops.context.close()


def test_an_admin_token_is_made_used_and_revoked_from_the_console(browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    """The admin API's tokens have a page: a new token's secret is shown once and works on /admin/v1;
    revoking asks first (a dismissed question keeps it working) and refuses it at once."""
    import uuid

    import httpx

    ops = operator_page(browser, stack)
    name = f"pipeline-{uuid.uuid4().hex[:6]}"
    ops.get_by_role("link", name="Admin tokens").click()
    expect(ops.get_by_role("heading", name="Admin tokens", level=1)).to_be_visible()
    ops.get_by_label("Name").fill(name)
    ops.get_by_role("button", name="Create token").click()
    secret = ops.get_by_test_id("token-secret").input_value()
    assert secret.startswith("bt_admin_")
    shot(ops, "operator-admin-token-created")
    ops.get_by_role("button", name="I have saved it").click()
    expect(ops.get_by_test_id("token-secret")).to_have_count(0)
    row = ops.get_by_role("table", name="Admin tokens").get_by_role("row", name=re.compile(name))
    expect(row).to_contain_text("active")
    assert secret not in ops.content()  # shown once: the list holds only its prefix

    def admin_status() -> int:
        return httpx.get(f"{stack.url}/admin/v1/tenants", headers={"Authorization": f"Bearer {secret}"}).status_code

    assert admin_status() == 200
    asked: list[str] = []
    ops.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    row.get_by_role("button", name=f"Revoke {name}").click()
    assert asked and name in asked[0]
    ops.reload()
    expect(row).to_contain_text("active")
    assert admin_status() == 200
    ops.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name=f"Revoke {name}").click()
    expect(row).to_contain_text("revoked")
    assert admin_status() == 401
    ops.get_by_role("link", name="Audit log").click()
    expect(ops.get_by_role("row", name=re.compile("admin_token.revoke")).first).to_contain_text(name)
    ops.context.close()


def test_an_organisations_users_are_managed_from_the_console(page, browser, stack: Stack) -> None:  # type: ignore[no-untyped-def]
    """An operator adds a member to an organisation, who signs in; disabling asks first and then refuses the
    member's sign-in; enabling lets them back; removing asks first."""
    import uuid

    from .conftest import PASSWORD

    slug, _ = sign_up(page, stack)
    member = f"dev-{uuid.uuid4().hex[:6]}@{slug}.example.com"
    ops = operator_page(browser, stack)
    ops.get_by_role("link", name="Users").click()
    ops.get_by_label("Organisation").select_option(label=slug)
    users = ops.get_by_role("table", name="Users")
    expect(users.get_by_role("row")).to_have_count(2)  # the header and the one who signed up
    ops.get_by_label("Email").fill(member)
    ops.get_by_label("First password (at least 12 characters)").fill(PASSWORD)
    ops.get_by_role("button", name="Add user").click()
    row = users.get_by_role("row", name=re.compile(re.escape(member)))
    expect(row).to_contain_text("member")
    expect(row).to_contain_text("never")
    shot(ops, "operator-users")

    def sign_in(ok: bool) -> None:
        ctx = browser.new_context(base_url=stack.url)
        pg = ctx.new_page()
        pg.goto("/console/login")
        pg.get_by_label("Email").fill(member)
        pg.get_by_label("Password").fill(PASSWORD)
        pg.get_by_role("button", name="Sign in").click()
        if ok:
            expect(pg.get_by_role("heading", name=re.compile("Welcome"))).to_be_visible()
        else:
            expect(pg.get_by_role("alert")).to_contain_text("The email or password is not correct.")
        ctx.close()

    sign_in(ok=True)
    asked: list[str] = []
    ops.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    row.get_by_role("button", name=f"Disable {member}").click()
    assert asked and member in asked[0]
    expect(row).to_contain_text("active")
    ops.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name=f"Disable {member}").click()
    expect(row).to_contain_text("disabled")
    sign_in(ok=False)
    row.get_by_role("button", name=f"Enable {member}").click()
    expect(row).to_contain_text("active")
    sign_in(ok=True)
    row.get_by_role("button", name=f"Make admin {member}").click()
    expect(row).to_contain_text("admin")
    ops.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name=f"Remove {member}").click()
    expect(users.get_by_role("row", name=re.compile(re.escape(member)))).to_have_count(0)
    ops.context.close()
