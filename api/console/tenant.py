"""The console's tenant pages: overview, keys, models (and access requests), usage, SLOs, requests, batches
(and their files' bytes) and the playground's key. Changes go through the control plane (``ctx.control``,
:mod:`baton.control.batches`), acting as ``console:<email>``."""

from __future__ import annotations

import datetime as dt
import urllib.parse
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from baton.api.console import queries
from baton.api.console.common import ConsoleRoute, Ctx, TenantUser
from baton.control import batches
from baton.control.keys import ApiKeyView, IssuedKey
from baton.control.tenancy import AccessRequestView, RequestAccess
from baton.control.usecase import Actor
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


class AccessRequestCreate(_In):
    model_id: uuid.UUID | None = Field(None, description="The model wanted; null: any model, the operators choose.")
    note: str | None = Field(None, max_length=1000, description="What it is for, for the operators.")


def key_json(k: ApiKeyView) -> dict[str, Any]:
    return {
        "id": str(k.id), "name": k.name, "prefix": k.prefix, "model_scope": list(k.model_scope),
        "expires_at": k.expires_at.isoformat() if k.expires_at else None,
        "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
        "rotated_to_id": str(k.rotated_to_id) if k.rotated_to_id else None,
        "created_by": k.created_by, "created_at": k.created_at.isoformat(),
        "last_used_at": k.last_used_at.isoformat() if k.last_used_at else None, "state": k.state(),
        "kind": k.kind,
    }


def issued_json(k: IssuedKey) -> dict[str, Any]:
    return {"key": key_json(k.key), "secret": k.secret}


def access_request_json(r: AccessRequestView) -> dict[str, Any]:
    return {
        "id": str(r.id), "tenant_id": str(r.tenant_id), "model_id": str(r.model_id) if r.model_id else None,
        "model": r.model, "note": r.note, "state": r.state, "requested_by": r.requested_by,
        "requested_at": r.requested_at.isoformat(),
        "resolved_at": r.resolved_at.isoformat() if r.resolved_at else None, "resolved_by": r.resolved_by,
        "reason": r.reason,
    }


def _tid(user: TenantUser) -> uuid.UUID:
    tid: uuid.UUID | None = user.tenant_id
    assert tid is not None
    return tid


def _actor(request: Request, user: TenantUser) -> Actor:
    return Actor(user.actor, (request.headers.get("x-request-id") or "")[:64] or None, role=user.role)


@router.get("/overview")
def overview(ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    """The home page: the organisation, what it may call (``access.state`` ``waiting`` until an operator
    grants a model, with its pending requests), its live keys and the last 24 hours of traffic."""
    tid = _tid(user)
    now = dt.datetime.now(dt.UTC)
    ov = ctx.control.tenancy.overview(tid)
    with ctx.db.tenant(tid) as uow:
        usage = queries.usage_series(uow, tid, since=now - dt.timedelta(hours=24), until=now, bucket="hour")
    t, access = ov.tenant, ov.access
    return {
        "tenant": {"id": str(t.id), "name": t.name, "display_name": t.display_name},
        "models": len(access.models), "live_keys": ov.live_keys, "usage_24h": usage["totals"],
        "access": {"state": access.state, "since": access.since.isoformat(),
                   "pending": [access_request_json(r) for r in access.pending]},
        "models_granted": list(access.models),
    }


@router.get("/catalogue")
def catalogue(ctx: Ctx, user: TenantUser) -> list[dict[str, Any]]:
    """Every model of the platform, whether the organisation may use it, and whether it has asked to."""
    return [{"id": str(e.id), "name": e.name, "context_length": e.context_length, "dtype": e.dtype,
             "params_b": e.params_b, "granted": e.granted, "requested": e.requested}
            for e in ctx.control.tenancy.catalogue(_tid(user))]


@router.get("/access-requests")
def list_access_requests(ctx: Ctx, user: TenantUser) -> list[dict[str, Any]]:
    """The organisation's requests for models, newest first, with the operators' answers."""
    return [access_request_json(r) for r in ctx.control.tenancy.tenant_requests(_tid(user))]


@router.post("/access-requests", status_code=201)
def request_access(body: AccessRequestCreate, ctx: Ctx, request: Request, user: TenantUser) -> dict[str, Any]:
    """Asks the operators for a model (or any model). One pending request per model: 409 for another."""
    view = ctx.control.tenancy.request_access(_actor(request, user), _tid(user),
                                              RequestAccess(model_id=body.model_id, note=body.note))
    return access_request_json(view)


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
                            model_scope=body.model_scope, expires_at=expires, role=user.role)
    return issued_json(issued)


