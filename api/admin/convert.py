"""From the admin API's request bodies to the control plane's commands: one place, used by the admin routes and
the operator console alike (neither surface imports the other's routes). Answers need no conversion: a use
case's view is the wire shape (:mod:`baton.control.views`)."""

from __future__ import annotations

from typing import Any

from baton.control.catalogue import (
    DeploymentChanges,
    ModelChanges,
    NewDeployment,
    NewModel,
    Replicas,
)
from baton.control.policies import NewAssignment, NewPolicy
from baton.control.views import UNSET

from .schemas import (
    DeploymentCreate,
    DeploymentUpdate,
    ModelCreate,
    ModelUpdate,
    ReplicaRange,
    SloAssignmentCreate,
    SloPolicyCreate,
)

# --- models ---------------------------------------------------------------------------------------

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


# --- SLO policies ---------------------------------------------------------------------------------

def new_policy(body: SloPolicyCreate) -> NewPolicy:
    return NewPolicy(**body.model_dump())


def new_assignment(body: SloAssignmentCreate) -> NewAssignment:
    return NewAssignment(policy_id=body.policy_id, tenant_id=body.tenant_id, model_id=body.model_id)
