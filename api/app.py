"""The FastAPI application: ``/v1`` (gateway), and ``/admin/v1`` and the console when installed.

:func:`create_app` builds nothing at import time. Its lifespan builds the composition root once per
process (database, Redis, upstream clients, the control plane: :mod:`baton.api.composition`), unless
tests hand parts in, and closes what it built. Optional routers of other parts of Baton (admin API,
console) are mounted when their modules exist.
"""

from __future__ import annotations

import hmac
import importlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from baton.api.body_limit import BodyLimit
from baton.api.composition import AppServices
from baton.api.errors import install_error_handlers
from baton.api.gateway.batch_routes import router as batch_router
from baton.api.gateway.batch_runner import BatchRunner
from baton.api.gateway.build import build_gateway
from baton.api.gateway.fastpath import FastPath
from baton.api.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from baton.api.gateway.routes import fallback
from baton.api.gateway.routes import router as gateway_router
from baton.core.db import Database
from baton.core.settings import Settings, load_settings
from baton.core.telemetry import setup_tracing

log = logging.getLogger(__name__)

#: (module, attribute, path prefix) of routers mounted when their module exists.
OPTIONAL_ROUTERS: tuple[tuple[str, str, str], ...] = (
    ("baton.api.admin.router", "router", "/admin/v1"),
    ("baton.api.console.router", "router", ""),
)


def include_optional_routers(
    app: FastAPI, routers: tuple[tuple[str, str, str], ...] = OPTIONAL_ROUTERS
) -> list[str]:
    """Includes each ``module:attribute`` router whose module is importable; returns those included.

    A module that exists but fails to import is a bug and raises."""
    mounted = []
    for module, attr, prefix in routers:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module.startswith(exc.name):
                continue
            raise
        app.include_router(getattr(mod, attr), prefix=prefix)
        mounted.append(module)
    return mounted


def create_app(
    settings: Settings,
    *,
    db: Database | None = None,
    redis: Any = None,
    router: Any = None,
    http_client: Any = None,
    optional_routers: tuple[tuple[str, str, str], ...] | None = None,
    tracing: Any = None,
    sync_redis: Any = None,
    notify: Any = None,
) -> FastAPI:
    """The whole HTTP API. ``db``/``redis`` (``redis.asyncio.Redis``)/``router``/``http_client`` may be
    passed in (tests, benchmarks); what the app builds itself it also closes. ``optional_routers``
    (default :data:`OPTIONAL_ROUTERS`) lists the other parts to mount when installed; ``()`` serves
    the gateway alone. ``sync_redis`` (``redis.Redis``) and ``notify`` (a
    :class:`baton.control.services.Notifier`) replace the control plane's own. ``tracing`` (a
    :class:`baton.core.telemetry.Tracing`) replaces the one the lifespan builds from
    ``settings.telemetry`` (tests pass an in-memory exporter)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_db = db is None
        own_redis = redis is None
        database = db or Database.for_services(settings)
        red: Any = redis or aioredis.Redis.from_url(settings.redis.url, socket_timeout=5, socket_connect_timeout=2,
                                               health_check_interval=30)
        own_tracing = tracing is None
        tracer = tracing or setup_tracing(settings.telemetry)
        gateway = build_gateway(settings, db=database, redis=red, router=router, http_client=http_client,
                                tracing=tracer, metrics=metrics)
        app.state.tracing = tracer
        app.state.settings = settings
        app.state.db = database
        app.state.redis = red
        app.state.gateway = gateway

        services = AppServices.build(settings, database, redis_client=sync_redis, notify=notify)
        app.state.services = services
        await gateway.start()
        runner = None
        if settings.gateway.batch.enabled:
            runner = BatchRunner(gateway, database, settings.gateway.batch,
                                 salt_secret=settings.security.key_secret.get_secret_value())
            await runner.start()
        app.state.batch_runner = runner
        try:
            yield
        finally:
            if runner is not None:
                await runner.stop()
            await gateway.stop()
            if http_client is None:
                await gateway.client.aclose()
            if own_redis:
                await red.aclose()
            services.close()
            if own_db:
                database.dispose()
            if own_tracing:
                tracer.shutdown()

    app = FastAPI(
        title="Baton",
        version="0.1.0",
        description="OpenAI-compatible inference for many tenants (`/v1`), with per-key limits and metering.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(FastPath)  # inside the body limit: the hot routes' plain case (api/gateway/fastpath.py)
    batch = settings.gateway.batch
    app.add_middleware(BodyLimit, max_bytes=settings.gateway.max_request_bytes,
                       uploads={"/v1/files": batch.max_file_bytes + 64 * 1024} if batch.enabled else None)

    app.include_router(gateway_router)
    if batch.enabled:
        app.include_router(batch_router)

    metrics = GatewayMetrics(tenant_labels=settings.telemetry.metrics_tenant_labels)
    scrape_ok = scrape_check(settings.telemetry.metrics_token)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        refused = scrape_ok(request)
        if refused is not None:
            return refused
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/healthz", include_in_schema=False, response_model=None)
    async def healthz(request: Request) -> dict[str, str] | Response:
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None and gateway.principals.secret_problem is not None:
            # the gateway cannot check a single key: say so to whatever watches its health (the why is logged)
            return JSONResponse({"status": "misconfigured",
                                 "problem": "the key secret is not the one the live API keys were made with"},
                                status_code=503)
        return {"status": "ok"}

    include_optional_routers(app, OPTIONAL_ROUTERS if optional_routers is None else optional_routers)
    app.include_router(fallback)  # last: every other /v1 path answers in OpenAI's shape
    _document_v1_errors_as_400(app)
    return app


_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def scrape_check(token: SecretStr | None) -> Callable[[Request], Response | None]:
    """Who may read ``/metrics``: with a token, a request bearing it (compared in constant time); without
    one, loopback clients only. Returns a check of a request: None to serve it, else the refusal."""
    want = token.get_secret_value().encode() if token is not None else None

    def check(request: Request) -> Response | None:
        if want is None:
            host = request.client.host if request.client else ""
            if host in _LOOPBACK:
                return None
            return Response("/metrics answers loopback clients only: set BATON_TELEMETRY__METRICS_TOKEN and "
                            "scrape with it.\n", status_code=403, media_type="text/plain")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), want):
            return None
        return Response("/metrics needs the scrape token (Authorization: Bearer ...).\n", status_code=401,
                        media_type="text/plain", headers={"www-authenticate": "Bearer"})

    return check


def _document_v1_errors_as_400(app: FastAPI) -> None:
    """FastAPI documents request validation as 422; ``/v1`` answers it as OpenAI does, with a 400."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path, operations in schema.get("paths", {}).items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        if isinstance(operation, dict):
                            operation.get("responses", {}).pop("422", None)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (one call per worker process): settings from the environment."""
    return create_app(load_settings())
