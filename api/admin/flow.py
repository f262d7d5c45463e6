"""The gateway's flow-control queues, merged over every gateway process (read-only)."""

from __future__ import annotations

from fastapi import APIRouter

from baton.control.flow import FlowOverview

from .deps import Admin, Ctx
from .problems import ProblemRoute

router = APIRouter(route_class=ProblemRoute)


@router.get("/flow", response_model=FlowOverview, tags=["flow"])
def get_flow(ctx: Ctx, who: Admin) -> FlowOverview:
    """Per model: the limit, running and waiting requests (per priority band), and per tenant its running and
    waiting requests, tokens, queued seconds, refusals and share of tokens; with the gateway processes seen.
    Figures are live (each process writes its view every second); tenant totals count since each process
    started."""
    return ctx.control.flow.overview()
