"""Audit snapshots: a row as JSON for ``audit_log.before/after``, without secrets."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from typing import Any

from sqlalchemy import inspect

from baton.control.usecase import Actor
from baton.core import models as m
from baton.core.db import UnitOfWork

#: Columns never copied into the log.
SECRET_COLUMNS = frozenset({"key_hash", "token_hash", "password_hash", "csrf_token"})


def jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def snapshot(obj: m.Base | None) -> dict[str, Any] | None:
    """The row's column values (loaded state), JSON-safe; secrets left out."""
    if obj is None:
        return None
    mapper = inspect(type(obj))
    return {
        col.key: jsonable(getattr(obj, col.key))
        for col in mapper.column_attrs
        if col.key not in SECRET_COLUMNS
    }


def audit(uow: UnitOfWork, actor: Actor, action: str, target_type: str, target_id: Any, *,
          tenant_id: uuid.UUID | None = None, before: m.Base | dict[str, Any] | None = None,
          after: m.Base | dict[str, Any] | None = None) -> None:
    """One ``audit_log`` row in the caller's unit of work (committed with the change, or not at all)."""
    uow.audit.record(
        actor=actor.name, action=action, target_type=target_type,
        target_id=str(target_id) if target_id is not None else None, tenant_id=tenant_id,
        before=before if isinstance(before, dict) or before is None else snapshot(before),
        after=after if isinstance(after, dict) or after is None else snapshot(after),
        request_id=actor.request_id,
    )
