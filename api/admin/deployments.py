"""Deployments: the desired state of each model's serving app, and what Ray Serve really runs.

Every change is validated by converting it to the data plane's ``DeploymentSpec`` (the same conversion
the reconciler renders from), committed with its audit row, and followed by a reconcile. ``DELETE``
marks the deployment ``deleted``; the reconciler removes the row once Serve no longer runs it.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from sqlalchemy import select

from baton.control.audit import snapshot
from baton.control.spec import deployment_spec, throughput_from
from baton.core import errors
from baton.core import models as m
from baton.core.db import UnitOfWork

from ._common import audit
from .deps import Admin, Ctx, Paging, check_if_match, set_etag
from .problems import ProblemRoute
from .schemas import DeploymentCreate, DeploymentPublic, DeploymentStatus, DeploymentUpdate, Page, ReplicaRange

router = APIRouter(prefix="/deployments", tags=["deployments"], route_class=ProblemRoute)

#: Columns whose change is a new generation of the spec (what Serve must run).
SPEC_COLUMNS = ("mode", "prefill_min_replicas", "prefill_max_replicas", "decode_min_replicas",
                "decode_max_replicas", "engine_settings", "kv_connector", "lmcache", "device_profile",
                "slo_policy_id", "desired_state")


def public(d: m.Deployment) -> DeploymentPublic:
    return DeploymentPublic(
        id=d.id, name=d.name, model_id=d.model_id, mode=d.mode.value,
        prefill=ReplicaRange(min=d.prefill_min_replicas, max=d.prefill_max_replicas),
        decode=ReplicaRange(min=d.decode_min_replicas, max=d.decode_max_replicas),
        engine=d.engine_settings or {}, kv_connector=d.kv_connector, lmcache=d.lmcache,
        device_profile=d.device_profile, slo_policy_id=d.slo_policy_id, desired_state=d.desired_state.value,
        observed_state=d.observed_state.value, observed_reason=d.observed_reason, observed_at=d.observed_at,
        generation=d.generation, observed_generation=d.observed_generation, version=d.version,
        created_at=d.created_at, updated_at=d.updated_at,
    )


def _validate(ctx: Ctx, uow: UnitOfWork, d: m.Deployment) -> dict[str, Any]:
    """Converts the row to the data plane's spec (raises 400 if it would refuse it)."""
    from baton.dataplane.render import render_serve_application

    if d.mode is m.DeploymentMode.PD:
        if not d.kv_connector or d.kv_connector == "none":
            raise errors.ValidationError("P/D mode needs a KV connector (kv_connector: nixl).", param="kv_connector")
        if d.prefill_max_replicas < 1:
            raise errors.ValidationError("P/D mode needs a prefill pool (prefill.max >= 1).", param="prefill")
    if d.decode_max_replicas < 1:
        raise errors.ValidationError("The decode pool needs max >= 1.", param="decode")
    for name, lo, hi in (("prefill", d.prefill_min_replicas, d.prefill_max_replicas),
                         ("decode", d.decode_min_replicas, d.decode_max_replicas)):
        if lo > hi:
            raise errors.ValidationError(f"{name}: min must be <= max.", param=name)
    model = uow.models.require(d.model_id) if d.model_id else None
    if model is None:
        raise errors.NotFoundError("No such model.", param="model_id")
    policy = uow.slo_policies.require(d.slo_policy_id) if d.slo_policy_id else None
    spec = deployment_spec(d, model, policy=policy, throughput=throughput_from(ctx.settings, d.engine_settings))
    entry: dict[str, Any] = render_serve_application(spec)
    return entry


@router.post("", status_code=status.HTTP_201_CREATED, response_model=DeploymentPublic)
def create_deployment(*, body: DeploymentCreate, ctx: Ctx, who: Admin, response: Response) -> DeploymentPublic:
    d = m.Deployment(
        name=body.name, model_id=body.model_id, mode=m.DeploymentMode(body.mode),
        prefill_min_replicas=body.prefill.min, prefill_max_replicas=body.prefill.max,
        decode_min_replicas=body.decode.min, decode_max_replicas=body.decode.max,
        engine_settings=body.engine, kv_connector=None if body.kv_connector == "none" else body.kv_connector,
        lmcache=body.lmcache, device_profile=body.device_profile, slo_policy_id=body.slo_policy_id,
        desired_state=m.DesiredState(body.desired_state),
    )
    with ctx.db.system() as uow:
        _validate(ctx, uow, d)
        uow.deployments.add(d)
        audit(uow, who, "deployment.create", "deployment", d.id, after=d)
        uow.commit()
        out = public(d)
    ctx.trigger_reconcile("deployment created")
    set_etag(response, out.version)
    return out


@router.get("", response_model=Page[DeploymentPublic])
def list_deployments(*,
    ctx: Ctx, who: Admin, paging: Paging,
    model_id: Annotated[uuid.UUID | None, Query()] = None,
    desired_state: Annotated[m.DesiredState | None, Query()] = None,
    observed_state: Annotated[m.ObservedState | None, Query()] = None,
) -> Page[DeploymentPublic]:
    stmt = select(m.Deployment).order_by(m.Deployment.name)
    if model_id is not None:
        stmt = stmt.where(m.Deployment.model_id == model_id)
    if desired_state is not None:
        stmt = stmt.where(m.Deployment.desired_state == desired_state)
    if observed_state is not None:
        stmt = stmt.where(m.Deployment.observed_state == observed_state)
    with ctx.db.system() as uow:
        rows, total = uow.deployments.page(stmt, limit=paging.limit, offset=paging.offset)
        data = [public(r) for r in rows]
    return Page(data=data, count=total, limit=paging.limit, offset=paging.offset)


