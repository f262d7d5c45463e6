"""SLO policies, compiled: per-pool autoscaling targets and the gateway's admission priority.

A policy says how fast the first token must come (TTFT) and how fast each next one (TPOT). Baton turns
it into two things:

* autoscaling targets for Ray Serve: the prefill pool is sized for TTFT (a replica with ``n`` prompts
  queued answers the last one after about ``n`` prefill times), the decode pool for TPOT (a decode step
  grows with the batch: ``step(B) = step_ms + B * ms_per_seq``, so ``B`` may grow until ``step(B)``
  reaches the TPOT target);
* an :class:`Admission` for the gateway: priority and whether the tenant's traffic is sheddable, so that
  under overload sheddable, low-priority traffic is refused first, and the tenant's weight (its share of
  its priority band's tokens, relative to the other tenants' weights).

Everything here is pure: :class:`AdmissionTable` is loaded once (``load_admission_table``) and then
answers per request without touching the database.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import select

from baton.core import models as m
from baton.core.db import UnitOfWork
from baton.core.dberrors import translated


class SloPolicyLike(Protocol):
    """What the compiler reads from a policy (the ORM row fits)."""

    name: str
    ttft_ms: int
    tpot_ms: int
    priority: int
    sheddable: bool
    weight: float


@dataclass(frozen=True, slots=True)
class EngineThroughput:
    """Throughput figures of one engine replica (configured, or calibrated by the planner)."""

    prefill_tokens_per_s: float
    decode_step_ms: float
    decode_ms_per_seq: float
    mean_prompt_tokens: int
    max_num_seqs: int = 256


@dataclass(frozen=True, slots=True)
class PoolTargets:
    """``target_ongoing_requests`` for each pool (Ray Serve's autoscaling knob)."""

    prefill: int
    decode: int
    aggregated: int


def prefill_target(ttft_ms: float, tp: EngineThroughput) -> int:
    """Prompts a prefill replica may hold so that the last one still meets TTFT."""
    prefill_ms = 1000.0 * tp.mean_prompt_tokens / tp.prefill_tokens_per_s
    return max(1, math.floor(ttft_ms / prefill_ms)) if prefill_ms > 0 else tp.max_num_seqs


def decode_target(tpot_ms: float, tp: EngineThroughput) -> int:
    """Sequences a decode replica may batch so that one step still fits in TPOT."""
    if tpot_ms <= tp.decode_step_ms:
        return 1
    if tp.decode_ms_per_seq <= 0:
        return tp.max_num_seqs
    return max(1, min(tp.max_num_seqs, math.floor((tpot_ms - tp.decode_step_ms) / tp.decode_ms_per_seq)))


def compile_targets(policy: SloPolicyLike, tp: EngineThroughput) -> PoolTargets:
    p = prefill_target(policy.ttft_ms, tp)
    d = decode_target(policy.tpot_ms, tp)
    # An aggregated replica does both jobs: the stricter of the two bounds it.
    return PoolTargets(prefill=p, decode=d, aggregated=min(p, d))


# --- admission -----------------------------------------------------------------------------------

#: Load (in-flight / capacity) above which nothing more is admitted, whatever the class.
HARD_LIMIT = 1.0
#: Sheddable traffic is refused from this load on (priority 0); priority 100 moves it up to HARD_LIMIT.
SHED_FROM = 0.7


@dataclass(frozen=True, slots=True)
class Admission:
    """How the gateway treats one tenant's traffic on one model."""

    slo_class: str
    priority: int
    sheddable: bool
    ttft_ms: int | None = None
    tpot_ms: int | None = None
    #: Share of the priority band's tokens, relative to the other tenants' weights (1 = equal).
    weight: float = 1.0

    @property
    def shed_threshold(self) -> float:
        """Load at and above which a request of this class is refused (429/503) under overload."""
        if not self.sheddable:
            return HARD_LIMIT
        return SHED_FROM + (HARD_LIMIT - SHED_FROM) * min(max(self.priority, 0), 100) / 100.0

    def admit(self, load: float) -> bool:
        """``load`` is the model's in-flight requests over its capacity (0 idle, 1 full)."""
        return load < self.shed_threshold

    @property
    def shed_order(self) -> tuple[int, int]:
        """Sort key: who goes first when shedding (sheddable before not, then lowest priority)."""
        return (0 if self.sheddable else 1, self.priority)


DEFAULT_ADMISSION = Admission(slo_class="default", priority=50, sheddable=False)


def admission_for(policy: SloPolicyLike | None) -> Admission:
    """The admission of traffic governed by ``policy`` (``None``: no policy applies)."""
    if policy is None:
        return DEFAULT_ADMISSION
    return Admission(
        slo_class=policy.name,
        priority=int(policy.priority),
        sheddable=bool(policy.sheddable),
        ttft_ms=int(policy.ttft_ms),
        tpot_ms=int(policy.tpot_ms),
        weight=float(policy.weight),
    )


@dataclass(slots=True)
class _Policy:
    name: str
    ttft_ms: int
    tpot_ms: int
    priority: int
    sheddable: bool
    weight: float = 1.0


@dataclass
class AdmissionTable:
    """Every SLO assignment, resolved in memory: tenant+model, then tenant, then model, then default."""

    by_target: dict[tuple[uuid.UUID | None, uuid.UUID | None], Admission] = field(default_factory=dict)

    @classmethod
    def build(
        cls, rows: Iterable[tuple[uuid.UUID | None, uuid.UUID | None, SloPolicyLike]]
    ) -> AdmissionTable:
        table = cls()
        for tenant_id, model_id, policy in rows:
            table.by_target[(tenant_id, model_id)] = admission_for(policy)
        return table

    def admission_for(self, tenant_id: uuid.UUID, model_id: uuid.UUID | None) -> Admission:
        for key in ((tenant_id, model_id), (tenant_id, None), (None, model_id)):
            if key in self.by_target:
                return self.by_target[key]
        return DEFAULT_ADMISSION


def load_admission_table(uow: UnitOfWork) -> AdmissionTable:
    """Reads every assignment with its policy (a system-scope unit of work)."""
    stmt = select(m.SloAssignment.tenant_id, m.SloAssignment.model_id, m.SloPolicy).join(
        m.SloPolicy, m.SloPolicy.id == m.SloAssignment.policy_id
    )
    with translated():
        rows = uow.session.execute(stmt).all()
    return AdmissionTable.build(
        (t, mid, _Policy(p.name, p.ttft_ms, p.tpot_ms, p.priority, p.sheddable, p.weight)) for t, mid, p in rows
    )
