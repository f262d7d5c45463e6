"""The gateway's deployment routes, read from Postgres: which deployments serve a model, and the
fallback pool of a P/D deployment."""

from __future__ import annotations

import asyncio
import uuid

from baton.api.gateway.routing import DeploymentRouter
from baton.core import models as m
from baton.core.db import Database

from .conftest import add_model


def _deployment(db: Database, model_id: uuid.UUID, name: str, observed: m.ObservedState, *,
                mode: m.DeploymentMode = m.DeploymentMode.AGGREGATED) -> None:
    with db.system() as uow:
        pd = mode is m.DeploymentMode.PD
        uow.deployments.add(m.Deployment(name=name, model_id=model_id, mode=mode, observed_state=observed,
                                         desired_state=m.DesiredState.RUNNING, kv_connector="nixl" if pd else None,
                                         prefill_min_replicas=1 if pd else 0, prefill_max_replicas=1 if pd else 0))
        uow.commit()


def test_routes_keep_a_deployment_a_replica_short_and_name_a_pd_deployments_fallback(db: Database) -> None:
    tag = uuid.uuid4().hex[:8]
    pd_model = add_model(db, f"route-pd-{tag}", 2048)
    agg_model = add_model(db, f"route-agg-{tag}", 2048)
    gone_model = add_model(db, f"route-gone-{tag}", 2048)
    # A P/D deployment whose decode replica died: Serve reports it deploying while Ray replaces it.
    _deployment(db, pd_model.id, f"a-pd-{tag}", m.ObservedState.DEPLOYING, mode=m.DeploymentMode.PD)
    # Two deployments of one model: the running one wins over the unhealthy one, whatever their names.
    _deployment(db, agg_model.id, f"a-agg-{tag}", m.ObservedState.UNHEALTHY)
    _deployment(db, agg_model.id, f"b-agg-{tag}", m.ObservedState.RUNNING)
    _deployment(db, gone_model.id, f"a-gone-{tag}", m.ObservedState.FAILED)

    router = DeploymentRouter(db, "http://serve:8000")

    async def resolve(name: str):  # type: ignore[no-untyped-def]
        return await router.resolve(name)

    pd = asyncio.run(resolve(pd_model.name))
    assert pd is not None and pd.base_url == f"http://serve:8000/a-pd-{tag}/v1"
    assert pd.fallback_url == f"http://serve:8000/a-pd-{tag}.prefill/v1"
    agg = asyncio.run(resolve(agg_model.name))
    assert agg is not None and agg.deployment == f"b-agg-{tag}" and agg.fallback_url is None
    assert asyncio.run(resolve(gone_model.name)) is None
