"""Two gateway processes' queues through real Redis (their view publishers, as each process runs one): a
tenant seen by one process makes the model contended in the other, and its service there counts in the
other's fair share. The processes are two flow controllers in one test process, each with its own
process name; nothing else is shared between them."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from baton.api.gateway.capacity import Capacities, CapacitySettings
from baton.api.gateway.flow import FlowClass, FlowController, Ticket, ViewPublisher
from baton.core.contracts import flow_view_key
from baton.core.settings import Settings

pytestmark = pytest.mark.anyio

A, B = uuid.uuid4(), uuid.uuid4()


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


async def test_a_tenant_served_by_one_process_counts_in_the_other(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(settings.redis.url)
    run = uuid.uuid4().hex[:8]
    one, two = FlowController(Capacities()), FlowController(Capacities())
    pub_one = ViewPublisher(redis, one, process=f"test-{run}-1")
    pub_two = ViewPublisher(redis, two, process=f"test-{run}-2")
    model = f"m-{run}"
    try:
        heavy = Ticket(A, FlowClass(), 300)
        await one.model(model).enter(heavy)  # no limit learned yet: goes at once
        one.model(model).leave(heavy, 100)  # 300 prompt + 2 x 100 generated = 500
        await two.model(model).enter(Ticket(B, FlowClass(), 20))
        assert two.model(model).counter(A) == 0 and not two.model(model).contended(5.0)
        assert not one.model(model).contended(5.0)

        await pub_one.publish()
        await pub_two.publish()  # two reads one's view
        await pub_one.publish()  # one reads two's

        assert two.model(model).counter(A) == pytest.approx(500)
        assert two.model(model).contended(5.0) and one.model(model).contended(5.0)
        assert one.model(model).counter(A) == pytest.approx(500)  # its own, not counted twice
        assert one.model(model).counter(B) == pytest.approx(20)
    finally:
        await redis.delete(flow_view_key(pub_one.process), flow_view_key(pub_two.process))
        await redis.aclose()


async def test_a_band_waiting_in_one_process_is_seen_by_the_other(settings: Settings) -> None:
    """Process one (limit 1) has A's second request waiting in band 50: process two learns that band 50
    waits there (its band-10 requests hold, its band-50 ones do not)."""
    redis = aioredis.Redis.from_url(settings.redis.url)
    run = uuid.uuid4().hex[:8]
    one_limit = Capacities(CapacitySettings(min_samples=0, initial=1, max_limit=1))
    one, two = FlowController(one_limit), FlowController(Capacities())
    pub_one = ViewPublisher(redis, one, process=f"test-{run}-1")
    pub_two = ViewPublisher(redis, two, process=f"test-{run}-2")
    model = f"m-{run}"
    try:
        cls = FlowClass(weight=2.0)
        await one.model(model).enter(Ticket(A, cls, 10))
        waiting = asyncio.create_task(one.model(model).enter(Ticket(A, cls, 10)))
        await asyncio.sleep(0.01)
        assert one.model(model).waiting == 1
        await two.model(model).enter(Ticket(B, FlowClass(priority=10), 10))
        await pub_one.publish()
        await pub_two.publish()
        flow = two.model(model)
        assert flow._held(10) and not flow._held(50)
        waiting.cancel()
    finally:
        await redis.delete(flow_view_key(pub_one.process), flow_view_key(pub_two.process))
        await redis.aclose()
