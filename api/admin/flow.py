"""The gateway's flow-control queues, merged over every gateway process (read-only)."""

from __future__ import annotations

from fastapi import APIRouter

from .convert import flow_public
from .deps import Admin, Ctx
from .problems import ProblemRoute
from .schemas import FlowPublic

router = APIRouter(route_class=ProblemRoute)


@router.get("/flow", response_model=FlowPublic, tags=["flow"])
def get_flow(ctx: Ctx, who: Admin) -> FlowPublic:
    """Per model: the limit, running and waiting requests (per priority band), and per tenant its running and
    waiting requests, tokens, queued seconds, refusals and share of tokens; with the gateway processes seen.
    Figures are live (each process writes its view every second); tenant totals count since each process
    started."""
    return flow_public(ctx.control.flow.overview())
