"""Read models for the console's tenant pages: usage over time, SLO attainment and goodput, requests.

Every function takes a unit of work opened with ``db.tenant(tenant_id)`` (row-level security keeps it
to that tenant's rows) and still filters on ``tenant_id`` explicitly.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from baton.core import models as m
from baton.core.contracts import PHASE_KV_HANDOFF, PHASE_LOCAL_PREFILL, PHASE_REMOTE_PREFILL, Phase, phases_from_json
from baton.core.db import UnitOfWork

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
    rows = uow.usage.series(tenant_id, since=since, until=until, bucket=bucket)
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
        p["requests"] += n
        p["prompt_tokens"] += pt
        p["completion_tokens"] += ct
        p["cached_tokens"] += cached
        mm = by_model.setdefault(model, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
        mm["requests"] += n
        mm["prompt_tokens"] += pt
        mm["completion_tokens"] += ct
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
    rows = uow.requests.latency_by_model(tenant_id, since=since, until=until, percentiles=PERCENTILES)
    seconds = max((until - since).total_seconds(), 1.0)
    models: list[dict[str, Any]] = []
    for model_name, total, completed, ttft, tpot in rows:
        model = uow.models.by_name(model_name)
        policy = uow.slo_assignments.effective(tenant_id, model.id) if model is not None else None
        entry: dict[str, Any] = {
            "model": model_name, "requests": int(total), "completed": int(completed),
            "ttft_ms": _pcts(ttft or []),
            "tpot_ms": _pcts(tpot or []),
            "policy": None, "good": None, "attainment": None, "goodput_rps": None,
        }
        if policy is not None:
            good = uow.requests.count_good(tenant_id, model_name, since=since, until=until,
                                           ttft_ms=policy.ttft_ms, tpot_ms=policy.tpot_ms)
            entry.update(
                policy={"name": policy.name, "ttft_ms": policy.ttft_ms, "tpot_ms": policy.tpot_ms,
                        "percentile": float(policy.percentile)},
                good=good,
                attainment=good / int(total) if total else None,
                goodput_rps=good / seconds,
            )
        models.append(entry)
    return {"since": since.isoformat(), "until": until.isoformat(), "window_s": seconds, "models": models}


def flow_report(uow: UnitOfWork, tenant_id: uuid.UUID, *, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
    """Per model, what the gateway's flow control did to the tenant's requests over the window: queue wait
    p50/p99 (of the requests with a recorded wait), refusals (429 ``model_overloaded``; 503
    ``model_unavailable``), the same per SLO class, and the share of requests whose first token met the
    TTFT target of the policy in force (refused and failed requests count as missed; null without a policy)."""
    classes: dict[str, list[dict[str, Any]]] = {}
    for model_name, klass, n, queued, pcts, over, unavail in uow.requests.flow_stats(
            tenant_id, since=since, until=until, by_class=True):
        classes.setdefault(model_name, []).append({
            "flow_class": klass, "requests": n, "queued": queued, "queue_ms": _flow_pcts(pcts),
            "refused": over, "unavailable": unavail})
    models: list[dict[str, Any]] = []
    for model_name, _, n, queued, pcts, over, unavail in uow.requests.flow_stats(tenant_id, since=since,
                                                                                   until=until):
        model = uow.models.by_name(model_name)
        policy = uow.slo_assignments.effective(tenant_id, model.id) if model is not None else None
        met = (uow.requests.count_ttft_met(tenant_id, model_name, since=since, until=until,
                                           ttft_ms=policy.ttft_ms) if policy is not None else None)
        models.append({
            "model": model_name, "requests": n, "queued": queued, "queue_ms": _flow_pcts(pcts),
            "refused": over, "unavailable": unavail,
            "policy": {"name": policy.name, "ttft_ms": policy.ttft_ms} if policy is not None else None,
            "ttft_met": met, "ttft_attainment": met / n if met is not None and n else None,
            "classes": classes.get(model_name, []),
        })
    return {"since": since.isoformat(), "until": until.isoformat(),
            "window_s": max((until - since).total_seconds(), 1.0), "models": models}


def _flow_pcts(values: list[float | None] | None) -> dict[str, float | None]:
    p50, p99 = ([*values, None, None][:2]) if values else (None, None)
    return {"p50": float(p50) if p50 is not None else None, "p99": float(p99) if p99 is not None else None}


def request_summary(row: m.RequestRecord) -> dict[str, Any]:
    return {
        "id": str(row.id), "model": row.model, "deployment": row.deployment, "endpoint": row.endpoint,
        "stream": row.stream, "status": m.RequestStatus(row.status).value, "http_status": row.http_status,
        "error_code": row.error_code, "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens, "ttft_ms": row.ttft_ms, "tpot_ms": row.tpot_ms,
        "e2e_ms": row.e2e_ms, "kv_bytes": row.kv_bytes, "handoff_ms": row.handoff_ms,
        "recovery_steps": len(row.recovery_steps or []), "trace_id": row.trace_id,
        "queue_ms": row.queue_ms, "flow_class": row.flow_class,
        "started_at": row.started_at.isoformat(), "api_key_id": str(row.api_key_id) if row.api_key_id else None,
    }


def _num(step: dict[str, Any], *names: str) -> float | None:
    for n in names:
        v = step.get(n)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def waterfall(row: m.RequestRecord) -> list[dict[str, Any]]:
    """The request's phases on one time axis (ms from its start at the gateway), then each recovery step.

    Where the decode server measured them (``row.phases``: each remote prefill call, the KV handoff from
    submitting the decode request to its first token, a local prefill), those are drawn as measured, after
    the time it took the request to reach the decode server, and decode runs from the measured first
    token to the end; every span then says ``"source": "spans"``. Otherwise (aggregated serving, records
    from before phases were kept) they are derived from the record, ``"source": "record"``: prefill ends
    ``handoff_ms`` before the first token, decode runs from the first token to the end."""
    phases = sorted(phases_from_json(row.phases), key=lambda p: p.start_ms) if row.phases else []
    spans = _measured_phases(row, phases) if phases else _derived_phases(row)
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
    source = "spans" if phases else "record"
    return [{**span, "source": source} for span in spans]


def _kv_detail(row: m.RequestRecord) -> str:
    return f"{row.kv_bytes} bytes" if row.kv_bytes is not None else "size unknown"


def _decode_span(row: m.RequestRecord, first_token_ms: float) -> dict[str, Any]:
    return {"name": "decode", "kind": "decode", "start_ms": first_token_ms,
            "duration_ms": max(0.0, float(row.e2e_ms) - first_token_ms),
            "detail": f"{row.completion_tokens} tokens"
                      + (f", TPOT {row.tpot_ms:.2f} ms" if row.tpot_ms is not None else "")}


def _no_first_token(row: m.RequestRecord) -> dict[str, Any]:
    return {"name": "request", "kind": "request", "start_ms": 0.0, "duration_ms": float(row.e2e_ms),
            "detail": f"no first token ({m.RequestStatus(row.status).value})"}


def _derived_phases(row: m.RequestRecord) -> list[dict[str, Any]]:
    """Prefill, KV handoff and decode from the record's TTFT and handoff time (an assumption: all of
    TTFT before the handoff was prefill)."""
    ttft = row.ttft_ms
    if ttft is None:
        return [_no_first_token(row)]
    handoff = float(row.handoff_ms or 0.0)
    prefill_end = max(0.0, ttft - handoff)
    spans = [{"name": "prefill", "kind": "prefill", "start_ms": 0.0, "duration_ms": prefill_end,
              "detail": f"{row.prompt_tokens} prompt tokens"}]
    if row.handoff_ms is not None:
        spans.append({"name": "KV handoff", "kind": "kv_handoff", "start_ms": prefill_end, "duration_ms": handoff,
                      "detail": _kv_detail(row)})
    spans.append(_decode_span(row, float(ttft)))
    return spans


def _measured_phases(row: m.RequestRecord, phases: list[Phase]) -> list[dict[str, Any]]:
    """The decode server's phases as measured, and decode from the first token it saw."""
    spans: list[dict[str, Any]] = []
    if phases[0].start_ms > 0:
        spans.append({"name": "to the decode server", "kind": "dispatch", "start_ms": 0.0,
                      "duration_ms": phases[0].start_ms, "detail": "gateway, routing and queueing in Ray Serve"})
    first_token: float | None = None
    for p in phases:
        failed = p.outcome != "ok"
        if p.phase == PHASE_REMOTE_PREFILL:
            name = "prefill" if (p.attempt or 1) == 1 else f"prefill (attempt {p.attempt})"
            detail = f"failed: {p.detail}" if failed else f"{row.prompt_tokens} prompt tokens on a prefill replica"
            spans.append({"name": name, "kind": "prefill", "start_ms": p.start_ms, "duration_ms": p.duration_ms,
                          "detail": detail})
        elif p.phase == PHASE_LOCAL_PREFILL:
            detail = f"{row.prompt_tokens} prompt tokens on the decode replica" + (f" ({p.detail})" if p.detail else "")
            spans.append({"name": "local prefill", "kind": "prefill", "start_ms": p.start_ms,
                          "duration_ms": p.duration_ms, "detail": f"failed: {p.detail}" if failed else detail})
        else:  # the KV handoff: the pull, scheduling and the first decode step
            detail = _kv_detail(row)
            if row.handoff_ms is not None and row.handoff_ms < p.duration_ms:  # NIXL's own timing of the pull
                detail += f"; transfer {row.handoff_ms:.2f} ms of it"
            spans.append({"name": "KV handoff", "kind": "kv_handoff", "start_ms": p.start_ms,
                          "duration_ms": p.duration_ms, "detail": f"failed: {detail}" if failed else detail})
        if p.phase in (PHASE_KV_HANDOFF, PHASE_LOCAL_PREFILL) and not failed:
            first_token = p.end_ms
    if first_token is None and row.ttft_ms is not None:
        first_token = float(row.ttft_ms)
    spans.append(_decode_span(row, first_token) if first_token is not None else _no_first_token(row))
    return spans
