"""Where a model is served: model name -> an OpenAI-compatible base URL.

- :class:`StaticRouter`: ``gateway.upstreams`` from settings (a bare engine in development and tests).
- :class:`DeploymentRouter`: the model's running deployment in Postgres, reached through Ray Serve's
  HTTP proxy at ``{ray.serve_url}/{deployment name}`` (one Serve application per deployment, route
  prefix ``/<deployment name>``, serving the catalogue model name). A P/D deployment's prefill pool is
  an application of its own at ``/<deployment name>.prefill``: the upstream's fallback, a whole engine
  that also decodes, for when the decode pool cannot take a call. The whole table is read at most once
  per ``ttl`` seconds, in a worker thread, in the background once it is known (a request never waits for
  the read of a route it has); if Postgres is down the last known routes stay.
- :class:`ChainRouter`: the first router that knows the model wins.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from baton.core import errors
from baton.core import models as m
from baton.core.db import Database
from baton.dataplane.render import PREFILL_APP_SUFFIX

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Upstream:
    """An OpenAI-compatible server: ``{base_url}/chat/completions`` etc."""

    base_url: str  # ends with /v1
    deployment: str | None = None
    #: Another pool of the same deployment that can serve the whole request (a P/D deployment's prefill
    #: pool), used when ``base_url`` has no live replica; ends with /v1.
    fallback_url: str | None = None


class Router(Protocol):
    async def resolve(self, model: str) -> Upstream | None:
        """The upstream serving ``model`` now, or None."""
        ...


def _v1(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


class StaticRouter:
    def __init__(self, routes: Mapping[str, str], fallbacks: Mapping[str, str] | None = None) -> None:
        fb = fallbacks or {}
        self._routes = {name: Upstream(_v1(url), fallback_url=_v1(fb[name]) if name in fb else None)
                        for name, url in routes.items()}

    async def resolve(self, model: str) -> Upstream | None:
        return self._routes.get(model)


#: Observed states of a deployment that may be serving (Serve runs its app, maybe a replica short).
SERVABLE = frozenset({m.ObservedState.RUNNING, m.ObservedState.DEPLOYING, m.ObservedState.UNHEALTHY})


class DeploymentRouter:
    def __init__(self, db: Database, serve_url: str, *, ttl: float = 2.0) -> None:
        self._db = db
        self._serve_url = serve_url.rstrip("/")
        self._ttl = ttl
        self._routes: dict[str, Upstream] = {}
        self._loaded_at = float("-inf")
        self._lock = asyncio.Lock()
        self._reloading: asyncio.Task[None] | None = None  # the background re-read, while one runs

    async def resolve(self, model: str) -> Upstream | None:
        """The model's route. Past the TTL, a known route is answered at once while the routes are read again
        in the background (a request never waits for Postgres after an idle spell); a model without a route
        waits for the read (it may have been deployed just now)."""
        if time.monotonic() - self._loaded_at > self._ttl:
            route = self._routes.get(model)
            if route is None:
                await self._reload_once()
            else:
                if self._reloading is None or self._reloading.done():
                    self._reloading = asyncio.get_running_loop().create_task(self._reload_once())
                return route
        return self._routes.get(model)

    async def _reload_once(self) -> None:
        async with self._lock:
            if time.monotonic() - self._loaded_at > self._ttl:
                await self._reload()

    async def _reload(self) -> None:
        try:
            self._routes = await asyncio.to_thread(self._read)
        except errors.UnavailableError:
            log.warning("routes not refreshed: the database is unavailable; keeping the last known ones")
        self._loaded_at = time.monotonic()

    def _read(self) -> dict[str, Upstream]:
        with self._db.system() as uow:
            names = {model.id: model.name for model in uow.models.list()}
            routes: dict[str, Upstream] = {}
            # Ordered by name, running ones first: the choice is stable. A deployment Serve reports as
            # deploying or unhealthy (a replica died and is being replaced) keeps its route: its other
            # replicas, or its fallback pool, still serve; the gateway's calls find out live.
            deps = sorted(uow.deployments.list(), key=lambda d: d.observed_state is not m.ObservedState.RUNNING)
            for d in deps:
                if d.desired_state is not m.DesiredState.RUNNING or d.observed_state not in SERVABLE:
                    continue
                name = names.get(d.model_id)
                if name is not None and name not in routes:
                    fallback = (f"{self._serve_url}/{d.name}{PREFILL_APP_SUFFIX}/v1"
                                if d.mode is m.DeploymentMode.PD else None)
                    routes[name] = Upstream(f"{self._serve_url}/{d.name}/v1", d.name, fallback)
            return routes


class ChainRouter:
    def __init__(self, routers: Sequence[Router]) -> None:
        self._routers = tuple(routers)

    async def resolve(self, model: str) -> Upstream | None:
        for router in self._routers:
            upstream = await router.resolve(model)
            if upstream is not None:
                return upstream
        return None
