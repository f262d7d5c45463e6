"""Gateway fixtures: real Postgres and Redis, the stub upstream and the gateway served by uvicorn."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from baton.control.keys import KeyService, RedisKeyEvents
from baton.core import models as m
from baton.core.db import Database
from baton.core.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(app: Any, port: int | None = None) -> Iterator[str]:
    """Runs an ASGI app under uvicorn (uvloop, httptools) in a thread; yields its base URL."""
    import uvicorn

    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                            lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="session")
def stub_url() -> Iterator[str]:
    from tests.integration.gateway.stub_upstream import app

    with serve(app) as url:
        yield url


@dataclass(frozen=True)
class Catalogue:
    small: str  # context 256
    big: str  # context 4096
    other: str  # granted to nobody by default
    embed: str = ""  # an embedding model, context 64
    tools: str = ""  # a generating model with a tool-call parser, context 4096


def add_model(db: Database, name: str, context_length: int, source: str = "/nonexistent/model",
              **serving: str) -> m.Model:
    with db.system() as uow:
        model = uow.models.add(m.Model(name=name, source=source, context_length=context_length, num_layers=2,
                                       num_kv_heads=2, head_dim=32, dtype="float32", **serving))
        uow.commit()
    return model


@pytest.fixture(scope="session")
def catalogue(db: Database) -> Catalogue:
    suffix = uuid.uuid4().hex[:6]
    cat = Catalogue(small=f"gw-small-{suffix}", big=f"gw-big-{suffix}", other=f"gw-other-{suffix}",
                    embed=f"gw-embed-{suffix}", tools=f"gw-tools-{suffix}")
    add_model(db, cat.small, 256)
    add_model(db, cat.big, 4096)
    add_model(db, cat.other, 4096)
    add_model(db, cat.embed, 64, kind="embed")
    add_model(db, cat.tools, 4096, tool_call_parser="hermes")
    return cat


@pytest.fixture(scope="session")
def gw_settings(settings: Settings, catalogue: Catalogue, stub_url: str) -> Settings:
    routes = {name: f"{stub_url}/v1" for name in (catalogue.small, catalogue.big, catalogue.other, catalogue.embed,
                                                 catalogue.tools)}
    gateway = settings.gateway.model_copy(update={"upstreams": routes, "usage_flush_interval_s": 0.05,
                                                  "ratelimit_lease_s": 2.0})
    return settings.model_copy(update={"gateway": gateway})


@pytest.fixture(scope="session")
def gateway_url(gw_settings: Settings) -> Iterator[str]:
    from baton.api.app import create_app

    with serve(create_app(gw_settings, optional_routers=())) as url:
        yield url


@pytest.fixture(scope="session")
def keys(db: Database, settings: Settings) -> KeyService:
    return KeyService(db, settings, events=RedisKeyEvents.from_settings(settings))


@dataclass(frozen=True)
class TenantKey:
    tenant_id: uuid.UUID
    key_id: uuid.UUID
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.secret}"}


MakeTenant = Callable[..., TenantKey]


def create_tenant_key(
    db: Database, keys: KeyService, models: list[str], *, scope: tuple[str, ...] = (),
    tenant_limits: dict[str, int] | None = None, key_limits: dict[str, int] | None = None,
) -> TenantKey:
    """A new tenant granted ``models``, one key, and optional limits (rpm/tpm/concurrency/per_request)."""
    name = f"gw-{uuid.uuid4().hex[:10]}"
    with db.system() as uow:
        tenant = uow.tenants.add(m.Tenant(name=name, display_name=name))
        for model_name in models:
            model = uow.models.by_name(model_name)
            assert model is not None
            uow.tenant_models.grant(tenant.id, model.id)
        uow.commit()
    issued = keys.issue(tenant_id=tenant.id, name="test", created_by="test", model_scope=scope)
    with db.tenant(tenant.id) as uow:
        if tenant_limits:
            uow.rate_limits.upsert(tenant.id, None, **_limits(tenant_limits))
        if key_limits:
            uow.rate_limits.upsert(tenant.id, issued.key.id, **_limits(key_limits))
        uow.commit()
    return TenantKey(tenant.id, issued.key.id, issued.secret)


@pytest.fixture()
def make_tenant(db: Database, keys: KeyService) -> MakeTenant:
    def make(models: list[str], **kwargs: Any) -> TenantKey:
        return create_tenant_key(db, keys, models, **kwargs)

    return make


def _limits(d: dict[str, int]) -> dict[str, int | None]:
    return {"requests_per_minute": d.get("rpm"), "tokens_per_minute": d.get("tpm"),
            "max_concurrency": d.get("concurrency"), "max_tokens_per_request": d.get("per_request")}


def openai_client(url: str, key: TenantKey) -> openai.OpenAI:
    """The official client on the gateway at ``url`` with ``key`` (no retries: a test sees every answer)."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key.secret, max_retries=0)


def usage_rows(db: Database, tenant_id: uuid.UUID) -> list[m.UsageRecord]:
    with db.system() as uow:
        rows = list(uow.session.scalars(uow.usage.query(tenant_id=tenant_id)).all())
        uow.session.expunge_all()
        return rows


def request_rows(db: Database, tenant_id: uuid.UUID) -> list[m.RequestRecord]:
    with db.system() as uow:
        rows = list(uow.session.scalars(uow.requests.query(tenant_id=tenant_id)).all())
        uow.session.expunge_all()
        return rows


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Polls until ``predicate()`` is truthy; returns its value (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


@pytest.fixture()
def http(gateway_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway_url, timeout=30) as client:
        yield client
