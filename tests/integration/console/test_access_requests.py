"""Access requests end to end, the operators' tenant actions and how each refuses, the playground key, and
sign-in/sign-up from a foreign origin. Real Postgres, the console's real routes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from baton.core import models as m
from baton.core.db import Database
from baton.core.settings import ConsoleSettings, TenancySettings

from .conftest import PASSWORD, Session, SignUp, add_model

API = "/console/api"
OPS = f"{API}/ops"
ID = "{id}"


@pytest.fixture()
def default_models(console_app) -> Iterator[Callable[[list[str]], None]]:  # type: ignore[no-untyped-def]
    """Sets ``tenancy.default_models`` of the running app for one test (empty by default)."""
    tenancy = console_app.state.services.control.tenancy
    before = tenancy.settings

    def set_(names: list[str]) -> None:
        tenancy.settings = before.model_copy(update={"tenancy": TenancySettings(default_models=names)})

    set_([])
    yield set_
    tenancy.settings = before


def _call(s: Session, method: str, path: str, *, json: Any = None, csrf: bool = True) -> Any:
    return s.client.request(method, path, json=json, headers={"x-csrf-token": s.csrf} if csrf else {})


def _requests(db: Database, tenant_id: uuid.UUID) -> list[m.AccessRequest]:
    """The tenant's access requests, detached with their loaded state (leaving the unit of work rolls back,
    which would expire them)."""
    with db.system() as uow:
        rows = list(uow.session.scalars(select(m.AccessRequest).where(m.AccessRequest.tenant_id == tenant_id)))
        for r in rows:
            uow.session.expunge(r)
        return rows


# --- sign-up and the overview of a brand-new organisation ---------------------------------------------

def test_sign_up_with_a_default_grant_files_no_request(db: Database, sign_up: SignUp, default_models) -> None:  # type: ignore[no-untyped-def]
    model = add_model(db)
    default_models([model.name])
    s = sign_up()
    assert _requests(db, s.tenant_id) == []  # type: ignore[arg-type]
    ov = s.get(f"{API}/tenant/overview").json()
    assert ov["access"] == {"state": "ready", "since": ov["access"]["since"], "pending": []}
    assert ov["models"] == 1 and ov["models_granted"] == [model.name]


def test_sign_up_without_a_default_grant_waits_with_a_pending_request(
        db: Database, sign_up: SignUp, default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    [row] = _requests(db, s.tenant_id)  # type: ignore[arg-type]
    assert row.state is m.AccessRequestState.PENDING and row.model_id is None
    assert row.requested_by == f"console:{s.email}" and row.resolved_at is None


def test_the_overview_of_a_brand_new_organisation(sign_up: SignUp, default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    r = s.get(f"{API}/tenant/overview")
    assert r.status_code == 200, r.text
    ov = r.json()
    assert ov["tenant"]["id"] == str(s.tenant_id)
    assert ov["models"] == 0 and ov["live_keys"] == 0 and ov["models_granted"] == []
    assert ov["usage_24h"]["requests"] == 0
    assert ov["access"]["state"] == "waiting"
    [pending] = ov["access"]["pending"]
    assert pending["state"] == "pending" and pending["model"] is None
    # what the keys page reads agrees with it: no model yet, and a key made now is accepted
    assert s.get(f"{API}/tenant/models").json() == []
    assert s.post(f"{API}/tenant/keys", json={"name": "early"}).status_code == 201
    assert s.get(f"{API}/tenant/overview").json()["live_keys"] == 1


# --- request -> approve -> the tenant can use the model -----------------------------------------------

def test_a_request_approved_by_an_operator_gives_the_model(
        db: Database, sign_up: SignUp, operator: Session, console_recorder, default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    model = add_model(db)
    cat = {e["name"]: e for e in s.get(f"{API}/tenant/catalogue").json()}
    assert cat[model.name]["granted"] is False and cat[model.name]["requested"] is False

    r = s.post(f"{API}/tenant/access-requests", json={"model_id": str(model.id), "note": "for the chatbot"})
    assert r.status_code == 201, r.text
    req = r.json()
    assert req["state"] == "pending" and req["model"] == model.name and req["note"] == "for the chatbot"
    again = s.post(f"{API}/tenant/access-requests", json={"model_id": str(model.id)})
    assert again.status_code == 409 and "already waiting" in again.json()["detail"]
    assert s.get(f"{API}/tenant/catalogue").json()  # still readable
    assert {e["name"]: e for e in s.get(f"{API}/tenant/catalogue").json()}[model.name]["requested"] is True

    queue = _call(operator, "GET", f"{OPS}/access-requests").json()
    mine = [q for q in queue["data"] if q["tenant_id"] == str(s.tenant_id)]
    assert [q["model"] for q in mine] == [None, model.name]  # sign-up's first, oldest first
    assert mine[1]["tenant_name"] and mine[1]["tenant_display_name"].startswith("Org ")

    console_recorder.invalidations.clear()
    ok = _call(operator, "POST", f"{OPS}/access-requests/{req['id']}/approve")
    assert ok.status_code == 200, ok.text
    assert ok.json()["state"] == "approved" and ok.json()["resolved_by"] == f"console:{operator.email}"
    assert ("tenant", s.tenant_id) in console_recorder.invalidations

    assert [mod["name"] for mod in s.get(f"{API}/tenant/models").json()] == [model.name]
    ov = s.get(f"{API}/tenant/overview").json()
    assert ov["access"]["state"] == "ready" and ov["access"]["pending"] == []  # the grant answered both
    states = {r.model_id: r.state for r in _requests(db, s.tenant_id)}  # type: ignore[arg-type]
    assert set(states.values()) == {m.AccessRequestState.APPROVED}
    mine = s.get(f"{API}/tenant/access-requests").json()
    assert {r["state"] for r in mine} == {"approved"} and len(mine) == 2
    assert s.post(f"{API}/tenant/access-requests", json={"model_id": str(model.id)}).status_code == 409
    with db.system() as uow:
        actions = [a.action for a in uow.audit.scalars(uow.audit.query(tenant_id=s.tenant_id))]
    assert actions.count("access_request.approve") == 2 and "tenant_model.grant" in actions


def test_a_request_for_any_model_needs_the_operators_choice(db: Database, sign_up: SignUp, operator: Session,
                                                            default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    [row] = _requests(db, s.tenant_id)  # type: ignore[arg-type]
    r = _call(operator, "POST", f"{OPS}/access-requests/{row.id}/approve")
    assert r.status_code == 400 and r.json()["param"] == "model_id"
    model = add_model(db)
    r = _call(operator, "POST", f"{OPS}/access-requests/{row.id}/approve", json={"model_id": str(model.id)})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model.name
    assert s.get(f"{API}/tenant/overview").json()["models_granted"] == [model.name]


def test_a_declined_request_says_why(db: Database, sign_up: SignUp, operator: Session, default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    [row] = _requests(db, s.tenant_id)  # type: ignore[arg-type]
    r = _call(operator, "POST", f"{OPS}/access-requests/{row.id}/decline", json={"reason": "Pilot is full"})
    assert r.status_code == 200, r.text
    [mine] = s.get(f"{API}/tenant/access-requests").json()
    assert mine["state"] == "declined" and mine["reason"] == "Pilot is full"
    assert s.get(f"{API}/tenant/overview").json()["access"]["state"] == "waiting"
    declined = _call(operator, "GET", f"{OPS}/access-requests?state=declined").json()["data"]
    assert any(d["id"] == str(row.id) for d in declined)
    # it may ask again
    assert s.post(f"{API}/tenant/access-requests", json={"note": "please"}).status_code == 201


# --- how the operators' tenant actions refuse ----------------------------------------------------------

#: (method, path) of every operator tenant action; ``{id}`` stands for the resource's id.
ACTIONS = [("PUT", f"/tenants/{ID}/models/{uuid.UUID(int=1)}"), ("DELETE", f"/tenants/{ID}/models/{uuid.UUID(int=1)}"),
           ("POST", f"/tenants/{ID}/suspend"), ("POST", f"/tenants/{ID}/resume"),
           ("POST", f"/access-requests/{ID}/approve"), ("POST", f"/access-requests/{ID}/decline"),
           ("DELETE", f"/admin-tokens/{ID}")]
#: Actions that make something (no id to be unknown or malformed).
CREATES = [("POST", "/admin-tokens")]
READS = [("GET", "/tenants"), ("GET", "/access-queue"), ("GET", "/access-requests"), ("GET", "/admin-tokens")]


def _path(path: str, id_: object | None = None) -> str:
    return OPS + path.replace(ID, str(id_ or uuid.uuid4()))


@pytest.mark.parametrize(("method", "path"), ACTIONS + CREATES + READS)
def test_a_tenant_session_is_refused(sign_up: SignUp, method: str, path: str) -> None:
    s = sign_up()
    r = _call(s, method, _path(path, s.tenant_id))
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == "Only platform operators may open this page."


@pytest.mark.parametrize(("method", "path"), ACTIONS + CREATES)
def test_an_action_without_the_csrf_token_is_refused(operator: Session, sign_up: SignUp, method: str,
                                                     path: str) -> None:
    t = sign_up()
    r = _call(operator, method, _path(path, t.tenant_id), csrf=False)
    assert r.status_code == 403, r.text
    assert r.headers["content-type"] == "application/problem+json" and "CSRF" in r.json()["detail"]


@pytest.mark.parametrize(("method", "path"), ACTIONS)
def test_an_unknown_id_is_404(operator: Session, method: str, path: str) -> None:
    r = _call(operator, method, _path(path))
    assert r.status_code == 404, r.text
    assert r.json()["detail"].startswith("No ")


def test_an_unknown_model_is_404(operator: Session, sign_up: SignUp) -> None:
    t = sign_up()
    r = _call(operator, "PUT", f"{OPS}/tenants/{t.tenant_id}/models/{uuid.uuid4()}")
    assert r.status_code == 404 and r.json()["detail"].startswith("No model")


@pytest.mark.parametrize(("method", "path"), ACTIONS)
def test_a_malformed_id_is_400_in_plain_words(operator: Session, method: str, path: str) -> None:
    r = _call(operator, method, _path(path, "not-an-id"))
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "not a valid id" in detail and "Input should" not in detail and "UUID" not in detail


def test_an_answered_request_cannot_be_answered_again(db: Database, sign_up: SignUp, operator: Session,
                                                      default_models) -> None:  # type: ignore[no-untyped-def]
    s = sign_up()
    model = add_model(db)
    [row] = _requests(db, s.tenant_id)  # type: ignore[arg-type]
    url = f"{OPS}/access-requests/{row.id}"
    assert _call(operator, "POST", f"{url}/approve", json={"model_id": str(model.id)}).status_code == 200
    twice = _call(operator, "POST", f"{url}/approve", json={"model_id": str(model.id)})
    assert twice.status_code == 409 and twice.json()["detail"] == "This request was already approved."
    late = _call(operator, "POST", f"{url}/decline")
    assert late.status_code == 409


def test_a_request_naming_its_model_is_approved_as_it_is(db: Database, sign_up: SignUp, operator: Session) -> None:
    s = sign_up()
    wanted, other = add_model(db), add_model(db)
    req = s.post(f"{API}/tenant/access-requests", json={"model_id": str(wanted.id)}).json()
    r = _call(operator, "POST", f"{OPS}/access-requests/{req['id']}/approve", json={"model_id": str(other.id)})
    assert r.status_code == 400 and r.json()["param"] == "model_id"


def test_invalid_bodies_are_400(operator: Session, sign_up: SignUp) -> None:
    s = sign_up()
    assert s.post(f"{API}/tenant/access-requests", json={"model_id": "nope"}).status_code == 400
    r = s.post(f"{API}/tenant/access-requests", json={"note": "x" * 1001})
    assert r.status_code == 400 and r.json()["param"] == "note"
    r = s.post(f"{API}/tenant/access-requests", json={"model_id": str(uuid.uuid4())})
    assert r.status_code == 404
    r = _call(operator, "POST", f"{OPS}/access-requests/{uuid.uuid4()}/decline", json={"why": "x"})
    assert r.status_code == 400 and r.json()["param"] == "why"
    r = _call(operator, "GET", f"{OPS}/access-requests?state=maybe")
    assert r.status_code == 400


def test_suspend_and_resume_answer_the_tenant(operator: Session, sign_up: SignUp, console_recorder) -> None:  # type: ignore[no-untyped-def]
    t = sign_up()
    r = _call(operator, "POST", f"{OPS}/tenants/{t.tenant_id}/suspend")
    assert r.status_code == 200 and r.json()["status"] == "suspended"
    assert ("tenant", t.tenant_id) in console_recorder.invalidations
    row = next(x for x in _call(operator, "GET", f"{OPS}/tenants").json() if x["id"] == str(t.tenant_id))
    assert row["status"] == "suspended" and row["users"] == 1 and row["models"] == []
    assert _call(operator, "POST", f"{OPS}/tenants/{t.tenant_id}/resume").json()["status"] == "active"


# --- the playground's key -------------------------------------------------------------------------------

def test_one_live_playground_key_per_user(db: Database, sign_up: SignUp, settings) -> None:  # type: ignore[no-untyped-def]
    from baton.control.keys import KeyService
    from baton.core import errors

    s = sign_up()
    model = add_model(db)
    with db.system() as uow:
        uow.tenant_models.grant(s.tenant_id, model.id)  # type: ignore[arg-type]
        uow.commit()
    first = s.post(f"{API}/tenant/playground-key", json={"model": model.name})
    assert first.status_code == 201, first.text
    assert first.json()["key"]["kind"] == "playground"
    second = s.post(f"{API}/tenant/playground-key", json={"model": model.name})
    assert second.status_code == 201
    service = KeyService(db, settings)
    with pytest.raises(errors.AuthenticationError):
        service.authenticate(first.json()["secret"])
    assert service.authenticate(second.json()["secret"]).tenant_id == s.tenant_id
    keys = s.get(f"{API}/tenant/keys").json()
    assert [k["id"] for k in keys if k["kind"] == "playground"] == [second.json()["key"]["id"]]
    # a playground key is not one of the organisation's API keys on the overview
    assert s.get(f"{API}/tenant/overview").json()["live_keys"] == 0
    no_access = s.post(f"{API}/tenant/playground-key", json={"model": "not-granted"})
    assert no_access.status_code == 400 and no_access.json()["param"] == "model_scope"


# --- sign-in and sign-up from another site ---------------------------------------------------------------

def _signup_body() -> dict[str, str]:
    slug = f"o-{uuid.uuid4().hex[:10]}"
    return {"organisation": "Origin test", "tenant_name": slug, "email": f"a@{slug}.example.com",
            "password": PASSWORD}


@pytest.mark.parametrize("origin", ["https://evil.example.com", "null", "http://testserver:8080",
                                    "https://testserver", "not a url"])
def test_a_foreign_origin_cannot_sign_in_or_up(client, operator: Session, origin: str) -> None:  # type: ignore[no-untyped-def]
    r = client.post(f"{API}/login", json={"email": operator.email, "password": PASSWORD},
                    headers={"origin": origin})
    assert r.status_code == 403, r.text
    assert r.headers["content-type"] == "application/problem+json" and "baton_console" not in r.headers.get(
        "set-cookie", "")
    body = _signup_body()
    r = client.post(f"{API}/signup", json=body, headers={"origin": origin})
    assert r.status_code == 403, r.text
    assert client.post(f"{API}/login", json={"email": body["email"], "password": PASSWORD}).status_code == 401


def test_the_own_origin_or_no_origin_signs_in(client, operator: Session) -> None:  # type: ignore[no-untyped-def]
    for headers in ({"origin": "http://testserver"}, {"origin": "HTTP://TestServer:80"}, {}):
        r = client.post(f"{API}/login", json={"email": operator.email, "password": PASSWORD}, headers=headers)
        assert r.status_code == 200, (headers, r.text)
    r = client.post(f"{API}/signup", json=_signup_body(), headers={"origin": "http://testserver"})
    assert r.status_code == 201, r.text


def test_configured_origins_are_accepted(console_app, client, operator: Session) -> None:  # type: ignore[no-untyped-def]
    ctx = console_app.state.console
    before = ctx.settings
    ctx.settings = before.model_copy(update={"console": ConsoleSettings(allowed_origins=["https://app.example.com"])})
    try:
        ok = client.post(f"{API}/login", json={"email": operator.email, "password": PASSWORD},
                         headers={"origin": "https://app.example.com"})
        assert ok.status_code == 200, ok.text
        assert client.post(f"{API}/login", json={"email": operator.email, "password": PASSWORD},
                           headers={"origin": "https://other.example.com"}).status_code == 403
    finally:
        ctx.settings = before


def test_admin_tokens_from_the_console_refuse_bad_names_and_work_on_the_admin_api(
        operator: Session, console_app) -> None:  # type: ignore[no-untyped-def]
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from baton.api.admin.router import router

    admin_app = FastAPI()  # the admin API over the console's own services
    admin_app.include_router(router, prefix="/admin/v1")
    admin_app.state.admin = console_app.state.admin

    for body, param in (({"name": ""}, "name"), ({"name": "x" * 101}, "name"), ({}, "name"),
                        ({"name": "ok", "scope": "all"}, "scope")):
        r = _call(operator, "POST", f"{OPS}/admin-tokens", json=body)
        assert r.status_code == 400 and r.json()["param"] == param, r.text
    made = _call(operator, "POST", f"{OPS}/admin-tokens", json={"name": "ci"})
    assert made.status_code == 201, made.text
    secret, tid = made.json()["secret"], made.json()["token"]["id"]
    listed = _call(operator, "GET", f"{OPS}/admin-tokens").json()
    assert any(t["id"] == tid and t["revoked_at"] is None for t in listed) and secret not in str(listed)
    with TestClient(admin_app, headers={"Authorization": f"Bearer {secret}"}) as admin:
        assert admin.get("/admin/v1/tenants").status_code == 200
        assert _call(operator, "DELETE", f"{OPS}/admin-tokens/{tid}").status_code == 204
        assert _call(operator, "DELETE", f"{OPS}/admin-tokens/{tid}").status_code == 204  # idempotent
        assert admin.get("/admin/v1/tenants").status_code == 401


def test_an_organisations_users_from_the_console_refuse_what_they_must(operator: Session, sign_up: SignUp) -> None:
    t = sign_up()
    base = f"{OPS}/tenants/{t.tenant_id}/users"
    good = {"email": f"dev@{uuid.uuid4().hex[:6]}.example.com", "password": "a fine long passphrase"}
    # a tenant's own session, and a missing CSRF token
    assert _call(t, "GET", f"/console/api/ops/tenants/{t.tenant_id}/users").status_code == 403
    assert _call(t, "POST", f"/console/api/ops/tenants/{t.tenant_id}/users", json=good).status_code == 403
    assert _call(operator, "POST", base, json=good, csrf=False).status_code == 403
    # bad bodies, in plain words
    for body, param in (({**good, "password": "short"}, "password"), ({**good, "email": "not-an-email"}, "email"),
                        ({**good, "role": "operator"}, "role"), ({**good, "extra": 1}, "extra")):
        r = _call(operator, "POST", base, json=body)
        assert r.status_code == 400 and r.json()["param"] == param, r.text
        assert "Input should" not in r.json()["detail"]
    made = _call(operator, "POST", base, json=good)
    assert made.status_code == 201 and made.json()["role"] == "tenant_member", made.text
    uid = made.json()["id"]
    assert _call(operator, "POST", base, json=good).status_code == 409  # the email is taken
    # unknown and malformed ids
    assert _call(operator, "GET", f"{OPS}/tenants/{uuid.uuid4()}/users").status_code == 404
    for method, body in (("PATCH", {"disabled": True}), ("DELETE", None)):
        assert _call(operator, method, f"{base}/{uuid.uuid4()}", json=body).status_code == 404
        r = _call(operator, method, f"{base}/not-an-id", json=body)
        assert r.status_code == 400 and "not a valid id" in r.json()["detail"]
    other = sign_up()  # a user id under another organisation is not found there
    assert _call(operator, "PATCH", f"{OPS}/tenants/{other.tenant_id}/users/{uid}",
                 json={"disabled": True}).status_code == 404
    r = _call(operator, "PATCH", f"{base}/{uid}", json={"password": "short"})
    assert r.status_code == 400 and r.json()["param"] == "password"
    assert _call(operator, "PATCH", f"{base}/{uid}", json={"disabled": True}).json()["disabled"] is True
    assert _call(operator, "DELETE", f"{base}/{uid}").status_code == 204
    assert _call(operator, "DELETE", f"{base}/{uid}").status_code == 404


def test_a_password_reset_ends_the_users_sessions(operator: Session, sign_up: SignUp) -> None:
    """An operator resets a user's password: the user's open console session ends at once (as disabling and
    deleting end it), and the new password signs in."""
    t = sign_up()
    assert t.get(f"{API}/tenant/keys").status_code == 200
    users = _call(operator, "GET", f"{OPS}/tenants/{t.tenant_id}/users").json()
    uid = next(u["id"] for u in users if u["email"] == t.email)
    new_password = "a new and long enough password"
    assert _call(operator, "PATCH", f"{OPS}/tenants/{t.tenant_id}/users/{uid}",
                 json={"password": new_password}).status_code == 200
    assert t.get(f"{API}/tenant/keys").status_code == 401
    r = t.client.post(f"{API}/login", json={"email": t.email, "password": new_password})
    assert r.status_code == 200, r.text
