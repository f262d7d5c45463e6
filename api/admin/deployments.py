"""Deployments: the desired state of each model's serving app, and what Ray Serve really runs.

The use cases are :class:`baton.control.catalogue.Catalogue`'s: every change is validated by converting
it to the data plane's ``DeploymentSpec`` (the same conversion the reconciler renders from), committed
with its audit row, and followed by a reconcile. ``DELETE`` marks the deployment ``deleted``; the
reconciler removes the row once Serve no longer runs it.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status

from baton.control.catalogue import DeploymentStatusView, DeploymentView
from baton.control.usecase import Actor
from baton.core import models as m

from . import convert
from .deps import Admin, AdminPrincipal, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import DeploymentCreate, DeploymentUpdate, Page

router = APIRouter(prefix="/deployments", tags=["deployments"], route_class=ProblemRoute)


def _actor(who: AdminPrincipal) -> Actor:
    return Actor(name=who.actor, request_id=who.request_id)












@router.post("", status_code=status.HTTP_201_CREATED, response_model=DeploymentView)
def create_deployment(*, body: DeploymentCreate, ctx: Ctx, who: Admin, response: Response) -> DeploymentView:
    out = ctx.control.catalogue.create_deployment(_actor(who), convert.new_deployment(body))
    set_etag(response, out.version)
    return out


@router.get("", response_model=Page[DeploymentView])
def list_deployments(*,
    ctx: Ctx, who: Admin, paging: Paging,
    model_id: Annotated[uuid.UUID | None, Query()] = None,
    desired_state: Annotated[m.DesiredState | None, Query()] = None,
    observed_state: Annotated[m.ObservedState | None, Query()] = None,
) -> Page[DeploymentView]:
    page = ctx.control.catalogue.list_deployments(model_id=model_id, desired_state=desired_state,
                                                  observed_state=observed_state, limit=paging.limit,
                                                  offset=paging.offset)
    return Page(data=list(page.items), count=page.total, limit=page.limit,
                offset=page.offset)


@router.get("/{deployment_id}", response_model=DeploymentView)
def get_deployment(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> DeploymentView:
    out = ctx.control.catalogue.get_deployment(deployment_id)
    set_etag(response, out.version)
    return out


@router.get("/{deployment_id}/status", response_model=DeploymentStatusView)
def deployment_status(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin) -> DeploymentStatusView:
    """What the reconciler last saw in Ray Serve for this deployment."""
    return ctx.control.catalogue.deployment_status(deployment_id)


@router.get("/{deployment_id}/serve-config")
def deployment_serve_config(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin) -> dict[str, Any]:
    """The Ray Serve application entry Baton renders for this deployment (what the reconciler applies)."""
    out: dict[str, Any] = ctx.control.catalogue.serve_config(deployment_id)
    return out


@router.patch("/{deployment_id}", response_model=DeploymentView)
def update_deployment(*, deployment_id: uuid.UUID, body: DeploymentUpdate, ctx: Ctx, who: Admin, request: Request,
                      response: Response) -> DeploymentView:
    """Change the mode, pools, engine settings, KV connector, tiers, SLO policy or desired state."""
    out = ctx.control.catalogue.update_deployment(_actor(who), deployment_id, convert.deployment_changes(body),
                                                   expect=lambda v: check_if_match(request, v))
    set_etag(response, out.version)
    return out


@router.delete("/{deployment_id}", status_code=status.HTTP_202_ACCEPTED, response_model=DeploymentView)
def delete_deployment(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request, response: Response,
                      force: Annotated[bool, Query(description="Delete even though it served requests in the "
                                                               "last 15 minutes (409 without).")] = False,
                      ) -> DeploymentView:
    """Marks the deployment deleted; it disappears once Ray Serve no longer runs it (202). One that served
    requests in the last 15 minutes needs ``force=true``."""
    out = ctx.control.catalogue.delete_deployment(_actor(who), deployment_id,
                                                   expect=lambda v: check_if_match(request, v), force=force)
    set_etag(response, out.version)
    return out


@router.post("/reconcile", status_code=status.HTTP_202_ACCEPTED, tags=["deployments"])
def request_reconcile(*, ctx: Ctx, who: Admin) -> dict[str, str]:
    """Enqueues a reconcile now (it also runs after every change and periodically)."""
    ctx.control.catalogue.request_reconcile(_actor(who))
    return {"status": "queued"}
