"""Read models for the console's tenant pages: usage over time, SLO attainment and goodput, requests.

Every function takes a unit of work opened with ``db.tenant(tenant_id)`` (row-level security keeps it
to that tenant's rows) and still filters on ``tenant_id`` explicitly.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from sqlalchemy import and_, func, literal_column, select

from baton.core import models as m
from baton.core.db import UnitOfWork, translated

Bucket = Literal["hour", "day"]
PERCENTILES = (0.5, 0.9, 0.99)


def _floor(t: dt.datetime, bucket: Bucket) -> dt.datetime:
    t = t.astimezone(dt.UTC)
    if bucket == "day":
        return t.replace(hour=0, minute=0, second=0, microsecond=0)
    return t.replace(minute=0, second=0, microsecond=0)


def usage_series(uow: UnitOfWork, tenant_id: uuid.UUID, *, since: dt.datetime, until: dt.datetime,
                 bucket: Bucket) -> dict[str, Any]:
    """Requests and tokens per bucket (every bucket in the range, zeros included) and per model."""
    u = m.UsageRecord
    b = func.date_trunc(literal_column(f"'{bucket}'"), func.timezone("UTC", u.created_at)).label("b")
    stmt = (
        select(b, u.model, func.count(), func.sum(u.prompt_tokens), func.sum(u.completion_tokens),
               func.sum(u.cached_tokens))
        .where(u.tenant_id == tenant_id, u.created_at >= since, u.created_at < until)
        .group_by(b, u.model)
    )
    with translated():
        rows = uow.session.execute(stmt).all()
    step = dt.timedelta(hours=1) if bucket == "hour" else dt.timedelta(days=1)
    points: dict[dt.datetime, dict[str, Any]] = {}
    t = _floor(since, bucket)
    while t < until:
        points[t] = {"t": t.isoformat(), "requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                     "cached_tokens": 0}
        t += step
    by_model: dict[str, dict[str, int]] = {}
    for bt, model, n, pt, ct, cached in rows:
        key = bt.replace(tzinfo=dt.UTC)
        p = points.setdefault(key, {"t": key.isoformat(), "requests": 0, "prompt_tokens": 0,
                                    "completion_tokens": 0, "cached_tokens": 0})
        p["requests"] += int(n)
        p["prompt_tokens"] += int(pt or 0)
        p["completion_tokens"] += int(ct or 0)
        p["cached_tokens"] += int(cached or 0)
        mm = by_model.setdefault(model, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
        mm["requests"] += int(n)
        mm["prompt_tokens"] += int(pt or 0)
        mm["completion_tokens"] += int(ct or 0)
    series = [points[k] for k in sorted(points)]
    totals = {k: sum(p[k] for p in series) for k in ("requests", "prompt_tokens", "completion_tokens",
                                                     "cached_tokens")}
    return {
        "bucket": bucket, "since": since.isoformat(), "until": until.isoformat(), "series": series,
        "totals": totals,
        "by_model": [{"model": k, **v} for k, v in sorted(by_model.items())],
    }


def _pcts(values: list[float | None]) -> dict[str, float | None]:
    keys = ("p50", "p90", "p99")
    if not values or values[0] is None:
        return dict.fromkeys(keys)
    return {k: (float(v) if v is not None else None) for k, v in zip(keys, values, strict=False)}


def slo_report(uow: UnitOfWork, tenant_id: uuid.UUID, *, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
    """Per model: TTFT/TPOT percentiles, the policy in force, attainment and goodput over the window.

    A request is *good* when it completed and met both targets (TPOT only where it has one: a request
    with a single output token has no TPOT). Goodput is good requests per second over the window.
    """
    r = m.RequestRecord
    window = (r.tenant_id == tenant_id, r.started_at >= since, r.started_at < until)
    pct = [float(p) for p in PERCENTILES]
    stmt = (
        select(
            r.model, func.count(),
            func.count().filter(r.status == m.RequestStatus.COMPLETED),
            func.percentile_cont(pct).within_group(r.ttft_ms),
            func.percentile_cont(pct).within_group(r.tpot_ms),
        )
        .where(*window)
        .group_by(r.model)
        .order_by(r.model)
    )
    with translated():
        rows = uow.session.execute(stmt).all()
    seconds = max((until - since).total_seconds(), 1.0)
    models: list[dict[str, Any]] = []
    for model_name, total, completed, ttft, tpot in rows:
        model = uow.models.by_name(model_name)
        policy = uow.slo_assignments.effective(tenant_id, model.id) if model is not None else None
        entry: dict[str, Any] = {
            "model": model_name, "requests": int(total), "completed": int(completed),
            "ttft_ms": _pcts(list(ttft) if ttft is not None else []),
            "tpot_ms": _pcts(list(tpot) if tpot is not None else []),
            "policy": None, "good": None, "attainment": None, "goodput_rps": None,
        }
        if policy is not None:
            good_cond = and_(
                r.status == m.RequestStatus.COMPLETED, r.ttft_ms.is_not(None), r.ttft_ms <= policy.ttft_ms,
                (r.tpot_ms.is_(None)) | (r.tpot_ms <= policy.tpot_ms),
            )
            with translated():
                good = int(uow.session.scalar(
                    select(func.count()).where(*window, r.model == model_name, good_cond)) or 0)
            entry.update(
                policy={"name": policy.name, "ttft_ms": policy.ttft_ms, "tpot_ms": policy.tpot_ms,
                        "percentile": float(policy.percentile)},
                good=good,
                attainment=good / int(total) if total else None,
                goodput_rps=good / seconds,
            )
        models.append(entry)
    return {"since": since.isoformat(), "until": until.isoformat(), "window_s": seconds, "models": models}


def request_summary(row: m.RequestRecord) -> dict[str, Any]:
    return {
        "id": str(row.id), "model": row.model, "deployment": row.deployment, "endpoint": row.endpoint,
        "stream": row.stream, "status": m.RequestStatus(row.status).value, "http_status": row.http_status,
        "error_code": row.error_code, "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens, "ttft_ms": row.ttft_ms, "tpot_ms": row.tpot_ms,
        "e2e_ms": row.e2e_ms, "kv_bytes": row.kv_bytes, "handoff_ms": row.handoff_ms,
        "recovery_steps": len(row.recovery_steps or []), "trace_id": row.trace_id,
        "started_at": row.started_at.isoformat(), "api_key_id": str(row.api_key_id) if row.api_key_id else None,
    }


def _num(step: dict[str, Any], *names: str) -> float | None:
    for n in names:
        v = step.get(n)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def waterfall(row: m.RequestRecord) -> list[dict[str, Any]]:
    """The request's phases on one time axis (ms from the start): prefill, KV handoff, decode, and each
    recovery step. Derived from the record: prefill ends ``handoff_ms`` before the first token; decode
    runs from the first token to the end."""
    e2e = float(row.e2e_ms)
    spans: list[dict[str, Any]] = []
    ttft = row.ttft_ms
    if ttft is not None:
        handoff = float(row.handoff_ms or 0.0)
        prefill_end = max(0.0, ttft - handoff)
        spans.append({"name": "prefill", "kind": "prefill", "start_ms": 0.0, "duration_ms": prefill_end,
                      "detail": f"{row.prompt_tokens} prompt tokens"})
        if row.handoff_ms is not None:
            kv = f"{row.kv_bytes} bytes" if row.kv_bytes is not None else "size unknown"
            spans.append({"name": "KV handoff", "kind": "kv_handoff", "start_ms": prefill_end,
                          "duration_ms": handoff, "detail": kv})
        spans.append({"name": "decode", "kind": "decode", "start_ms": float(ttft),
                      "duration_ms": max(0.0, e2e - float(ttft)),
                      "detail": f"{row.completion_tokens} tokens"
                                + (f", TPOT {row.tpot_ms:.2f} ms" if row.tpot_ms is not None else "")})
    else:
        spans.append({"name": "request", "kind": "request", "start_ms": 0.0, "duration_ms": e2e,
                      "detail": f"no first token ({m.RequestStatus(row.status).value})"})
    cursor = 0.0
    for i, step in enumerate(row.recovery_steps or []):
        if not isinstance(step, dict):
            continue
        name = str(step.get("step") or step.get("name") or step.get("kind") or f"step {i + 1}")
        start = _num(step, "start_ms", "at_ms", "offset_ms")
        dur = _num(step, "duration_ms", "ms", "elapsed_ms") or 0.0
        start = cursor if start is None else start
        cursor = start + dur
        detail = ", ".join(f"{k}={v}" for k, v in step.items()
                           if k not in {"step", "name", "kind", "start_ms", "at_ms", "offset_ms", "duration_ms",
                                        "ms", "elapsed_ms"} and isinstance(v, str | int | float | bool))[:200]
        spans.append({"name": f"recovery: {name}", "kind": "recovery", "start_ms": start, "duration_ms": dur,
                      "detail": detail})
    return spans
