"""SLO policies and their assignment to tenants, models, or a tenant on one model (the use cases are
:class:`baton.control.policies.SloPolicies`')."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from baton.control.policies import AssignmentView, PolicyChanges, PolicyView
from baton.control.usecase import Actor

from . import convert
from .deps import Admin, AdminPrincipal, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import Page, SloAssignmentCreate, SloPolicyCreate, SloPolicyUpdate

router = APIRouter(tags=["slo"], route_class=ProblemRoute)


def _actor(who: AdminPrincipal) -> Actor:
    return Actor(name=who.actor, request_id=who.request_id)










@router.post("/slo-policies", status_code=status.HTTP_201_CREATED, response_model=PolicyView)
def create_policy(*, body: SloPolicyCreate, ctx: Ctx, who: Admin, response: Response) -> PolicyView:
    out = ctx.control.slo.create_policy(_actor(who), convert.new_policy(body))
    set_etag(response, out.version)
    return out


@router.get("/slo-policies", response_model=Page[PolicyView])
def list_policies(*, ctx: Ctx, who: Admin, paging: Paging) -> Page[PolicyView]:
    page = ctx.control.slo.list_policies(limit=paging.limit, offset=paging.offset)
    return Page(data=list(page.items), count=page.total, limit=page.limit,
                offset=page.offset)


@router.get("/slo-policies/{policy_id}", response_model=PolicyView)
def get_policy(*, policy_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> PolicyView:
    out = ctx.control.slo.get_policy(policy_id)
    set_etag(response, out.version)
    return out


@router.patch("/slo-policies/{policy_id}", response_model=PolicyView)
def update_policy(*, policy_id: uuid.UUID, body: SloPolicyUpdate, ctx: Ctx, who: Admin, request: Request,
                  response: Response) -> PolicyView:
    """New targets re-render the autoscaling of the deployments that use the policy."""
    changes = PolicyChanges.of(body.model_dump(exclude_unset=True))
    out = ctx.control.slo.update_policy(_actor(who), policy_id, changes,
                                         expect=lambda v: check_if_match(request, v))
    set_etag(response, out.version)
    return out


@router.delete("/slo-policies/{policy_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_policy(*, policy_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request) -> Response:
    ctx.control.slo.delete_policy(_actor(who), policy_id, expect=lambda v: check_if_match(request, v))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/slo-assignments", status_code=status.HTTP_201_CREATED, response_model=AssignmentView)
def create_assignment(*, body: SloAssignmentCreate, ctx: Ctx, who: Admin) -> AssignmentView:
    return ctx.control.slo.create_assignment(_actor(who), convert.new_assignment(body))


@router.get("/slo-assignments", response_model=list[AssignmentView])
def list_assignments(
    *, ctx: Ctx, who: Admin, tenant_id: Annotated[uuid.UUID | None, Query()] = None,
    model_id: Annotated[uuid.UUID | None, Query()] = None,
) -> list[AssignmentView]:
    views = ctx.control.slo.list_assignments(tenant_id=tenant_id, model_id=model_id)
    return list(views)


@router.delete("/slo-assignments/{assignment_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_assignment(*, assignment_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    ctx.control.slo.delete_assignment(_actor(who), assignment_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
