"""Catalogue use cases: models (with the shape the planner needs) and deployments (see
:mod:`baton.control.services`).

Deployments are validated by converting them to the data plane's ``DeploymentSpec`` and rendering their
Ray Serve entry (the same conversion the reconciler applies), so nothing reaches the database that the
data plane would refuse. A change of what Serve must run is a new ``generation`` and is followed by a
reconcile; deleting marks the row ``deleted`` and the reconciler removes it once Serve no longer runs it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from baton.control.audit import audit, snapshot
from baton.control.spec_rows import deployment_spec, throughput_from
from baton.control.usecase import Actor, Notifier
from baton.control.views import UNSET, WIRE_SCHEMA, Page, Precondition, Unset, check
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database, UnitOfWork
from baton.core.settings import Settings
from baton.dataplane.render import render_serve_application

Mode = Literal["aggregated", "pd"]
Dtype = Literal["float32", "bfloat16", "float16", "fp8", "int8"]
ModelKind = Literal["generate", "embed"]

#: A deployment that served requests this recently is deleted only with ``force``.
RECENT_TRAFFIC = dt.timedelta(minutes=15)

#: Columns whose change is a new generation of the spec (what Serve must run).
SPEC_COLUMNS = ("mode", "prefill_min_replicas", "prefill_max_replicas", "decode_min_replicas",
                "decode_max_replicas", "engine_settings", "kv_connector", "lmcache", "device_profile",
                "slo_policy_id", "desired_state")

# --- models -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewModel:
    name: str
    source: str
    context_length: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Dtype
    params_b: float | None = None
    kind: ModelKind = "generate"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None


#: Serving settings that an empty string clears (``None`` leaves them as they are).
CLEARABLE = ("tool_call_parser", "reasoning_parser", "chat_template")


@dataclass(frozen=True, slots=True)
class ModelChanges:
    """Fields to change; ``None`` leaves one as it is, ``""`` clears one of :data:`CLEARABLE`."""

    source: str | None = None
    context_length: int | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    dtype: Dtype | None = None
    params_b: float | None = None
    kind: ModelKind | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None

    def items(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return {k: (None if k in CLEARABLE and v == "" else v) for k, v in out.items()}


@dataclass(frozen=True, slots=True)
class ModelView:
    id: uuid.UUID
    name: str
    source: str
    context_length: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    params_b: float | None
    kind: str
    tool_call_parser: str | None
    reasoning_parser: str | None
    chat_template: str | None
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def of(cls, row: m.Model) -> ModelView:
        return cls(id=row.id, name=row.name, source=row.source, context_length=row.context_length,
                   num_layers=row.num_layers, num_kv_heads=row.num_kv_heads, head_dim=row.head_dim,
                   dtype=row.dtype, params_b=row.params_b, kind=row.kind, tool_call_parser=row.tool_call_parser,
                   reasoning_parser=row.reasoning_parser, chat_template=row.chat_template, version=row.version,
                   created_at=row.created_at, updated_at=row.updated_at)


def _check_serving(kind: str, tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    if kind == "embed" and (tool_call_parser or reasoning_parser):
        raise errors.ValidationError("An embedding model has no tool-call or reasoning parser.",
                                     param="tool_call_parser" if tool_call_parser else "reasoning_parser")


# --- deployments ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replicas:
    min: int = 1
    max: int = 1


@dataclass(frozen=True, slots=True)
class NewDeployment:
    name: str
    model_id: uuid.UUID
    mode: Mode = "aggregated"
    prefill: Replicas = field(default_factory=lambda: Replicas(0, 0))
    decode: Replicas = field(default_factory=Replicas)
    engine: dict[str, Any] = field(default_factory=dict)
    kv_connector: str | None = None
    lmcache: dict[str, Any] | None = None
    device_profile: str = "cpu"
    slo_policy_id: uuid.UUID | None = None
    desired_state: Literal["running", "stopped"] = "running"


@dataclass(frozen=True, slots=True)
class DeploymentChanges:
    """Fields to change; :data:`~baton.control.views.UNSET` leaves one as it is. ``None`` clears
    ``engine`` (to ``{}``), ``kv_connector``, ``lmcache`` and ``slo_policy_id``; for the others it
    leaves them as they are."""

    mode: Mode | Unset | None = UNSET
    prefill: Replicas | Unset | None = UNSET
    decode: Replicas | Unset | None = UNSET
    engine: dict[str, Any] | Unset | None = UNSET
    kv_connector: str | Unset | None = UNSET
    lmcache: dict[str, Any] | Unset | None = UNSET
    device_profile: str | Unset | None = UNSET
    slo_policy_id: uuid.UUID | Unset | None = UNSET
    desired_state: Literal["running", "stopped"] | Unset | None = UNSET


@dataclass(frozen=True, slots=True)
class DeploymentView:
    id: uuid.UUID
    name: str
    model_id: uuid.UUID
    mode: str
    prefill: Replicas
    decode: Replicas
    engine: dict[str, Any]
    kv_connector: str | None
    lmcache: dict[str, Any] | None
    device_profile: str
    slo_policy_id: uuid.UUID | None
    desired_state: str
    observed_state: str
    observed_reason: str | None
    observed_at: dt.datetime | None
    generation: int
    observed_generation: int
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime
    #: The catalogue model's name.
    model: str | None = None

    @classmethod
    def of(cls, d: m.Deployment, *, model: str | None = None) -> DeploymentView:
        return cls(
            id=d.id, name=d.name, model_id=d.model_id, mode=d.mode.value,
            prefill=Replicas(d.prefill_min_replicas, d.prefill_max_replicas),
            decode=Replicas(d.decode_min_replicas, d.decode_max_replicas),
            engine=dict(d.engine_settings or {}), kv_connector=d.kv_connector,
            lmcache=dict(d.lmcache) if d.lmcache is not None else None, device_profile=d.device_profile,
            slo_policy_id=d.slo_policy_id, desired_state=d.desired_state.value,
            observed_state=d.observed_state.value, observed_reason=d.observed_reason, observed_at=d.observed_at,
            generation=d.generation, observed_generation=d.observed_generation, version=d.version,
            created_at=d.created_at, updated_at=d.updated_at, model=model,
        )


def _view(uow: UnitOfWork, d: m.Deployment) -> DeploymentView:
    """The deployment's view with its model's name."""
    model = uow.models.get(d.model_id)
    return DeploymentView.of(d, model=model.name if model else None)


@dataclass(frozen=True, slots=True)
class DeploymentStatusView:
    """What the reconciler last saw in Ray Serve for one deployment."""

    __pydantic_config__ = WIRE_SCHEMA

    id: uuid.UUID
    name: str
    desired_state: str
    observed_state: str
    observed_reason: str | None
    observed_at: dt.datetime | None
    generation: int
    observed_generation: int
    up_to_date: bool
    """Serve runs the current generation and the states agree."""

    @classmethod
    def of(cls, d: m.Deployment) -> DeploymentStatusView:
        up = d.observed_generation == d.generation and (
            (d.desired_state is m.DesiredState.RUNNING and d.observed_state is m.ObservedState.RUNNING)
            or (d.desired_state is m.DesiredState.STOPPED and d.observed_state is m.ObservedState.STOPPED)
        )
        return cls(id=d.id, name=d.name, desired_state=d.desired_state.value,
                   observed_state=d.observed_state.value, observed_reason=d.observed_reason,
                   observed_at=d.observed_at, generation=d.generation, observed_generation=d.observed_generation,
                   up_to_date=up)


def _connector(value: str | None) -> str | None:
    return None if value in (None, "none") else value


class Catalogue:
    """Models and deployments."""

    def __init__(self, settings: Settings, db: Database, notify: Notifier) -> None:
        self.settings, self.db, self.notify = settings, db, notify

    # -- models ------------------------------------------------------------------------------------

    def create_model(self, actor: Actor, new: NewModel) -> ModelView:
        _check_serving(new.kind, new.tool_call_parser, new.reasoning_parser)
        with self.db.system() as uow:
            row = uow.models.add(m.Model(
                name=new.name, source=new.source, context_length=new.context_length, num_layers=new.num_layers,
                num_kv_heads=new.num_kv_heads, head_dim=new.head_dim, dtype=new.dtype, params_b=new.params_b,
                kind=new.kind, tool_call_parser=new.tool_call_parser or None,
                reasoning_parser=new.reasoning_parser or None, chat_template=new.chat_template or None,
            ))
            audit(uow, actor, "model.create", "model", row.id, after=row)
            uow.commit()
            return ModelView.of(row)

    def list_models(self, *, name_contains: str | None = None, limit: int = 50, offset: int = 0) -> Page[ModelView]:
        with self.db.system() as uow:
            rows, total = uow.models.page(uow.models.query(name_contains=name_contains), limit=limit, offset=offset)
            return Page([ModelView.of(r) for r in rows], total, limit, offset)

    def get_model(self, model_id: uuid.UUID) -> ModelView:
        with self.db.system() as uow:
            return ModelView.of(uow.models.require(model_id))

    def update_model(self, actor: Actor, model_id: uuid.UUID, changes: ModelChanges, *,
                     expect: Precondition | None = None) -> ModelView:
        """Changing the source, shape or serving settings re-renders the model's deployments (a reconcile
        follows) and drops every gateway's cached grants. A model with deployments keeps its kind (a P/D
        deployment cannot serve embeddings)."""
        values = changes.items()
        with self.db.system() as uow:
            row = uow.models.require(model_id)
            check(expect, row.version)
            if "kind" in values and values["kind"] != row.kind and uow.deployments.for_model(model_id):
                raise errors.ConflictError("This model has deployments; delete them before changing its kind.")
            _check_serving(values.get("kind", row.kind), values.get("tool_call_parser", row.tool_call_parser),
                           values.get("reasoning_parser", row.reasoning_parser))
            before = snapshot(row)
            for k, v in values.items():
                setattr(row, k, v)
            if values:
                uow.flush()
                audit(uow, actor, "model.update", "model", row.id, before=before, after=row)
            uow.commit()
            out = ModelView.of(row)
        if values:
            self.notify.reconcile("model changed")
            # every gateway's cached grants carry the model's context, kind and tool-call capability
            self.notify.invalidate("all", None)
        return out

    def delete_model(self, actor: Actor, model_id: uuid.UUID, *, expect: Precondition | None = None) -> None:
        """A model that deployments still use cannot be deleted (409): delete them first."""
        with self.db.system() as uow:
            row = uow.models.require(model_id)
            check(expect, row.version)
            if uow.deployments.for_model(model_id):
                raise errors.ConflictError("This model still has deployments; delete them first.")
            before = snapshot(row)
            uow.models.delete(row)  # a deployment on its way out still references it: 409 from the database
            audit(uow, actor, "model.delete", "model", model_id, before=before)
            uow.commit()

    # -- deployments -------------------------------------------------------------------------------

    def _render(self, uow: UnitOfWork, d: m.Deployment) -> dict[str, Any]:
        """Converts the row to the data plane's spec and renders its Serve entry (400 if refused)."""
        if d.mode is m.DeploymentMode.PD:
            if not d.kv_connector or d.kv_connector == "none":
                raise errors.ValidationError("P/D mode needs a KV connector (kv_connector: nixl).",
                                             param="kv_connector")
            if d.prefill_max_replicas < 1:
                raise errors.ValidationError("P/D mode needs a prefill pool (prefill.max >= 1).", param="prefill")
        if d.decode_max_replicas < 1:
            raise errors.ValidationError("The decode pool needs max >= 1.", param="decode")
        for name, lo, hi in (("prefill", d.prefill_min_replicas, d.prefill_max_replicas),
                             ("decode", d.decode_min_replicas, d.decode_max_replicas)):
            if lo > hi:
                raise errors.ValidationError(f"{name}: min must be <= max.", param=name)
        model = uow.models.get(d.model_id) if d.model_id else None
        if model is None:
            raise errors.NotFoundError(f"No model with id {d.model_id}.", param="model_id")
        policy = None
        if d.slo_policy_id:
            policy = uow.slo_policies.get(d.slo_policy_id)
            if policy is None:
                raise errors.NotFoundError(f"No SLO policy with id {d.slo_policy_id}.", param="slo_policy_id")
        spec = deployment_spec(d, model, policy=policy, throughput=throughput_from(self.settings, d.engine_settings))
        entry: dict[str, Any] = render_serve_application(spec)
        return entry

    def create_deployment(self, actor: Actor, new: NewDeployment) -> DeploymentView:
        d = m.Deployment(
            name=new.name, model_id=new.model_id, mode=m.DeploymentMode(new.mode),
            prefill_min_replicas=new.prefill.min, prefill_max_replicas=new.prefill.max,
            decode_min_replicas=new.decode.min, decode_max_replicas=new.decode.max,
            engine_settings=dict(new.engine), kv_connector=_connector(new.kv_connector), lmcache=new.lmcache,
            device_profile=new.device_profile, slo_policy_id=new.slo_policy_id,
            desired_state=m.DesiredState(new.desired_state),
        )
        with self.db.system() as uow:
            self._render(uow, d)
            uow.deployments.add(d)
            audit(uow, actor, "deployment.create", "deployment", d.id, after=d)
            uow.commit()
            out = _view(uow, d)
        self.notify.reconcile("deployment created")
        return out

    def list_deployments(
        self, *, model_id: uuid.UUID | None = None, desired_state: m.DesiredState | None = None,
        observed_state: m.ObservedState | None = None, limit: int = 50, offset: int = 0,
    ) -> Page[DeploymentView]:
        """Deployments by name, each with its model's name."""
        with self.db.system() as uow:
            stmt = uow.deployments.query(model_id=model_id, desired_state=desired_state,
                                         observed_state=observed_state)
            rows, total = uow.deployments.page(stmt, limit=limit, offset=offset)
            names = uow.models.names() if rows else {}
            return Page([DeploymentView.of(r, model=names.get(r.model_id)) for r in rows], total, limit, offset)

    def get_deployment(self, deployment_id: uuid.UUID) -> DeploymentView:
        with self.db.system() as uow:
            return _view(uow, uow.deployments.require(deployment_id))

    def deployment_status(self, deployment_id: uuid.UUID) -> DeploymentStatusView:
        with self.db.system() as uow:
            return DeploymentStatusView.of(uow.deployments.require(deployment_id))

    def serve_config(self, deployment_id: uuid.UUID) -> dict[str, Any]:
        """The Ray Serve application entry Baton renders for this deployment (what the reconciler applies)."""
        with self.db.system() as uow:
            return self._render(uow, uow.deployments.require(deployment_id))

    def update_deployment(self, actor: Actor, deployment_id: uuid.UUID, changes: DeploymentChanges, *,
                          expect: Precondition | None = None) -> DeploymentView:
        """Change the mode, pools, engine settings, KV connector, tiers, SLO policy or desired state.
        A change of what Serve must run is a new generation (validated, audited, then reconciled); a
        deployment being deleted cannot change (409)."""
        with self.db.system() as uow:
            d = uow.deployments.require(deployment_id)
            check(expect, d.version)
            if d.desired_state is m.DesiredState.DELETED:
                raise errors.ConflictError("This deployment is being deleted.")
            before = snapshot(d) or {}
            _apply(d, changes)
            after = snapshot(d) or {}
            changed = any(before.get(c) != after.get(c) for c in SPEC_COLUMNS)
            if changed:
                self._render(uow, d)
                d.generation = d.generation + 1
                uow.flush()
                audit(uow, actor, "deployment.update", "deployment", d.id, before=before, after=d)
            uow.commit()
            out = _view(uow, d)
        if changed:
            self.notify.reconcile("deployment changed")
        return out

    def delete_deployment(self, actor: Actor, deployment_id: uuid.UUID, *,
                          expect: Precondition | None = None, force: bool = False) -> DeploymentView:
        """Marks the deployment deleted (idempotent); the reconciler removes it once Serve no longer runs it.
        A deployment that served requests in the last :data:`RECENT_TRAFFIC` is only deleted with ``force``
        (409 otherwise): deleting it stops what its tenants are calling."""
        with self.db.system() as uow:
            d = uow.deployments.require(deployment_id)
            check(expect, d.version)
            if d.desired_state is not m.DesiredState.DELETED and not force:
                since = dt.datetime.now(dt.UTC) - RECENT_TRAFFIC
                served = uow.requests.count_for_deployment(d.name, since)
                if served:
                    minutes = int(RECENT_TRAFFIC.total_seconds() // 60)
                    raise errors.ConflictError(
                        f"The deployment {d.name} served {served} requests in the last {minutes} minutes: deleting "
                        "it stops serving its model. Delete it with force to go ahead.", param="force")
            if d.desired_state is not m.DesiredState.DELETED:
                before = snapshot(d)
                d.desired_state = m.DesiredState.DELETED
                d.generation = d.generation + 1
                uow.flush()
                audit(uow, actor, "deployment.delete", "deployment", d.id, before=before, after=d)
            uow.commit()
            out = _view(uow, d)
        self.notify.reconcile("deployment deleted")
        return out

    def request_reconcile(self, actor: Actor) -> None:
        """Enqueues a reconcile now (one also runs after every change and periodically)."""
        self.notify.reconcile(f"requested by {actor.name}")


def _apply(d: m.Deployment, c: DeploymentChanges) -> None:
    if isinstance(c.mode, str):
        d.mode = m.DeploymentMode(c.mode)
    if isinstance(c.prefill, Replicas):
        d.prefill_min_replicas, d.prefill_max_replicas = c.prefill.min, c.prefill.max
    if isinstance(c.decode, Replicas):
        d.decode_min_replicas, d.decode_max_replicas = c.decode.min, c.decode.max
    if c.engine is not UNSET:
        d.engine_settings = dict(c.engine or {})
    if c.kv_connector is not UNSET:
        d.kv_connector = _connector(c.kv_connector)
    if c.lmcache is not UNSET:
        d.lmcache = c.lmcache
    if isinstance(c.device_profile, str):
        d.device_profile = c.device_profile
    if c.slo_policy_id is not UNSET:
        d.slo_policy_id = c.slo_policy_id
    if isinstance(c.desired_state, str):
        d.desired_state = m.DesiredState(c.desired_state)
