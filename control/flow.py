"""The operators' view of the gateway's flow-control queues, merged over every gateway process.

Each gateway process writes its queues to Redis once a second (:data:`baton.core.contracts.FLOW_VIEW_PREFIX`,
expiring, see :class:`baton.api.gateway.flow.ViewPublisher`). :func:`read_flow_views` reads them all,
:func:`merge_flow_views` (pure) adds them up per model and per tenant, and :class:`FlowMonitor` (the use
case behind ``/admin/v1/flow`` and the operator console's Queues page) does both and names the tenants.

Per-tenant figures (tokens, queued seconds, refusals) count since each gateway process started. Each
model's engines appear as their own load reports say (:data:`baton.core.contracts.ENGINE_LOAD_PREFIX`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib

from baton.control.views import WIRE_SCHEMA
from baton.core import errors
from baton.core.contracts import (
    ENGINE_LOAD_INDEX,
    FLOW_VIEW_INDEX,
    EngineLoad,
    index_live_from,
    parse_engine_load,
    parse_flow_view,
)
from baton.core.db import Database

log = logging.getLogger(__name__)

#: Keys per MGET while reading the views.
MGET_BATCH = 500

ProcessView = tuple[str, list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class FlowBand:
    """Requests waiting in one priority band (higher goes first)."""

    __pydantic_config__ = WIRE_SCHEMA

    priority: int
    """The band: the tenants' SLO priority (0-100); a higher band goes first."""
    waiting: int
    """Requests waiting in this band, all gateway processes together."""


@dataclass(frozen=True, slots=True)
class FlowTenant:
    """One tenant's traffic on one model, over every gateway process."""

    __pydantic_config__ = WIRE_SCHEMA

    tenant_id: uuid.UUID
    tenant_name: str | None
    """The tenant's name (null: no such tenant any more)."""
    display_name: str | None
    """The tenant's display name."""
    running: int
    """Its requests upstream now."""
    waiting: int
    """Its requests waiting in the queue now."""
    prompt_tokens: int
    """Prompt tokens sent upstream, since each gateway process started."""
    completion_tokens: int
    """Tokens generated (decode), since each gateway process started."""
    queued_s: float
    """Seconds its started requests waited in the queue, summed."""
    rejected: dict[str, int]
    """Refusals by reason (`queue_full`, `ttl`, `backlog`, `slo`)."""
    token_share: float | None
    """Its share of the model's tokens (prompt and generated together), 0-1; null while no tokens were served."""


@dataclass(frozen=True, slots=True)
class FlowProcessModel:
    """One gateway process's queue of one model, with its learned limit's evidence."""

    __pydantic_config__ = WIRE_SCHEMA

    process: str
    """The gateway process (`host:pid`)."""
    limit: int | None
    """Its learned concurrency limit (null: no view yet, limits only)."""
    part: float | None
    """While a band has tenants waiting both in this process and in another: its weighted part of every process's
    limits, in requests (whole ones plus a slot kept busy for the fraction of the time); null: its own limit
    applies."""
    running: int
    waiting: int
    dispatch_per_s: float | None
    """Requests started per second (moving average)."""
    upstream_ttft_s: float | None
    """Measured upstream time to first token (moving average)."""
    gradient: float | None
    """The limit's latency gradient (1: no queueing upstream)."""
    tpot_floor_s: float | None
    """The lowest time per output token seen (the floor)."""
    tpot_s: float | None
    """The time per output token now."""
    engine_pressure: str | None = None
    """Why the engines' load reports hold its limit down (their own queue, or a nearly full KV cache); null: they do
    not."""


@dataclass(frozen=True, slots=True)
class FlowEngine:
    """One engine of a model, as its latest load report says (``baton.dataplane.engine_load``)."""

    __pydantic_config__ = WIRE_SCHEMA

    engine: str
    """The engine (`host:pid` of its Serve replica)."""
    role: str
    """Its pool: `prefill`, `decode`, or `both` (aggregated)."""
    running: float
    """Requests in its running batch (mean over the time its last report covers)."""
    waiting: float
    """Requests waiting in its own queue (mean over the same time)."""
    kv_usage: float
    """Its KV cache's largest usage over the same time, 0-1."""
    age_s: float
    """Seconds since the report (a stepping engine reports every half second; an idle one once, when it goes idle)."""


