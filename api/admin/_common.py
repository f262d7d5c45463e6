"""Helpers shared by the admin routes: audit rows and look-ups that 404 the same way everywhere."""

from __future__ import annotations

import uuid
from typing import Any

from baton.control.audit import snapshot
from baton.core import models as m
from baton.core.db import UnitOfWork

from .deps import AdminPrincipal


def audit(
    uow: UnitOfWork, who: AdminPrincipal, action: str, target_type: str, target_id: Any, *,
    tenant_id: uuid.UUID | None = None, before: m.Base | dict[str, Any] | None = None,
    after: m.Base | dict[str, Any] | None = None,
) -> None:
    """One ``audit_log`` row in the caller's unit of work (committed with the change, or not at all)."""
    uow.audit.record(
        actor=who.actor, action=action, target_type=target_type,
        target_id=str(target_id) if target_id is not None else None, tenant_id=tenant_id,
        before=before if isinstance(before, dict) or before is None else snapshot(before),
        after=after if isinstance(after, dict) or after is None else snapshot(after),
        request_id=who.request_id,
    )
