"""The model catalogue (with the shape the planner needs) and the P/D planner."""

from __future__ import annotations

import base64
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from baton.control.audit import snapshot
from baton.core import errors
from baton.core import models as m

from ._common import audit
from .deps import Admin, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import ModelCreate, ModelPublic, ModelUpdate, Page

router = APIRouter(prefix="/models", tags=["models"], route_class=ProblemRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ModelPublic)
def create_model(*, body: ModelCreate, ctx: Ctx, who: Admin, response: Response) -> ModelPublic:
    with ctx.db.system() as uow:
        row = uow.models.add(m.Model(**body.model_dump()))
        audit(uow, who, "model.create", "model", row.id, after=row)
        uow.commit()
        out = ModelPublic.model_validate(row)
    set_etag(response, out.version)
    return out


@router.get("", response_model=Page[ModelPublic])
def list_models(*, ctx: Ctx, who: Admin, paging: Paging,
                name: Annotated[str | None, Query(max_length=200)] = None) -> Page[ModelPublic]:
    stmt = select(m.Model).order_by(m.Model.name)
    if name:
        stmt = stmt.where(m.Model.name.contains(name, autoescape=True))
    with ctx.db.system() as uow:
        rows, total = uow.models.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [ModelPublic.model_validate(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/{model_id}", response_model=ModelPublic)
def get_model(*, model_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> ModelPublic:
    with ctx.db.system() as uow:
        out = ModelPublic.model_validate(uow.models.require(model_id))
    set_etag(response, out.version)
    return out


@router.patch("/{model_id}", response_model=ModelPublic)
def update_model(*, model_id: uuid.UUID, body: ModelUpdate, ctx: Ctx, who: Admin, request: Request,
                 response: Response) -> ModelPublic:
    """Changing the source or shape re-renders the model's deployments (a reconcile follows)."""
    with ctx.db.system() as uow:
        row = uow.models.require(model_id)
        check_if_match(request, row.version)
        before = snapshot(row)
        changes = body.model_dump(exclude_unset=True, exclude_none=True)
        for k, v in changes.items():
            setattr(row, k, v)
        if changes:
            uow.flush()
            audit(uow, who, "model.update", "model", row.id, before=before, after=row)
        uow.commit()
        out = ModelPublic.model_validate(row)
    if changes:
        ctx.trigger_reconcile("model changed")
    set_etag(response, out.version)
    return out


@router.delete("/{model_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_model(*, model_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request) -> Response:
    """A model with deployments cannot be deleted (409): delete them first."""
    with ctx.db.system() as uow:
        row = uow.models.require(model_id)
        check_if_match(request, row.version)
        before = snapshot(row)
        uow.models.delete(row)
        audit(uow, who, "model.delete", "model", model_id, before=before)
        uow.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- planner ----------------------------------------------------------------------------------------

class PlanRequest(BaseModel):
    """Planner inputs. Unset throughput figures come from measured request records of the model when
    there are enough (``calibrate``), else from the settings."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float = Field(1000, gt=0, le=3_600_000, description="TTFT SLO (ms).")
    tpot_ms: float = Field(50, gt=0, le=3_600_000, description="TPOT SLO (ms).")
    percentile: float = Field(90, ge=50, le=99.9, description="SLO percentile.")
    prompt_tokens_mean: float | None = Field(None, gt=0, le=10_000_000)
    output_tokens_mean: float | None = Field(None, gt=0, le=10_000_000)
    length_cv: float = Field(0.5, ge=0, le=5, description="Coefficient of variation of both lengths.")
    arrival_rate: float | None = Field(None, gt=0, le=1_000_000, description="Total requests per second.")
    link_bandwidth_gbps: float | None = Field(None, gt=0, le=100_000, description="KV link, GB/s.")
    prefill_tokens_per_s: float | None = Field(None, gt=0, le=1e9)
    decode_step_ms: float | None = Field(None, gt=0, le=1e6)
    decode_ms_per_seq: float | None = Field(None, ge=0, le=1e6)
    max_num_seqs: int = Field(256, ge=1, le=100_000)
    memory_gib: float | None = Field(None, gt=0, le=100_000, description="Memory per replica (weights + KV).")
    ratios: list[tuple[int, int]] | None = Field(None, max_length=32, description="P:D ratios to compare.")
    calibrate: bool = Field(True, description="Use measured request records of this model when present.")


def run_plan(ctx: Ctx, model_id: uuid.UUID, body: PlanRequest) -> tuple[Any, dict[str, Any]]:
    from baton.control import planner as pl

    with ctx.db.system() as uow:
        row = uow.models.require(model_id)
        model_name = row.name
        shape = pl.ModelShape(row.num_layers, row.num_kv_heads, row.head_dim, row.dtype, row.params_b)
        records: list[dict[str, Any]] = []
        if body.calibrate:
            recs = uow.requests.scalars(
                uow.requests.query(model=row.name, status=m.RequestStatus.COMPLETED).limit(5000)
            )
            records = [{k: getattr(r, k) for k in ("prompt_tokens", "completion_tokens", "ttft_ms", "tpot_ms",
                                                    "handoff_ms", "kv_bytes", "started_at")} for r in recs]
    c = ctx.settings.control
    base = pl.Hardware(
        prefill_tokens_per_s=c.prefill_tokens_per_s, decode_step_ms=c.decode_step_ms,
        decode_ms_per_seq=c.decode_ms_per_seq, max_num_seqs=body.max_num_seqs,
        memory_bytes=body.memory_gib * 2**30 if body.memory_gib else None,
        link_bandwidth_gbps=body.link_bandwidth_gbps or ctx.settings.telemetry.link_bandwidth_gbps,
    )
    cal = pl.calibrate(records, base) if records else None
    hw = cal.hardware if cal else base
    overrides = {k: getattr(body, k) for k in ("prefill_tokens_per_s", "decode_step_ms", "decode_ms_per_seq")
                 if getattr(body, k) is not None}
    if overrides:
        hw = pl.Hardware(**{**hw.__dict__, **overrides})
    if cal and body.prompt_tokens_mean is None and body.output_tokens_mean is None:
        traffic = cal.traffic if body.arrival_rate is None else pl.Traffic(
            cal.traffic.prompt_tokens, cal.traffic.output_tokens, body.arrival_rate)
    else:
        traffic = pl.Traffic.lognormal(prompt_mean=body.prompt_tokens_mean or c.mean_prompt_tokens,
                                       output_mean=body.output_tokens_mean or 128, cv=body.length_cv,
                                       arrival_rate=body.arrival_rate)
    ratios = [(p, d) for p, d in (body.ratios or pl.DEFAULT_RATIOS)]
    if any(p < 1 or d < 1 or p > 64 or d > 64 for p, d in ratios):
        raise errors.ValidationError("Each ratio is two integers from 1 to 64.", param="ratios")
    result = pl.plan(shape, hw, traffic, pl.Slo(body.ttft_ms, body.tpot_ms, body.percentile), ratios=ratios)
    meta = {"model": model_name, "calibrated_from": cal.samples if cal else 0}
    return result, meta


@router.post("/{model_id}/plan")
def plan_model(*,
    model_id: uuid.UUID, ctx: Ctx, who: Admin, body: PlanRequest | None = None,
    format: Annotated[Literal["json", "png", "svg"], Query(description="json (plot inline) or the plot")] = "json",
) -> Response:
    """Should this model be disaggregated, and at which P:D ratio? The seed's cost model, with numbers
    (KV bytes per request, transfer lower bound, goodput per GPU of each configuration) and a plot."""
    from baton.control.planner import render_plot

    result, meta = run_plan(ctx, model_id, body or PlanRequest())
    if format == "png":
        return Response(render_plot(result, "png"), media_type="image/png")
    if format == "svg":
        return Response(render_plot(result, "svg"), media_type="image/svg+xml")
    import orjson

    out = {**meta, **result.as_dict(), "plot_png_base64": base64.b64encode(render_plot(result, "png")).decode()}
    return Response(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")
