"""Planning use case: should a model be disaggregated, and at which P:D ratio (see :mod:`baton.control.services`).

:meth:`Planning.plan` reads the model's shape and, when asked, its measured request records, calibrates
the cost model of :mod:`baton.control.pd_cost_model` from them (or keeps the settings' figures, saying why),
and plans. When no configuration meets the SLO, the outcome has no recommendation: the closest
configuration and what would meet the SLO instead.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from baton.control import pd_cost_model as cost
from baton.core import errors
from baton.core.db import Database
from baton.core.settings import Settings

#: Fewest measured requests a calibration is made from.
MIN_CALIBRATION_SAMPLES = 5
#: The newest completed requests of the model that calibration reads.
CALIBRATION_RECORDS = 5000


class PlanRequest(BaseModel):
    """Planner inputs. Unset throughput figures come from measured request records of the model when
    there are enough (``calibrate``), else from the settings."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float = Field(1000, gt=0, le=3_600_000, description="TTFT SLO (ms).")
    tpot_ms: float = Field(50, gt=0, le=3_600_000, description="TPOT SLO (ms).")
    percentile: float = Field(90, ge=50, le=99.9, description="SLO percentile.")
    prompt_tokens_mean: float | None = Field(None, ge=1, le=10_000_000, description="Mean prompt tokens.")
    output_tokens_mean: float | None = Field(None, ge=1, le=10_000_000, description="Mean output tokens.")
    length_cv: float = Field(0.5, ge=0, le=5, description="Coefficient of variation of both lengths.")
    arrival_rate: float | None = Field(None, ge=1e-6, le=1_000_000, description="Total requests per second.")
    link_bandwidth_gbps: float | None = Field(None, ge=0.001, le=100_000, description="KV link, GB/s.")
    prefill_tokens_per_s: float | None = Field(None, ge=1, le=1e9, description="Prefill tokens/s of one replica.")
    decode_step_ms: float | None = Field(None, ge=0.01, le=1e6, description="One decode step at batch 1 (ms).")
    decode_ms_per_seq: float | None = Field(None, ge=0, le=1e6, description="Extra step ms per batched sequence.")
    max_num_seqs: int = Field(256, ge=1, le=100_000)
    memory_gib: float | None = Field(None, ge=0.001, le=100_000, description="Memory per replica (weights + KV).")
    ratios: list[tuple[int, int]] | None = Field(None, max_length=32, description="P:D ratios to compare.")
    calibrate: bool = Field(True, description="Use measured request records of this model when present.")


@dataclass(frozen=True)
class PlanOutcome:
    model: str
    result: Any  # baton.control.pd_cost_model.Plan
    calibration: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe (no NaN or infinity), with ``feasible``, ``recommendation``, ``closest``, ``to_meet``."""
        out = {"model": self.model, "calibrated_from": self.calibration["used_samples"],
               **self.result.as_dict(), "calibration": self.calibration}
        jsonable: dict[str, Any] = _finite(out)
        return jsonable


def _finite(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _calibration_report(enabled: bool, records: int, cal: Any) -> dict[str, Any]:
    """``{samples, used, used_samples, rejected, reason}``: requests looked at, whether the throughput
    figures come from them, from how many, what was left out and why (in words)."""
    if not enabled:
        return {"samples": 0, "used": False, "used_samples": 0, "rejected": {},
                "reason": "calibration turned off: figures from the settings"}
    if cal is None:
        return {"samples": records, "used": False, "used_samples": 0, "rejected": {},
                "reason": f"{records} completed requests measured, fewer than {MIN_CALIBRATION_SAMPLES}: "
                          "figures from the settings"}
    head = (f"from {cal.used} of {cal.samples} measured requests" if cal.used
            else f"{cal.samples} measured requests, none usable for throughput")
    return {"samples": cal.samples, "used": cal.used > 0, "used_samples": cal.used, "rejected": dict(cal.rejected),
            "reason": "; ".join((head, *cal.notes))}


class Planning:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings, self.db = settings, db

    def plan(self, model_id: uuid.UUID, req: PlanRequest) -> PlanOutcome:
        ratios = [(p, d) for p, d in (req.ratios or cost.DEFAULT_RATIOS)]
        if any(p < 1 or d < 1 or p > 64 or d > 64 for p, d in ratios):
            raise errors.ValidationError("Each ratio is two integers from 1 to 64.", param="ratios")
        with self.db.system() as uow:
            row = uow.models.require(model_id)
            model_name = row.name
            shape = cost.ModelShape(row.num_layers, row.num_kv_heads, row.head_dim, row.dtype, row.params_b)
            records = uow.requests.timings(row.name, limit=CALIBRATION_RECORDS) if req.calibrate else []
        c = self.settings.control
        base = cost.Hardware(
            prefill_tokens_per_s=c.prefill_tokens_per_s, decode_step_ms=c.decode_step_ms,
            decode_ms_per_seq=c.decode_ms_per_seq, max_num_seqs=req.max_num_seqs,
            memory_bytes=req.memory_gib * 2**30 if req.memory_gib else None,
            link_bandwidth_gbps=req.link_bandwidth_gbps or self.settings.telemetry.link_bandwidth_gbps,
        )
        cal = cost.calibrate(records, base) if records else None
        calibration = _calibration_report(req.calibrate, len(records), cal)
        hw = cal.hardware if cal else base
        overrides = {k: getattr(req, k) for k in ("prefill_tokens_per_s", "decode_step_ms", "decode_ms_per_seq")
                     if getattr(req, k) is not None}
        if overrides:
            hw = cost.Hardware(**{**hw.__dict__, **overrides})
        if cal is not None and req.prompt_tokens_mean is None and req.output_tokens_mean is None:
            traffic = cal.traffic if req.arrival_rate is None else cost.Traffic(
                cal.traffic.prompt_tokens, cal.traffic.output_tokens, req.arrival_rate)
        else:
            traffic = cost.Traffic.lognormal(prompt_mean=req.prompt_tokens_mean or c.mean_prompt_tokens,
                                             output_mean=req.output_tokens_mean or 128, cv=req.length_cv,
                                             arrival_rate=req.arrival_rate)
        try:
            result = cost.plan(shape, hw, traffic, cost.Slo(req.ttft_ms, req.tpot_ms, req.percentile), ratios=ratios)
        except (OverflowError, ZeroDivisionError) as exc:  # figures at the edge of what floats hold
            raise errors.ValidationError(
                "The planner cannot model these inputs: a figure is too large or too small for the cost model "
                "(try a realistic prompt length, bandwidth and throughput).") from exc
        return PlanOutcome(model=model_name, result=result, calibration=calibration)
