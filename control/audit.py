"""Audit snapshots: a row as JSON for ``audit_log.before/after``, without secrets."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from typing import Any

from sqlalchemy import inspect

from baton.core import models as m

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
