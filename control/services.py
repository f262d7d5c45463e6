"""The control plane's use cases, behind one object: :class:`ControlPlane`.

Every surface (``/admin/v1``, the console, the CLI, Celery tasks) calls these; no route handler holds a
use case and no route calls another route. Each use case takes the :class:`Actor` it acts for and a
typed command, opens its own unit of work, writes its audit rows in the same transaction, and after the
commit tells the rest of Baton what changed (:class:`Notifier`: a reconcile, gateway cache
invalidations). Errors are Baton's own (:mod:`baton.core.errors`); each surface renders them in its shape.

:meth:`ControlPlane.build` is the composition root's part for the control plane: one per process, made
in the app's lifespan (or a CLI command), over the process's one database and Redis client.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from baton.control.catalogue import Catalogue
from baton.control.flow import FlowMonitor
from baton.control.keys import KeyService, RedisKeyEvents
from baton.control.planning import Planning
from baton.control.policies import SloPolicies
from baton.control.tenancy import Tenancy
from baton.control.usecase import Notifier, RedisNotifier
from baton.core.db import Database
from baton.core.settings import Settings


@dataclass
class ControlPlane:
    """The control plane's use cases, one instance per process."""

    settings: Settings
    db: Database
    notify: Notifier
    keys: KeyService
    tenancy: Tenancy
    catalogue: Catalogue
    slo: SloPolicies
    planning: Planning
    flow: FlowMonitor

    @classmethod
    def build(cls, settings: Settings, db: Database, *, redis_client: redis.Redis[bytes],
              notify: Notifier | None = None) -> ControlPlane:
        """``redis_client``: the process's synchronous ``redis.Redis``."""
        if notify is None:
            from baton.control.celery_app import reconcile_trigger  # deferred: imports Celery, which only this needs

            notify = RedisNotifier(redis_client, reconcile_trigger(settings))
        keys = KeyService(db, settings, events=RedisKeyEvents(redis_client))
        return cls(
            settings=settings, db=db, notify=notify, keys=keys,
            tenancy=Tenancy(settings, db, notify, keys),
            catalogue=Catalogue(settings, db, notify),
            slo=SloPolicies(settings, db, notify),
            planning=Planning(settings, db),
            flow=FlowMonitor(db, redis_client),
        )
