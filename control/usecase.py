"""What every use case of the control plane shares: the :class:`Actor` it acts for and the
:class:`Notifier` it tells, after its commit, what changed (a reconcile, gateway cache invalidations).
The use cases themselves are behind :class:`baton.control.services.ControlPlane`; their audit rows are
written by :func:`baton.control.audit.audit`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from baton.control.keys import publish_invalidation
from baton.core import models as m
from baton.core.contracts import InvalidationKind


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
