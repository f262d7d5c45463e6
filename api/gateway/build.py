"""The gateway's composition root: :func:`build_gateway` wires its parts from settings.
``baton.api.app.create_app`` calls it in the app's lifespan, so nothing is created at import time."""

from __future__ import annotations

from functools import partial

import redis.asyncio as aioredis

from baton.api.gateway.attempts import ResumePolicy
from baton.api.gateway.capacity import Capacities, CapacitySettings
from baton.api.gateway.fact_reader import FactMerger
from baton.api.gateway.flow import FlowController, FlowSettings, ViewPublisher
from baton.api.gateway.metering import UsageMeter
from baton.api.gateway.metrics import GatewayMetrics
from baton.api.gateway.principals import (
    InvalidationListener,
    KeyUseRecorder,
    PrincipalCache,
    load_principal,
    write_key_uses,
)
from baton.api.gateway.ratelimit import RateLimiter
from baton.api.gateway.relay import TokenStall
from baton.api.gateway.responses import ResponseStore
from baton.api.gateway.routing import ChainRouter, DeploymentRouter, Router, StaticRouter
from baton.api.gateway.service import Gateway
from baton.api.gateway.upstream import UpstreamClient, new_client
from baton.core.db import Database
from baton.core.secrets import secret_fingerprint, secret_mismatch
from baton.core.settings import Settings
from baton.core.telemetry import Tracing


def build_gateway(
    settings: Settings,
    *,
    db: Database,
    redis: aioredis.Redis[bytes],
    router: Router | None = None,
    http_client: UpstreamClient | None = None,
    tracing: Tracing | None = None,
    metrics: GatewayMetrics | None = None,
) -> Gateway:
    """A ready-to-start :class:`~baton.api.gateway.service.Gateway`."""
    g = settings.gateway
    flow = flow_views = None
    if g.flow.enabled:
        f = g.flow
        flow = FlowController(
            Capacities(CapacitySettings(initial=f.initial_limit, max_limit=f.max_limit, tolerance=f.tolerance,
                                        ttft_tolerance=f.ttft_tolerance,
                                        window_s=f.window_s, min_samples=f.min_samples)),
            FlowSettings(queue_max=f.queue_max, ttl_s=f.ttl_s))
        flow_views = ViewPublisher(redis, flow)
        if metrics is not None:
            metrics.bind_flow(flow)
    secret = settings.security.key_secret.get_secret_value()
    principals = PrincipalCache(partial(load_principal, db, salt_secret=secret), key_secret=secret,
                                ttl=g.key_cache_ttl_s,
                                secret_check=partial(secret_mismatch, db, secret_fingerprint(secret)),
                                uses=KeyUseRecorder(partial(write_key_uses, db), interval_s=g.last_used_flush_s))
    if router is None:
        router = ChainRouter([StaticRouter(g.upstreams, g.fallback_upstreams),
                              DeploymentRouter(db, settings.ray.serve_url, ttl=g.route_cache_ttl_s)])
    return Gateway(
        principals=principals,
        listener=InvalidationListener(redis, principals),
        limiter=RateLimiter(redis, lease_s=g.ratelimit_lease_s, fail_open=g.ratelimit_fail_open,
                            lean=g.redis_client == "baton"),
        meter=UsageMeter(db, batch_size=g.usage_batch_size, flush_interval=g.usage_flush_interval_s,
                         max_buffer=g.usage_buffer_max,
                         enrich=FactMerger(redis, tracing.tracer if tracing and tracing.provider else None),
                         observe=metrics.observe if metrics is not None else None),
        router=router,
        client=http_client or new_client(timeout_s=g.upstream_timeout_s, max_connections=g.upstream_max_connections,
                                          library=g.upstream_client),
        default_completion_budget=g.default_completion_budget,
        max_embedding_input_tokens=g.max_embedding_input_tokens,
        resume=ResumePolicy(attempts=g.resume_attempts, budget_s=g.resume_budget_s, backoff_s=g.resume_backoff_s)
        if g.resume else None,
        stream_stall_s=g.stream_stall_s,
        token_stall=TokenStall(ceiling_s=g.token_stall_s, floor_s=min(g.token_stall_floor_s, g.token_stall_s),
                               multiple=g.token_stall_multiple,
                               decode_floor_s=min(g.token_stall_floor_decode_s, g.token_stall_s)),
        tracing=tracing,
        metrics=metrics,
        responses=ResponseStore(db, retention_days=g.responses_retention_days),
        flow=flow,
        flow_views=flow_views,
    )
