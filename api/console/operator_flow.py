"""The console's operator Queues page: the gateway's flow-control queues, merged over every gateway process
by the same use case as ``/admin/v1/flow`` (:class:`baton.control.flow.FlowMonitor`), in its schema."""

from __future__ import annotations

from fastapi import APIRouter

from baton.api.admin.convert import flow_public
from baton.api.admin.schemas import FlowPublic
from baton.api.console.routes import ConsoleRoute, Ctx, OperatorUser

router = APIRouter(prefix="/ops", tags=["console: operator"], route_class=ConsoleRoute)


@router.get("/flow", response_model=FlowPublic)
def flow(ctx: Ctx, user: OperatorUser) -> FlowPublic:
    """Per model: limit, running, waiting per band and per tenant figures, live (the page polls it)."""
    return flow_public(ctx.control.flow.overview())