@dataclass(frozen=True, slots=True)
class FlowModel:
    """One model's queues added up over the gateway processes."""

    __pydantic_config__ = WIRE_SCHEMA

    model: str
    limit: int | None
    """The processes' concurrency limits added up (null: none has one yet)."""
    running: int
    """Requests upstream now, all processes together."""
    waiting: int
    """Requests waiting now, all processes together."""
    bands: list[FlowBand]
    """Waiting per priority band, highest first."""
    dispatch_per_s: float | None
    """Requests started per second, all processes together."""
    rejected: dict[str, int]
    """Refusals by reason, all tenants together."""
    tenants: list[FlowTenant]
    """Per tenant, most tokens first."""
    processes: list[FlowProcessModel]
    """Each gateway process's own queue of the model."""
    engines: list[FlowEngine] = field(default_factory=list)
    """The model's engines, as their latest load reports say."""


@dataclass(frozen=True, slots=True)
class FlowOverview:
    """Every model's merged queue, and the gateway processes whose views were read."""

    __pydantic_config__ = WIRE_SCHEMA

    processes: list[str]
    """The gateway processes whose views were read (each writes its view every second; a stopped one drops out within
    seconds)."""
    models: list[FlowModel] = field(default_factory=list)
    """Each model's queues merged over the processes."""


# --- pure -------------------------------------------------------------------------------------------

def _int(v: Any) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0


def _opt_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _opt_float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _uuid(v: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(v))
    except ValueError:
        return None


def _rows(view: Any) -> list[Any]:
    rows = view.get("tenants") if isinstance(view, dict) else None
    return rows if isinstance(rows, list) else []


def flow_tenant_ids(views: Iterable[ProcessView]) -> set[uuid.UUID]:
    """The tenants the views name (to look their names up)."""
    out: set[uuid.UUID] = set()
    for _, models in views:
        for view in models:
            for row in _rows(view):
                tid = _uuid(row.get("tenant_id")) if isinstance(row, dict) else None
                if tid is not None:
                    out.add(tid)
    return out


def _empty() -> dict[str, Any]:
    return {"limit": None, "running": 0, "waiting": 0, "bands": {}, "dispatch": None, "tenants": {}, "processes": []}


def merge_flow_views(views: Iterable[ProcessView],
                     names: Mapping[uuid.UUID, tuple[str, str]] | None = None,
                     engines: Iterable[EngineLoad] = (), *, now: float | None = None) -> FlowOverview:
    """Adds up the processes' views per model: running, waiting and limit (``None`` while no process has a
    limit yet), waiting per band, and per tenant (``names``: tenant id to (name, display name)) running,
    waiting, tokens, queued seconds, refusals by reason and its share of the model's tokens; with each
    model's engines as their load reports say (``now``: wall clock, for their age). Entries that are not
    what a gateway writes are skipped."""
    names = names or {}
    processes: list[str] = []
    acc: dict[str, dict[str, Any]] = {}
    now = time.time() if now is None else now
    by_model: dict[str, list[FlowEngine]] = {}
    for x in engines:
        by_model.setdefault(x.model, []).append(FlowEngine(
            engine=x.engine, role=x.role, running=x.running, waiting=x.waiting, kv_usage=x.kv_usage,
            age_s=round(max(now - x.at, 0.0), 3)))
        acc.setdefault(x.model, _empty())
    for process, models in views:
        processes.append(process)
        for view in models:
            name = view.get("model") if isinstance(view, dict) else None
            if not isinstance(name, str):
                continue
            m = acc.setdefault(name, _empty())
            limit = _opt_int(view.get("limit"))
            if limit is not None:
                m["limit"] = (m["limit"] or 0) + limit
            m["running"] += _int(view.get("running"))
            m["waiting"] += _int(view.get("waiting"))
            bands = view.get("bands")
            for band, n in (bands.items() if isinstance(bands, dict) else ()):
                try:
                    priority = int(band)
                except ValueError:
                    continue
                m["bands"][priority] = m["bands"].get(priority, 0) + _int(n)
            rate = _opt_float(view.get("dispatch_per_s"))
            if rate is not None:
                m["dispatch"] = (m["dispatch"] or 0.0) + rate
            m["processes"].append(FlowProcessModel(
                process=process, limit=limit, part=_opt_float(view.get("part")), running=_int(view.get("running")),
                waiting=_int(view.get("waiting")),
                dispatch_per_s=rate, upstream_ttft_s=_opt_float(view.get("upstream_ttft_s")),
                gradient=_opt_float(view.get("gradient")), tpot_floor_s=_opt_float(view.get("tpot_floor_s")),
                tpot_s=_opt_float(view.get("tpot_s")),
                engine_pressure=p if isinstance(p := view.get("engine_pressure"), str) else None))
            for row in _rows(view):
                tid = _uuid(row.get("tenant_id")) if isinstance(row, dict) else None
                if tid is None:
                    continue
                t = m["tenants"].setdefault(tid, {"running": 0, "waiting": 0, "prompt_tokens": 0,
                                                  "completion_tokens": 0, "queued_s": 0.0, "rejected": {}})
                for k in ("running", "waiting", "prompt_tokens", "completion_tokens"):
                    t[k] += _int(row.get(k))
                t["queued_s"] += _opt_float(row.get("queued_s")) or 0.0
                rejected = row.get("rejected")
                for reason, n in (rejected.items() if isinstance(rejected, dict) else ()):
                    t["rejected"][str(reason)] = t["rejected"].get(str(reason), 0) + _int(n)
    return FlowOverview(processes=sorted(processes),
                        models=[_model(name, acc[name], names, by_model.get(name, [])) for name in sorted(acc)])