@router.post("/keys/{key_id}/revoke")
def revoke_key(key_id: uuid.UUID, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    return key_json(ctx.keys.revoke(tenant_id=_tid(user), key_id=key_id, actor=user.actor, role=user.role))


@router.post("/keys/{key_id}/rotate")
def rotate_key(key_id: uuid.UUID, body: KeyRotate, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    issued = ctx.keys.rotate(tenant_id=_tid(user), key_id=key_id, actor=user.actor,
                             overlap=dt.timedelta(hours=body.overlap_hours), role=user.role)
    return issued_json(issued)


@router.post("/playground-key", status_code=201)
def playground_key(body: PlaygroundKey, ctx: Ctx, user: TenantUser) -> dict[str, Any]:
    """A key for one model that expires in 15 minutes, for the playground (``kind: playground``). Each
    user has at most one: asking again revokes the previous one."""
    issued = ctx.keys.issue_playground(tenant_id=_tid(user), created_by=user.actor, model=body.model,
                                       ttl=PLAYGROUND_KEY_TTL, role=user.role)
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


@router.get("/flow")
def flow(ctx: Ctx, user: TenantUser, hours: Annotated[int, Query(ge=1, le=24 * 90)] = 24) -> dict[str, Any]:
    """Flow control on the organisation's requests over the last ``hours``: per model (and SLO class) the
    queue wait p50/p99, the requests refused as overloaded, and the share that met the policy's TTFT."""
    since, until = _window(hours)
    with ctx.db.tenant(_tid(user)) as uow:
        out: dict[str, Any] = queries.flow_report(uow, _tid(user), since=since, until=until)
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


#: A batch's or a file's id (``batch_…``, ``file-…``), as the Batch API makes them.
ObjectId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


@router.get("/batches")
def list_batches(ctx: Ctx, user: TenantUser, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                 after: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = None) -> dict[str, Any]:
    """The organisation's batches, newest first, in OpenAI's ``Batch`` shape (``after``: the last id of the
    page before; ``has_more``: older ones follow)."""
    return batches.list_batches(ctx.db, _tid(user), after=after, limit=limit)


@router.post("/batches/{batch_id}/cancel")
def cancel_batch(batch_id: ObjectId, ctx: Ctx, request: Request, user: TenantUser) -> dict[str, Any]:
    """Stops a batch: its requests not started are not run; those running finish and are kept in its output.
    Admins only (403 for a member); 409 for a batch that has ended."""
    return batches.cancel_batch_for(ctx.db, _tid(user), batch_id, actor=_actor(request, user))


@router.get("/files/{file_id}/content", response_class=StreamingResponse,
            responses={200: {"content": {"application/jsonl": {}}, "description": "The file's bytes"}})
def file_content(file_id: ObjectId, ctx: Ctx, user: TenantUser) -> StreamingResponse:
    """A batch's input, output or error file, as a download (streamed a part at a time); 404 once it has
    expired."""
    tid = _tid(user)
    name = str(batches.get_file(ctx.db, tid, file_id)["filename"])
    return StreamingResponse(batches.read_parts(ctx.db, tid, file_id), media_type="application/jsonl",
                             headers={"Content-Disposition": _attachment(name)})


def _attachment(filename: str) -> str:
    """``Content-Disposition`` of a download named ``filename`` (RFC 6266: any other character than a plain
    one goes percent-encoded in ``filename*``)."""
    quoted = urllib.parse.quote(filename, safe="")
    return f'attachment; filename="{filename}"' if quoted == filename else f"attachment; filename*=utf-8''{quoted}"
