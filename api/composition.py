"""The composition root: what one API process is made of, built once in the app's lifespan.

:class:`AppServices` holds the process's database, its one synchronous Redis client (a connection pool
shared by the admin API, the console and the control plane's notifications; the gateway's hot path has
its own asyncio client), and the :class:`~baton.control.services.ControlPlane` every surface calls.
The gateway, ``/admin/v1`` and the console read it from ``app.state.services``; nothing is built on a
first request, and :meth:`AppServices.close` closes what it built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from baton.control.services import ControlPlane
from baton.control.usecase import Notifier
from baton.core.db import Database
from baton.core.settings import Settings


@dataclass
class AppServices:
    settings: Settings
    db: Database
    #: The process's synchronous ``redis.Redis`` (one connection pool).
    redis: Any
    control: ControlPlane
    _owned: list[Any] = field(default_factory=list, repr=False)

    @classmethod
    def build(cls, settings: Settings, db: Database, *, redis_client: Any | None = None,
              notify: Notifier | None = None) -> AppServices:
        owned: list[Any] = []
        if redis_client is None:
            redis_client = redis.Redis.from_url(settings.redis.url, socket_timeout=2, socket_connect_timeout=2,
                                                health_check_interval=30)
            owned.append(redis_client)
        control = ControlPlane.build(settings, db, redis_client=redis_client, notify=notify)
        return cls(settings=settings, db=db, redis=redis_client, control=control, _owned=owned)

    def close(self) -> None:
        for client in self._owned:
            client.close()
        self._owned.clear()