@router.get("/{deployment_id}", response_model=DeploymentPublic)
def get_deployment(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin, response: Response) -> DeploymentPublic:
    with ctx.db.system() as uow:
        out = public(uow.deployments.require(deployment_id))
    set_etag(response, out.version)
    return out


@router.get("/{deployment_id}/status", response_model=DeploymentStatus)
def deployment_status(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin) -> DeploymentStatus:
    """What the reconciler last saw in Ray Serve for this deployment."""
    with ctx.db.system() as uow:
        d = uow.deployments.require(deployment_id)
        up = d.observed_generation == d.generation and (
            (d.desired_state is m.DesiredState.RUNNING and d.observed_state is m.ObservedState.RUNNING)
            or (d.desired_state is m.DesiredState.STOPPED and d.observed_state is m.ObservedState.STOPPED)
        )
        return DeploymentStatus(
            id=d.id, name=d.name, desired_state=d.desired_state.value, observed_state=d.observed_state.value,
            observed_reason=d.observed_reason, observed_at=d.observed_at, generation=d.generation,
            observed_generation=d.observed_generation, up_to_date=up,
        )


@router.get("/{deployment_id}/serve-config")
def deployment_serve_config(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin) -> dict[str, Any]:
    """The Ray Serve application entry Baton renders for this deployment (what the reconciler applies)."""
    with ctx.db.system() as uow:
        return _validate(ctx, uow, uow.deployments.require(deployment_id))


@router.patch("/{deployment_id}", response_model=DeploymentPublic)
def update_deployment(*, deployment_id: uuid.UUID, body: DeploymentUpdate, ctx: Ctx, who: Admin, request: Request,
                      response: Response) -> DeploymentPublic:
    """Change the mode, pools, engine settings, KV connector, tiers, SLO policy or desired state."""
    with ctx.db.system() as uow:
        d = uow.deployments.require(deployment_id)
        check_if_match(request, d.version)
        if d.desired_state is m.DesiredState.DELETED:
            raise errors.ConflictError("This deployment is being deleted.")
        before = snapshot(d) or {}
        fields = body.model_dump(exclude_unset=True)
        if "mode" in fields and fields["mode"] is not None:
            d.mode = m.DeploymentMode(fields["mode"])
        if fields.get("prefill") is not None:
            d.prefill_min_replicas, d.prefill_max_replicas = body.prefill.min, body.prefill.max  # type: ignore[union-attr]
        if fields.get("decode") is not None:
            d.decode_min_replicas, d.decode_max_replicas = body.decode.min, body.decode.max  # type: ignore[union-attr]
        if "engine" in fields:
            d.engine_settings = body.engine or {}
        if "kv_connector" in fields:
            d.kv_connector = None if body.kv_connector in (None, "none") else body.kv_connector
        if "lmcache" in fields:
            d.lmcache = body.lmcache
        if fields.get("device_profile") is not None:
            d.device_profile = fields["device_profile"]
        if "slo_policy_id" in fields:
            d.slo_policy_id = body.slo_policy_id
        if fields.get("desired_state") is not None:
            d.desired_state = m.DesiredState(fields["desired_state"])
        after = snapshot(d) or {}
        changed = any(before.get(c) != after.get(c) for c in SPEC_COLUMNS)
        if changed:
            _validate(ctx, uow, d)
            d.generation = d.generation + 1
            uow.flush()
            audit(uow, who, "deployment.update", "deployment", d.id, before=before, after=d)
        uow.commit()
        out = public(d)
    if changed:
        ctx.trigger_reconcile("deployment changed")
    set_etag(response, out.version)
    return out


@router.delete("/{deployment_id}", status_code=status.HTTP_202_ACCEPTED, response_model=DeploymentPublic)
def delete_deployment(*, deployment_id: uuid.UUID, ctx: Ctx, who: Admin, request: Request,
                      response: Response) -> DeploymentPublic:
    """Marks the deployment deleted; it disappears once Ray Serve no longer runs it (202)."""
    with ctx.db.system() as uow:
        d = uow.deployments.require(deployment_id)
        check_if_match(request, d.version)
        if d.desired_state is not m.DesiredState.DELETED:
            before = snapshot(d)
            d.desired_state = m.DesiredState.DELETED
            d.generation = d.generation + 1
            uow.flush()
            audit(uow, who, "deployment.delete", "deployment", d.id, before=before, after=d)
        uow.commit()
        out = public(d)
    ctx.trigger_reconcile("deployment deleted")
    set_etag(response, out.version)
    return out


@router.post("/reconcile", status_code=status.HTTP_202_ACCEPTED, tags=["deployments"])
def request_reconcile(*, ctx: Ctx, who: Admin) -> dict[str, str]:
    """Enqueues a reconcile now (it also runs after every change and periodically)."""
    ctx.trigger_reconcile(f"requested by {who.actor}")
    return {"status": "queued"}
