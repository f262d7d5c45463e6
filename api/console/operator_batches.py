"""The console's operator Batches page: every tenant's batches per model, by the use case
:func:`baton.control.batches.batches_by_model`."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query

from baton.api.console.common import ConsoleRoute, Ctx, OperatorUser
from baton.control import batches

router = APIRouter(prefix="/ops", tags=["console: operator"], route_class=ConsoleRoute)


@router.get("/batches")
def batches_by_model(ctx: Ctx, user: OperatorUser,
                     hours: Annotated[int, Query(ge=1, le=24 * 90)] = 24) -> dict[str, Any]:
    """Per model: the batches still open or created in the last ``hours`` by status, their lines by state,
    and the open ones (tenant, progress, created, expires), oldest first."""
    return batches.batches_by_model(ctx.db, since=dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours))