def _model(name: str, m: dict[str, Any], names: Mapping[uuid.UUID, tuple[str, str]],
           engines: list[FlowEngine]) -> FlowModel:
    total = sum(t["prompt_tokens"] + t["completion_tokens"] for t in m["tenants"].values())
    tenants = []
    rejected: dict[str, int] = {}
    for tid, t in m["tenants"].items():
        tokens = t["prompt_tokens"] + t["completion_tokens"]
        name_, display = names.get(tid, (None, None))
        tenants.append(FlowTenant(
            tenant_id=tid, tenant_name=name_, display_name=display, running=t["running"], waiting=t["waiting"],
            prompt_tokens=t["prompt_tokens"], completion_tokens=t["completion_tokens"],
            queued_s=round(t["queued_s"], 3), rejected=dict(sorted(t["rejected"].items())),
            token_share=tokens / total if total else None))
        for reason, n in t["rejected"].items():
            rejected[reason] = rejected.get(reason, 0) + n
    tenants.sort(key=lambda t: (-(t.prompt_tokens + t.completion_tokens), t.tenant_name or "", str(t.tenant_id)))
    return FlowModel(
        model=name, limit=m["limit"], running=m["running"], waiting=m["waiting"],
        bands=[FlowBand(p, n) for p, n in sorted(m["bands"].items(), reverse=True)],
        dispatch_per_s=m["dispatch"], rejected=dict(sorted(rejected.items())), tenants=tenants,
        processes=sorted(m["processes"], key=lambda p: p.process),
        engines=sorted(engines, key=lambda e: (e.role, e.engine)))


# --- Redis and Postgres -----------------------------------------------------------------------------

def read_flow_views(redis: Any) -> list[ProcessView]:
    """Every gateway process's stored view (``redis``: a synchronous ``redis.Redis``): the live keys from their
    index (:data:`baton.core.contracts.FLOW_VIEW_INDEX`), then MGET; a view that expired or does not parse is
    left out."""
    keys = sorted(set(redis.zrangebyscore(FLOW_VIEW_INDEX, index_live_from(time.time()), "+inf")))
    out: list[ProcessView] = []
    for i in range(0, len(keys), MGET_BATCH):
        for raw in redis.mget(keys[i:i + MGET_BATCH]):
            view = parse_flow_view(raw)
            if view is not None:
                out.append(view)
    return sorted(out, key=lambda v: v[0])


def read_engine_loads(redis: Any) -> list[EngineLoad]:
    """Every engine's latest load report (``redis``: a synchronous ``redis.Redis``), as
    :func:`read_flow_views` reads the views."""
    keys = sorted(set(redis.zrangebyscore(ENGINE_LOAD_INDEX, index_live_from(time.time()), "+inf")))
    out: list[EngineLoad] = []
    for i in range(0, len(keys), MGET_BATCH):
        out.extend(x for raw in redis.mget(keys[i:i + MGET_BATCH]) if (x := parse_engine_load(raw)) is not None)
    return out


class FlowMonitor:
    """The use case of the operators' queue view: read every process's view, name the tenants, merge."""

    def __init__(self, db: Database, redis: Any) -> None:
        self.db = db
        self.redis = redis

    def overview(self) -> FlowOverview:
        """Every model's queues over all gateway processes (503 when Redis cannot be read)."""
        try:
            views = read_flow_views(self.redis)
            engines = read_engine_loads(self.redis)
        except redis_lib.RedisError as exc:
            log.warning("flow views not read: %s", type(exc).__name__)
            raise errors.UnavailableError("The gateways' queue views cannot be read (Redis).") from exc
        ids = flow_tenant_ids(views)
        with self.db.system() as uow:
            tenants = uow.tenants.by_ids(sorted(ids))
            names = {tid: (t.name, t.display_name) for tid, t in tenants.items()}
        return merge_flow_views(views, names, engines)
