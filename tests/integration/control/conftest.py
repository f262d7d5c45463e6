"""An app with only the admin router (the same pieces the gateway's create_app mounts), on real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from baton.control.usecase import RecordingNotifier as Recorder

ADMIN_TOKEN = "test-bootstrap-admin-token"


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
    from baton.api.composition import AppServices

    app = FastAPI(title="Baton admin (test)")
    app.include_router(router, prefix="/admin/v1")
    services = AppServices.build(admin_settings, db, notify=recorder)
    app.state.admin = AdminContext.of(services)
    return app


@pytest.fixture(scope="session")
def client(admin_app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(admin_app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        yield c


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
