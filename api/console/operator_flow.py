"""The console's operator Queues page: the gateway's flow-control queues, merged over every gateway process
by the same use case as ``/admin/v1/flow`` (:class:`baton.control.flow.FlowMonitor`), in its schema."""

from __future__ import annotations

from fastapi import APIRouter

from baton.api.console.common import ConsoleRoute, Ctx, OperatorUser
from baton.control.flow import FlowOverview

router = APIRouter(prefix="/ops", tags=["console: operator"], route_class=ConsoleRoute)


@router.get("/flow", response_model=FlowOverview)
def flow(ctx: Ctx, user: OperatorUser) -> FlowOverview:
    """Per model: limit, running, waiting per band and per tenant figures, live (the page polls it)."""
    return ctx.control.flow.overview()
