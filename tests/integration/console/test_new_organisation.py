"""A new organisation from its sign-up: what it may call (the default grants, or a wait for an
operator), its overview, and the operator's access queue. Real Postgres, the console's real routes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from baton.core import models as m
from baton.core.settings import TenancySettings

from .conftest import PASSWORD, Session, SignUp, add_model, grant

API = "/console/api"


@pytest.fixture()
def default_models(console_app) -> Iterator[Callable[[list[str]], None]]:  # type: ignore[no-untyped-def]
    """Sets ``tenancy.default_models`` of the running app for one test (empty by default: wait for an
    operator)."""
    tenancy = console_app.state.services.control.tenancy
    before = tenancy.settings

    def set_(names: list[str]) -> None:
        tenancy.settings = before.model_copy(update={"tenancy": TenancySettings(default_models=names)})

    set_([])
    yield set_
    tenancy.settings = before


def _overview(s: Session) -> dict:  # type: ignore[type-arg]
    r = s.get(f"{API}/tenant/overview")
    assert r.status_code == 200, r.text
    out: dict = r.json()  # type: ignore[type-arg]
    return out


def test_a_new_organisation_gets_the_default_models_at_sign_up(db, sign_up: SignUp, default_models) -> None:  # type: ignore[no-untyped-def]
    model = add_model(db)
    add_model(db)  # another model, not a default
    default_models([model.name])
    s = sign_up()
    body = _overview(s)
    assert body["access"]["state"] == "ready"
    assert body["models_granted"] == [model.name]
    models = s.get(f"{API}/tenant/models").json()
    assert [mod["name"] for mod in models] == [model.name]


def test_without_default_models_a_new_organisation_waits_in_the_operators_queue(
        db, sign_up: SignUp, operator: Session, default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    body = _overview(s)
    assert body["access"]["state"] == "waiting" and body["models_granted"] == []
    assert body["tenant"]["id"] == str(s.tenant_id) and body["live_keys"] == 0
    queue = operator.get(f"{API}/ops/access-queue")
    assert queue.status_code == 200, queue.text
    row = next(q for q in queue.json() if q["tenant_id"] == str(s.tenant_id))
    assert row["users"] == [s.email]

    model = add_model(db)
    r = operator.put(f"{API}/ops/tenants/{s.tenant_id}/models/{model.id}")
    assert r.status_code == 204, r.text
    assert _overview(s)["access"]["state"] == "ready"
    assert all(q["tenant_id"] != str(s.tenant_id) for q in operator.get(f"{API}/ops/access-queue").json())


def test_a_tenant_cannot_read_the_access_queue(sign_up: SignUp) -> None:
    s = sign_up()
    r = s.get(f"{API}/ops/access-queue")
    assert r.status_code == 403


def test_every_model_with_a_star(db, sign_up: SignUp, default_models) -> None:  # type: ignore[no-untyped-def]
    a, b = add_model(db), add_model(db)
    default_models(["*"])
    s = sign_up()
    granted = set(_overview(s)["models_granted"])
    assert {a.name, b.name} <= granted
    grant(db, s.tenant_id, a.id)  # idempotent with the default grant
    assert {a.name, b.name} <= set(_overview(s)["models_granted"])


def test_bad_input_is_answered_in_plain_words(sign_up: SignUp) -> None:
    s = sign_up()
    r = s.get(f"{API}/tenant/requests/not-a-uuid")
    assert r.status_code == 400, r.text
    body = r.json()
    assert "Input should" not in r.text and "found `n`" not in r.text
    assert "not a valid id" in body["detail"]
    r = s.post(f"{API}/tenant/keys", json={"name": "x" * 101})
    assert r.status_code == 400
    assert r.json()["errors"][0] == {"param": "name", "message": "Use at most 100 characters"}


def test_a_signed_in_user_of_a_suspended_organisation_is_told_why(sign_up: SignUp, operator: Session) -> None:
    s = sign_up()
    assert s.get(f"{API}/session").status_code == 200
    r = operator.post(f"{API}/ops/tenants/{s.tenant_id}/suspend")
    assert r.status_code == 200, r.text
    r = s.get(f"{API}/session")
    assert r.status_code == 403
    assert r.json()["detail"] == "This organisation is suspended; contact the operators."
    assert s.get(f"{API}/tenant/overview").status_code == 403
    assert operator.post(f"{API}/ops/tenants/{s.tenant_id}/resume").status_code == 200
    assert s.get(f"{API}/session").status_code == 200


@pytest.fixture()
def review(console_app) -> Iterator[Callable[[bool], None]]:  # type: ignore[no-untyped-def]
    """Turns ``tenancy.signup_review`` on or off for one test (the console reads it per request)."""
    import dataclasses

    ctx = console_app.state.console

    def set_(on: bool) -> None:
        settings = ctx.settings.model_copy(update={"tenancy": TenancySettings(signup_review=on)})
        console_app.state.console = dataclasses.replace(ctx, settings=settings)

    yield set_
    console_app.state.console = ctx


def _signup(c, email: str):  # type: ignore[no-untyped-def]
    slug = f"t-{uuid.uuid4().hex[:10]}"
    return c.post(f"{API}/signup", json={"organisation": f"Org {slug}", "tenant_name": slug, "email": email,
                                         "password": PASSWORD}), slug


def test_under_review_a_sign_up_does_not_say_whether_the_email_is_registered(  # type: ignore[no-untyped-def]
        console_app, db, sign_up: SignUp, operator: Session, review) -> None:
    known = sign_up()  # registered while sign-ups were open
    review(True)
    new_email = f"new-{uuid.uuid4().hex[:8]}@example.com"
    with TestClient(console_app) as c:
        again, _ = _signup(c, known.email)
        fresh, slug = _signup(c, new_email)
        # the same status and body, no session either way
        assert again.status_code == fresh.status_code == 202, (again.text, fresh.text)
        assert again.json() == fresh.json() and fresh.json()["status"] == "pending_review"
        assert "set-cookie" not in again.headers and "set-cookie" not in fresh.headers
        # the new admin cannot sign in yet, and is told exactly what an unknown email is told
        pending = c.post(f"{API}/login", json={"email": new_email, "password": PASSWORD})
        unknown = c.post(f"{API}/login", json={"email": f"x-{new_email}", "password": PASSWORD})
        assert pending.status_code == unknown.status_code == 401
        assert pending.json()["detail"] == unknown.json()["detail"]
    with db.system() as uow:
        tenant = uow.tenants.by_name(slug)
        assert tenant is not None and tenant.status is m.TenantStatus.SUSPENDED
        tenant_id = tenant.id
    # an operator approves: resuming the organisation lets its admin in
    assert operator.post(f"{API}/ops/tenants/{tenant_id}/resume").status_code == 200
    with TestClient(console_app) as c:
        r = c.post(f"{API}/login", json={"email": new_email, "password": PASSWORD})
        assert r.status_code == 200, r.text
        assert r.json()["tenant"]["id"] == str(tenant_id)


def test_with_open_sign_ups_trying_registered_emails_is_throttled_like_passwords(  # type: ignore[no-untyped-def]
        console_app, sign_up: SignUp) -> None:
    """A registered email is a 409 (the organisation would work at once, so the answer must say), and each
    such try counts against the client address's sign-in throttle: 5 tries at one email, then 429."""
    known = sign_up()
    with TestClient(console_app, client=("203.0.113.99", 40000)) as c:
        codes = [_signup(c, known.email)[0].status_code for _ in range(6)]
    assert codes == [409] * 5 + [429]
