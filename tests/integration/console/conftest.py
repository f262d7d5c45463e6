"""Console fixtures: the console and admin routers on real Postgres and Redis, through TestClient."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from baton.control.usecase import RecordingNotifier as Recorder
from baton.core import models as m
from baton.core.db import Database

PASSWORD = "correct horse battery staple"




@pytest.fixture(scope="session")
def console_recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="session")
def console_app(settings, db, console_recorder) -> FastAPI:  # type: ignore[no-untyped-def]
    import redis

    from baton.api.admin.deps import AdminContext
    from baton.api.composition import AppServices
    from baton.api.console.context import ConsoleContext
    from baton.api.console.router import router
    from baton.api.errors import install_error_handlers

    app = FastAPI(title="Baton console (test)")
    install_error_handlers(app)
    app.include_router(router)
    app.state.settings = settings
    app.state.db = db
    client = redis.Redis.from_url(settings.redis.url)
    # failed sign-ins of earlier runs (same test client address, same emails) must not throttle this one
    for key in client.scan_iter("baton:console:login:*"):
        client.delete(key)
    services = AppServices.build(settings, db, redis_client=client, notify=console_recorder)
    app.state.services = services
    app.state.console = ConsoleContext.of(services)
    app.state.admin = AdminContext.of(services)
    return app


@dataclass
class Session:
    client: TestClient
    csrf: str
    tenant_id: uuid.UUID | None
    email: str

    def post(self, url: str, **kw):  # type: ignore[no-untyped-def]
        return self.client.post(url, headers={"x-csrf-token": self.csrf, **kw.pop("headers", {})}, **kw)

    def put(self, url: str, **kw):  # type: ignore[no-untyped-def]
        return self.client.put(url, headers={"x-csrf-token": self.csrf, **kw.pop("headers", {})}, **kw)

    def patch(self, url: str, **kw):  # type: ignore[no-untyped-def]
        return self.client.patch(url, headers={"x-csrf-token": self.csrf, **kw.pop("headers", {})}, **kw)

    def get(self, url: str, **kw):  # type: ignore[no-untyped-def]
        return self.client.get(url, **kw)


@pytest.fixture()
def client(console_app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(console_app) as c:
        yield c


SignUp = Callable[..., Session]


@pytest.fixture()
def sign_up(console_app) -> Iterator[SignUp]:  # type: ignore[no-untyped-def]
    clients: list[TestClient] = []

    def make() -> Session:
        c = TestClient(console_app)
        clients.append(c)
        slug = f"t-{uuid.uuid4().hex[:10]}"
        email = f"admin@{slug}.example.com"
        r = c.post("/console/api/signup", json={"organisation": f"Org {slug}", "tenant_name": slug,
                                                "email": email, "password": PASSWORD})
        assert r.status_code == 201, r.text
        body = r.json()
        return Session(c, body["csrf_token"], uuid.UUID(body["tenant"]["id"]), email)

    yield make
    for c in clients:
        c.close()


@pytest.fixture()
def operator(console_app, db: Database) -> Iterator[Session]:  # type: ignore[no-untyped-def]
    from baton.api.console.auth import create_operator

    email = f"op-{uuid.uuid4().hex[:8]}@baton.example.com"
    create_operator(db, email=email, password=PASSWORD, actor="test")
    with TestClient(console_app) as c:
        r = c.post("/console/api/login", json={"email": email, "password": PASSWORD})
        assert r.status_code == 200, r.text
        yield Session(c, r.json()["csrf_token"], None, email)


def add_member(console_app, operator: Session, tenant_id: uuid.UUID) -> Session:  # type: ignore[no-untyped-def]
    """A member (``tenant_member``) of the tenant, added by an operator and signed in; close its client."""
    email = f"member-{uuid.uuid4().hex[:8]}@example.com"
    made = operator.post(f"/console/api/ops/tenants/{tenant_id}/users",
                         json={"email": email, "password": PASSWORD, "role": "tenant_member"})
    assert made.status_code == 201 and made.json()["role"] == "tenant_member", made.text
    c = TestClient(console_app)
    r = c.post("/console/api/login", json={"email": email, "password": PASSWORD})
    assert r.status_code == 200, r.text
    return Session(c, r.json()["csrf_token"], tenant_id, email)


def add_model(db: Database, name: str | None = None) -> m.Model:
    with db.system() as uow:
        model = uow.models.add(m.Model(name=name or f"console-model-{uuid.uuid4().hex[:6]}", source="/nonexistent",
                                       context_length=2048, num_layers=2, num_kv_heads=2, head_dim=32,
                                       dtype="float32", params_b=0.01))
        uow.commit()
    return model


def grant(db: Database, tenant_id: uuid.UUID, model_id: uuid.UUID) -> None:
    with db.system() as uow:
        uow.tenant_models.grant(tenant_id, model_id)
        uow.commit()
