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

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from baton.control.keys import KeyService, RedisKeyEvents, publish_invalidation
from baton.core import models as m
from baton.core.contracts import InvalidationKind
from baton.core.db import Database, UnitOfWork
from baton.core.settings import Settings


@dataclass(frozen=True, slots=True)
class Actor:
    """Who a use case acts for, as the audit log names them (``admin:<token>``, ``console:<email>``), and
    for a tenant's console user, their role inside the tenant (:mod:`baton.control.roles`; None: an operator)."""

    name: str
    request_id: str | None = None
    role: m.UserRole | None = None


class Notifier(Protocol):
    """What the control plane tells the rest of Baton after a committed change; never raises."""

    def reconcile(self, reason: str) -> None: ...

    def invalidate(self, kind: InvalidationKind, id_: uuid.UUID | None) -> None: ...


class RedisNotifier:
    """Reconciles through Celery, invalidations over Redis pub/sub."""

    def __init__(self, redis_client: Any, trigger_reconcile: Callable[[str], None]) -> None:
        self._redis = redis_client
        self._trigger = trigger_reconcile

    def reconcile(self, reason: str) -> None:
        self._trigger(reason)

    def invalidate(self, kind: InvalidationKind, id_: uuid.UUID | None) -> None:
        publish_invalidation(self._redis, kind, id_)


class RecordingNotifier:
    """Keeps what it was told (unit tests, and processes that must not reach Celery)."""

    def __init__(self) -> None:
        self.reconciles: list[str] = []
        self.invalidations: list[tuple[str, uuid.UUID | None]] = []

    def reconcile(self, reason: str) -> None:
        self.reconciles.append(reason)

    def invalidate(self, kind: InvalidationKind, id_: uuid.UUID | None) -> None:
        self.invalidations.append((kind, id_))


def audit(uow: UnitOfWork, actor: Actor, action: str, target_type: str, target_id: Any, *,
          tenant_id: uuid.UUID | None = None, before: m.Base | dict[str, Any] | None = None,
          after: m.Base | dict[str, Any] | None = None) -> None:
    """One ``audit_log`` row in the caller's unit of work (committed with the change, or not at all)."""
    from baton.control.audit import snapshot

    uow.audit.record(
        actor=actor.name, action=action, target_type=target_type,
        target_id=str(target_id) if target_id is not None else None, tenant_id=tenant_id,
        before=before if isinstance(before, dict) or before is None else snapshot(before),
        after=after if isinstance(after, dict) or after is None else snapshot(after),
        request_id=actor.request_id,
    )


@dataclass
class ControlPlane:
    """The control plane's use cases, one instance per process."""

    settings: Settings
    db: Database
    notify: Notifier
    keys: KeyService
    tenancy: Any  # baton.control.tenancy.Tenancy
    catalogue: Any  # baton.control.catalogue.Catalogue
    slo: Any  # baton.control.policies.SloPolicies
    planning: Any  # baton.control.planning.Planning
    flow: Any  # baton.control.flow.FlowMonitor

    @classmethod
    def build(cls, settings: Settings, db: Database, *, redis_client: Any,
              notify: Notifier | None = None) -> ControlPlane:
        """``redis_client``: the process's synchronous ``redis.Redis``."""
        from baton.control.catalogue import Catalogue
        from baton.control.flow import FlowMonitor
        from baton.control.planning import Planning
        from baton.control.policies import SloPolicies
        from baton.control.tenancy import Tenancy

        if notify is None:
            from baton.control.celery_app import reconcile_trigger

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
