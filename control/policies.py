"""SLO policy use cases: policies, their assignment to tenants and models, and the admission they give
(see :mod:`baton.control.services`).

A policy's targets compile into the autoscaling of the deployments that use it (a reconcile follows a
change) and into the gateway's admission (its caches are told); an assignment applies a policy to a
tenant, a model, or a tenant on one model, the most specific winning.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields

from baton.control.audit import audit, snapshot
from baton.control.slo import load_admission_table
from baton.control.usecase import Actor, Notifier
from baton.control.views import WIRE_SCHEMA, Page, Precondition, check
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database
from baton.core.settings import Settings


@dataclass(frozen=True, slots=True)
class NewPolicy:
    name: str
    ttft_ms: int
    tpot_ms: int
    percentile: float = 99.0
    priority: int = 0
    sheddable: bool = False
    weight: float = 1.0
    max_wait_s: float | None = None
    max_waiting: int | None = None


#: Policy fields that may be null (the gateway's setting applies): :class:`PolicyChanges` can clear them.
CLEARABLE = frozenset({"max_wait_s", "max_waiting"})


@dataclass(frozen=True, slots=True)
class PolicyChanges:
    """Fields to change; ``None`` leaves one as it is, and ``clear`` names those of :data:`CLEARABLE` to set
    back to null."""

    ttft_ms: int | None = None
    tpot_ms: int | None = None
    percentile: float | None = None
    priority: int | None = None
    sheddable: bool | None = None
    weight: float | None = None
    max_wait_s: float | None = None
    max_waiting: int | None = None
    clear: frozenset[str] = frozenset()

    @classmethod
    def of(cls, sent: Mapping[str, object]) -> PolicyChanges:
        """The changes a request body asks for (``sent``: the fields it set, nulls included): an absent field
        is left as it is, a null one of :data:`CLEARABLE` is cleared, any other null is left as it is."""
        return cls(**{k: v for k, v in sent.items() if v is not None},  # type: ignore[arg-type]
                   clear=frozenset(k for k, v in sent.items() if v is None and k in CLEARABLE))

    def items(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)
                                  if f.name != "clear" and getattr(self, f.name) is not None}
        out.update({name: None for name in self.clear & CLEARABLE})
        return out


@dataclass(frozen=True, slots=True)
class PolicyView:
    __pydantic_config__ = WIRE_SCHEMA
    id: uuid.UUID
    name: str
    ttft_ms: int
    tpot_ms: int
    percentile: float
    priority: int
    sheddable: bool
    weight: float
    max_wait_s: float | None
    """The longest a request of this class waits in a model's queue before its 429 (null: the gateway's setting, 30 s
    unless configured)."""
    max_waiting: int | None
    """How many of one tenant's requests of this class may wait in a model's queue at once, per gateway process; more
    are refused at once with 429 (null: only the queue's own size bounds it)."""
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def of(cls, p: m.SloPolicy) -> PolicyView:
        return cls(id=p.id, name=p.name, ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms, percentile=float(p.percentile),
                   priority=p.priority, sheddable=p.sheddable, weight=float(p.weight), max_wait_s=p.max_wait_s,
                   max_waiting=p.max_waiting, version=p.version, created_at=p.created_at, updated_at=p.updated_at)


@dataclass(frozen=True, slots=True)
class NewAssignment:
    """A policy for a tenant, a model, or a tenant on one model (at least one of the two)."""

    policy_id: uuid.UUID
    tenant_id: uuid.UUID | None = None
    model_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class AssignmentView:
    id: uuid.UUID
    policy_id: uuid.UUID
    tenant_id: uuid.UUID | None
    model_id: uuid.UUID | None
    created_at: dt.datetime

    @classmethod
    def of(cls, a: m.SloAssignment) -> AssignmentView:
        return cls(id=a.id, policy_id=a.policy_id, tenant_id=a.tenant_id, model_id=a.model_id,
                   created_at=a.created_at)


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """How the gateway admits one tenant's traffic (on one model, or on any)."""

    __pydantic_config__ = WIRE_SCHEMA

    slo_class: str
    priority: int
    sheddable: bool
    #: Share of the priority band's tokens, relative to the other tenants' weights.
    weight: float
    ttft_ms: int | None
    tpot_ms: int | None
    shed_threshold: float
    """Load (in-flight / capacity) from which requests are refused."""


class SloPolicies:
    def __init__(self, settings: Settings, db: Database, notify: Notifier) -> None:
        self.settings, self.db, self.notify = settings, db, notify

    # -- policies ----------------------------------------------------------------------------------

    def create_policy(self, actor: Actor, new: NewPolicy) -> PolicyView:
        with self.db.system() as uow:
            row = uow.slo_policies.add(m.SloPolicy(
                name=new.name, ttft_ms=new.ttft_ms, tpot_ms=new.tpot_ms, percentile=new.percentile,
                priority=new.priority, sheddable=new.sheddable, weight=new.weight, max_wait_s=new.max_wait_s,
                max_waiting=new.max_waiting,
            ))
            audit(uow, actor, "slo_policy.create", "slo_policy", row.id, after=row)
            uow.commit()
            return PolicyView.of(row)

    def list_policies(self, *, limit: int = 50, offset: int = 0) -> Page[PolicyView]:
        with self.db.system() as uow:
            rows, total = uow.slo_policies.page(uow.slo_policies.query(), limit=limit, offset=offset)
            return Page([PolicyView.of(r) for r in rows], total, limit, offset)

    def get_policy(self, policy_id: uuid.UUID) -> PolicyView:
        with self.db.system() as uow:
            return PolicyView.of(uow.slo_policies.require(policy_id))

    def update_policy(self, actor: Actor, policy_id: uuid.UUID, changes: PolicyChanges, *,
                      expect: Precondition | None = None) -> PolicyView:
        """New targets re-render the autoscaling of the deployments that use the policy and change the
        gateway's admission."""
        values = changes.items()
        with self.db.system() as uow:
            row = uow.slo_policies.require(policy_id)
            check(expect, row.version)
            before = snapshot(row)
            for k, v in values.items():
                setattr(row, k, v)
            if values:
                uow.flush()
                audit(uow, actor, "slo_policy.update", "slo_policy", row.id, before=before, after=row)
            uow.commit()
            out = PolicyView.of(row)
        if values:
            self.notify.reconcile("SLO policy changed")
            self.notify.invalidate("all", None)
        return out

    def delete_policy(self, actor: Actor, policy_id: uuid.UUID, *, expect: Precondition | None = None) -> None:
        """Its assignments go with it; deployments that used it keep running without one."""
        with self.db.system() as uow:
            row = uow.slo_policies.require(policy_id)
            check(expect, row.version)
            before = snapshot(row)
            uow.slo_policies.delete(row)
            audit(uow, actor, "slo_policy.delete", "slo_policy", policy_id, before=before)
            uow.commit()
        self.notify.reconcile("SLO policy deleted")
        self.notify.invalidate("all", None)

    # -- assignments -------------------------------------------------------------------------------

    def create_assignment(self, actor: Actor, new: NewAssignment) -> AssignmentView:
        if new.tenant_id is None and new.model_id is None:
            raise errors.ValidationError("An assignment needs a tenant_id, a model_id, or both.", param="tenant_id")
        with self.db.system() as uow:
            uow.slo_policies.require(new.policy_id)
            if new.tenant_id:
                uow.tenants.require(new.tenant_id)
            if new.model_id:
                uow.models.require(new.model_id)
            row = uow.slo_assignments.add(m.SloAssignment(policy_id=new.policy_id, tenant_id=new.tenant_id,
                                                          model_id=new.model_id))
            audit(uow, actor, "slo_assignment.create", "slo_assignment", row.id, tenant_id=row.tenant_id, after=row)
            uow.commit()
            out = AssignmentView.of(row)
        self.notify.invalidate("tenant" if out.tenant_id else "all", out.tenant_id)
        return out

    def list_assignments(self, *, tenant_id: uuid.UUID | None = None,
                         model_id: uuid.UUID | None = None) -> list[AssignmentView]:
        with self.db.system() as uow:
            stmt = uow.slo_assignments.query(tenant_id=tenant_id, model_id=model_id)
            return [AssignmentView.of(r) for r in uow.slo_assignments.scalars(stmt)]

    def delete_assignment(self, actor: Actor, assignment_id: uuid.UUID) -> None:
        with self.db.system() as uow:
            row = uow.slo_assignments.require(assignment_id)
            tenant_id, before = row.tenant_id, snapshot(row)
            uow.slo_assignments.delete(row)
            audit(uow, actor, "slo_assignment.delete", "slo_assignment", assignment_id, tenant_id=tenant_id,
                  before=before)
            uow.commit()
        self.notify.invalidate("tenant" if tenant_id else "all", tenant_id)

    # -- admission ---------------------------------------------------------------------------------

    def admission(self, tenant_id: uuid.UUID, model_id: uuid.UUID | None = None) -> AdmissionView:
        """How the gateway admits this tenant's traffic (the SLO class in force, and when it is shed)."""
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            a = load_admission_table(uow).admission_for(tenant_id, model_id)
        return AdmissionView(slo_class=a.slo_class, priority=a.priority, sheddable=a.sheddable, weight=a.weight,
                             ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms, shed_threshold=a.shed_threshold)
