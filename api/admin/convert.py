"""Between the admin API's wire schemas and the control plane's commands and views: one place, used by the
admin routes and the operator console alike (neither surface imports the other's routes)."""

from __future__ import annotations

from typing import Any

from baton.control.catalogue import (
    DeploymentChanges,
    DeploymentStatusView,
    DeploymentView,
    ModelChanges,
    ModelView,
    NewDeployment,
    NewModel,
    Replicas,
)
from baton.control.flow import FlowOverview
from baton.control.policies import AssignmentView, NewAssignment, NewPolicy, PolicyView
from baton.control.views import UNSET

from .schemas import (
    DeploymentCreate,
    DeploymentPublic,
    DeploymentStatus,
    DeploymentUpdate,
    FlowPublic,
    ModelCreate,
    ModelPublic,
    ModelUpdate,
    ReplicaRange,
    SloAssignmentCreate,
    SloAssignmentPublic,
    SloPolicyCreate,
    SloPolicyPublic,
)

# --- models ---------------------------------------------------------------------------------------

def model_public(v: ModelView) -> ModelPublic:
    return ModelPublic.model_validate(v)


def new_model(body: ModelCreate) -> NewModel:
    return NewModel(**body.model_dump())


def model_changes(body: ModelUpdate) -> ModelChanges:
    return ModelChanges(**body.model_dump(exclude_unset=True, exclude_none=True))


# --- deployments ----------------------------------------------------------------------------------

def replicas(r: ReplicaRange) -> Replicas:
    return Replicas(min=r.min, max=r.max)


def new_deployment(body: DeploymentCreate) -> NewDeployment:
    return NewDeployment(
        name=body.name, model_id=body.model_id, mode=body.mode, prefill=replicas(body.prefill),
        decode=replicas(body.decode), engine=body.engine, kv_connector=body.kv_connector, lmcache=body.lmcache,
        device_profile=body.device_profile, slo_policy_id=body.slo_policy_id, desired_state=body.desired_state,
    )


def deployment_changes(body: DeploymentUpdate) -> DeploymentChanges:
    """The fields the body names (``null`` clears engine, kv_connector, lmcache and slo_policy_id)."""
    sent = body.model_fields_set
    values: dict[str, Any] = {}
    for name in sent:
        value = getattr(body, name)
        values[name] = replicas(value) if isinstance(value, ReplicaRange) else value
    return DeploymentChanges(**{name: values.get(name, UNSET) for name in DeploymentUpdate.model_fields})


def deployment_public(v: DeploymentView) -> DeploymentPublic:
    return DeploymentPublic(
        id=v.id, name=v.name, model_id=v.model_id, mode=v.mode,
        prefill=ReplicaRange(min=v.prefill.min, max=v.prefill.max),
        decode=ReplicaRange(min=v.decode.min, max=v.decode.max),
        engine=v.engine, kv_connector=v.kv_connector, lmcache=v.lmcache, device_profile=v.device_profile,
        slo_policy_id=v.slo_policy_id, desired_state=v.desired_state, observed_state=v.observed_state,
        observed_reason=v.observed_reason, observed_at=v.observed_at, generation=v.generation,
        observed_generation=v.observed_generation, version=v.version, created_at=v.created_at,
        updated_at=v.updated_at,
    )


def deployment_status_public(v: DeploymentStatusView) -> DeploymentStatus:
    return DeploymentStatus.model_validate(v)


# --- SLO policies ---------------------------------------------------------------------------------

def policy_public(v: PolicyView) -> SloPolicyPublic:
    return SloPolicyPublic.model_validate(v)


def assignment_public(v: AssignmentView) -> SloAssignmentPublic:
    return SloAssignmentPublic.model_validate(v)


def new_policy(body: SloPolicyCreate) -> NewPolicy:
    return NewPolicy(**body.model_dump())


def new_assignment(body: SloAssignmentCreate) -> NewAssignment:
    return NewAssignment(policy_id=body.policy_id, tenant_id=body.tenant_id, model_id=body.model_id)


# --- flow control ---------------------------------------------------------------------------------

def flow_public(v: FlowOverview) -> FlowPublic:
    """The merged queue view (:class:`~baton.control.flow.FlowOverview`) as ``/admin/v1/flow`` answers it."""
    return FlowPublic.model_validate(v)
