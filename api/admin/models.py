"""The model catalogue (with the shape the planner needs) and the P/D planner."""

from __future__ import annotations

import base64
import uuid
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response, status

from baton.control.catalogue import ModelView
from baton.control.pd_cost_model import render_plot
from baton.control.planning import PlanRequest
from baton.control.usecase import Actor

from . import convert
from .deps import Admin, AdminPrincipal, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import ModelCreate, ModelUpdate, Page

router = APIRouter(prefix="/models", tags=["models"], route_class=ProblemRoute)


def _actor(who: AdminPrincipal) -> Actor:
    return Actor(name=who.actor, request_id=who.request_id)








@router.post("", status_code=status.HTTP_201_CREATED, response_model=ModelView)
def create_model(*, body: ModelCreate, ctx: Ctx, who: Admin, response: Response) -> ModelView:
    out = ctx.control.catalogue.create_model(_actor(who), convert.new_model(body))
    set_etag(response, out.version)
    return out


@router.get("", response_model=Page[ModelView])
def list_models(*, ctx: Ctx, who: Admin, paging: Paging,
                name: Annotated[str | None, Query(max_length=200)] = None) -> Page[ModelView]:
    page = ctx.control.catalogue.list_models(name_contains=name, limit=paging.limit, offset=paging.offset)
    return Page(data=list(page.items), count=page.total, limit=page.limit,
                offset=page.offset)


@router.get("/{model_id}", response_model=ModelView)
def get_model(*, model_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> ModelView:
    out = ctx.control.catalogue.get_model(model_id)
    set_etag(response, out.version)
    return out


@router.patch("/{model_id}", response_model=ModelView)
def update_model(*, model_id: uuid.UUID, body: ModelUpdate, ctx: Ctx, who: Admin, request: Request,
                 response: Response) -> ModelView:
    """Changing the source or shape re-renders the model's deployments (a reconcile follows)."""
    out = ctx.control.catalogue.update_model(_actor(who), model_id, convert.model_changes(body),
                                              expect=lambda v: check_if_match(request, v))
    set_etag(response, out.version)
    return out


@router.delete("/{model_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_model(*, model_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request) -> Response:
    """A model with deployments cannot be deleted (409): delete them first."""
    ctx.control.catalogue.delete_model(_actor(who), model_id, expect=lambda v: check_if_match(request, v))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- planner ----------------------------------------------------------------------------------------

@router.post("/{model_id}/plan")
def plan_model(*,
    model_id: uuid.UUID, ctx: Ctx, who: Admin, body: PlanRequest | None = None,
    format: Annotated[Literal["json", "png", "svg"], Query(description="json (plot inline) or the plot")] = "json",
    layout: Annotated[Literal["wide", "narrow"], Query(
        description="The plot's charts side by side (wide) or one above the other (narrow, for a phone)")] = "wide",
) -> Response:
    """Should this model be disaggregated, and at which P:D ratio? The seed's cost model, with numbers
    (KV bytes per request, transfer lower bound, goodput per GPU of each configuration) and a plot."""
    outcome = ctx.control.planning.plan(model_id, body or PlanRequest())
    if format == "png":
        return Response(render_plot(outcome.result, "png", layout), media_type="image/png")
    if format == "svg":
        return Response(render_plot(outcome.result, "svg", layout), media_type="image/svg+xml")
    png = render_plot(outcome.result, "png", layout)
    out = {**outcome.as_dict(), "plot_png_base64": base64.b64encode(png).decode()}
    return Response(orjson.dumps(out), media_type="application/json")
