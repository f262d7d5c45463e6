"""The console's tenant pages: keys, models, usage, SLOs, requests and the playground's key."""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from baton.api.console import queries
from baton.api.console.routes import ConsoleRoute, Ctx, TenantUser
from baton.control.keys import ApiKeyView, IssuedKey
from baton.core import errors
from baton.core import models as m

router = APIRouter(prefix="/tenant", tags=["console: tenant"], route_class=ConsoleRoute)

PLAYGROUND_KEY_TTL = dt.timedelta(minutes=15)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeyCreate(_In):
    name: str = Field(min_length=1, max_length=100)
    model_scope: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list,
                                                                                  max_length=100)
    expires_in_days: int | None = Field(None, ge=1, le=3650)


class KeyRotate(_In):
    overlap_hours: float = Field(24.0, ge=0, le=24 * 30)


class PlaygroundKey(_In):
    model: str = Field(min_length=1, max_length=200)


def key_json(k: ApiKeyView) -> dict[str, Any]:
    return {
        "id": str(k.id), "name": k.name, "prefix": k.prefix, "model_scope": list(k.model_scope),
        "expires_at": k.expires_at.isoformat() if k.expires_at else None,
        "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
        "rotated_to_id": str(k.rotated_to_id) if k.rotated_to_id else None,
        "created_by": k.created_by, "created_at": k.created_at.isoformat(),
        "last_used_at": k.last_used_at.isoformat() if k.last_used_at else None, "state": k.state(),
    }


def issued_json(k: IssuedKey) -> dict[str, Any]:
    return {"key": key_json(k.key), "secret": k.secret}


def _tid(user: TenantUser) -> uuid.UUID:
    tid: uuid.UUID | None = user.tenant_id
    assert tid is not None
    return tid


@router.get("/overview")
def overview(ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    tid = _tid(user)
    now = dt.datetime.now(dt.UTC)
    with ctx.db.tenant(tid) as uow:
        tenant = uow.tenants.require(tid)
        models = uow.models.for_tenant(tid)
        keys = uow.api_keys.for_tenant(tid)
        usage = queries.usage_series(uow, tid, since=now - dt.timedelta(hours=24), until=now, bucket="hour")
        # read inside the unit of work: leaving it rolls back, which expires every instance it loaded
        live = [k for k in keys if k.expires_at is None or k.expires_at > now]
        return {"tenant": {"id": str(tenant.id), "name": tenant.name, "display_name": tenant.display_name},
                "models": len(models), "live_keys": len(live), "usage_24h": usage["totals"]}


@router.get("/models")
def list_models(ctx: Ctx, user: TenantUser) -> list[dict[str, Any]]:
    tid = _tid(user)
    out = []
    with ctx.db.tenant(tid) as uow:
        for mod in uow.models.for_tenant(tid):
            policy = uow.slo_assignments.effective(tid, mod.id)
            running = [d for d in uow.deployments.for_model(mod.id)
                       if m.ObservedState(d.observed_state) is m.ObservedState.RUNNING]
            out.append({
                "id": str(mod.id), "name": mod.name, "context_length": mod.context_length,
                "dtype": mod.dtype, "params_b": mod.params_b, "available": bool(running),
                "slo": {"name": policy.name, "ttft_ms": policy.ttft_ms, "tpot_ms": policy.tpot_ms}
                if policy else None,
            })
    return out


@router.get("/keys")
def list_keys(ctx: Ctx, user: TenantUser,
              include_revoked: Annotated[bool, Query()] = False) -> list[dict[str, Any]]:
    return [key_json(k) for k in ctx.keys.list(tenant_id=_tid(user), include_revoked=include_revoked)]


@router.post("/keys", status_code=201)
def create_key(body: KeyCreate, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(days=body.expires_in_days)) if body.expires_in_days else None
    issued = ctx.keys.issue(tenant_id=_tid(user), name=body.name, created_by=user.actor,
                            model_scope=body.model_scope, expires_at=expires)
    return issued_json(issued)


@router.post("/keys/{key_id}/revoke")
def revoke_key(key_id: uuid.UUID, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    return key_json(ctx.keys.revoke(tenant_id=_tid(user), key_id=key_id, actor=user.actor))


@router.post("/keys/{key_id}/rotate")
def rotate_key(key_id: uuid.UUID, body: KeyRotate, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    issued = ctx.keys.rotate(tenant_id=_tid(user), key_id=key_id, actor=user.actor,
                             overlap=dt.timedelta(hours=body.overlap_hours))
    return issued_json(issued)


@router.post("/playground-key", status_code=201)
def playground_key(body: PlaygroundKey, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    """A key for one model that expires in 15 minutes, for the playground."""
    issued = ctx.keys.issue(
        tenant_id=_tid(user), name=f"playground-{secrets.token_hex(4)}", created_by=user.actor,
        model_scope=[body.model], expires_at=dt.datetime.now(dt.UTC) + PLAYGROUND_KEY_TTL,
    )
    return issued_json(issued)


def _window(hours: int) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(hours=hours), now + dt.timedelta(seconds=1)


@router.get("/usage")
def usage(ctx: Ctx, user: TenantUser, hours: Annotated[int, Query(ge=1, le=24 * 90)] = 24,
          bucket: Annotated[Literal["hour", "day"] | None, Query()] = None) -> dict[str, Any]:
    since, until = _window(hours)
    b: queries.Bucket = bucket or ("hour" if hours <= 72 else "day")
    with ctx.db.tenant(_tid(user)) as uow:
        out: dict[str, Any] = queries.usage_series(uow, _tid(user), since=since, until=until, bucket=b)
    return out


@router.get("/slo")
def slo(ctx: Ctx, user: TenantUser, hours: Annotated[int, Query(ge=1, le=24 * 90)] = 24) -> dict[str, Any]:
    since, until = _window(hours)
    with ctx.db.tenant(_tid(user)) as uow:
        out: dict[str, Any] = queries.slo_report(uow, _tid(user), since=since, until=until)
    return out


@router.get("/requests")
def list_requests(ctx: Ctx, user: TenantUser, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                  offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
                  model: Annotated[str | None, Query(max_length=200)] = None) -> dict[str, Any]:
    tid = _tid(user)
    with ctx.db.tenant(tid) as uow:
        rows, total = uow.requests.page(uow.requests.query(tenant_id=tid, model=model), limit=limit, offset=offset)
        return {"data": [queries.request_summary(r) for r in rows], "count": total, "limit": limit,
                "offset": offset}


@router.get("/requests/{request_id}")
def get_request(request_id: uuid.UUID, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    tid = _tid(user)
    with ctx.db.tenant(tid) as uow:
        row = uow.requests.get(request_id)
        if row is None or row.tenant_id != tid:
            raise errors.NotFoundError("No such request.")
        out: dict[str, Any] = queries.request_summary(row)
        out.update(itl_p50_ms=row.itl_p50_ms, itl_p99_ms=row.itl_p99_ms,
                   finished_at=row.finished_at.isoformat(), recovery=list(row.recovery_steps or []),
                   waterfall=queries.waterfall(row))
    return out
