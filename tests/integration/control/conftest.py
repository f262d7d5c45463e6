"""An app with only the admin router (the same pieces the gateway's create_app mounts), on real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

ADMIN_TOKEN = "test-bootstrap-admin-token"


class Recorder:
    def __init__(self) -> None:
        self.reconciles: list[str] = []
        self.invalidations: list[tuple[str, uuid.UUID | None]] = []

    def trigger(self, reason: str) -> None:
        self.reconciles.append(reason)

    def invalidate(self, kind: str, id_: uuid.UUID | None) -> None:
        self.invalidations.append((kind, id_))


@pytest.fixture(scope="session")
def admin_settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={
        "security": settings.security.model_copy(update={"admin_token": SecretStr(ADMIN_TOKEN)}),
    })


@pytest.fixture(scope="session")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="session")
def admin_app(admin_settings, db, recorder) -> FastAPI:  # type: ignore[no-untyped-def]
    from baton.api.admin.deps import AdminContext
    from baton.api.admin.router import router
    from baton.control.keys import KeyService

    app = FastAPI(title="Baton admin (test)")
    app.include_router(router, prefix="/admin/v1")
    app.state.admin = AdminContext(
        settings=admin_settings, db=db, keys=KeyService(db, admin_settings),
        trigger_reconcile=recorder.trigger, invalidate=recorder.invalidate,
    )
    return app


@pytest.fixture(scope="session")
def client(admin_app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(admin_app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        yield c


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
