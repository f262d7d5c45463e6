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


def test_past_the_ttl_a_known_route_answers_at_once_and_a_new_model_waits_for_the_read(db: Database) -> None:
    """Stale-while-revalidate: an idle spell longer than the TTL costs no request a database read (the known
    route answers while the table is read again in the background); a model the table did not have yet
    (deployed just now) waits for the read and is found."""
    tag = uuid.uuid4().hex[:8]
    known = add_model(db, f"route-known-{tag}", 2048)
    _deployment(db, known.id, f"a-known-{tag}", m.ObservedState.RUNNING)
    router = DeploymentRouter(db, "http://serve:8000", ttl=0.05)

    async def go() -> None:
        first = await router.resolve(known.name)
        assert first is not None and first.deployment == f"a-known-{tag}"
        _deployment(db, known.id, f"0-known-{tag}", m.ObservedState.RUNNING)  # sorts first from now on
        later = add_model(db, f"route-later-{tag}", 2048)
        _deployment(db, later.id, f"a-later-{tag}", m.ObservedState.RUNNING)
        await asyncio.sleep(0.1)  # past the TTL
        reads = 0
        real = router._read

        def counted() -> dict:  # type: ignore[type-arg]
            nonlocal reads
            reads += 1
            return real()

        router._read = counted  # type: ignore[method-assign]
        stale = await router.resolve(known.name)  # answered from the table it had, no read awaited
        assert stale is not None and stale.deployment == f"a-known-{tag}"
        assert router._reloading is not None
        await router._reloading
        assert reads == 1
        fresh = await router.resolve(known.name)
        assert fresh is not None and fresh.deployment == f"0-known-{tag}"
        await asyncio.sleep(0.1)
        new = await router.resolve(later.name)  # known after the background read already
        assert new is not None and new.deployment == f"a-later-{tag}"

    asyncio.run(go())


def test_a_model_without_a_route_waits_for_the_read_past_the_ttl(db: Database) -> None:
    tag = uuid.uuid4().hex[:8]
    router = DeploymentRouter(db, "http://serve:8000", ttl=0.05)

    async def go() -> None:
        assert await router.resolve(f"route-new-{tag}") is None
        model = add_model(db, f"route-new-{tag}", 2048)
        _deployment(db, model.id, f"a-new-{tag}", m.ObservedState.RUNNING)
        await asyncio.sleep(0.1)
        route = await router.resolve(model.name)
        assert route is not None and route.deployment == f"a-new-{tag}"

    asyncio.run(go())
