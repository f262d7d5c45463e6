"""Baton's LMCache connector for vLLM: CPU engines, and tier keys separated by tenant.

Loaded by vLLM through `kv_transfer_config` (`kv_connector: BatonLMCacheConnectorV1`,
`kv_connector_module_path: baton.dataplane.kv_connector`), alone or inside a `MultiConnector` next to
`NixlConnector`. It is vLLM's `LMCacheConnectorV1` with two additions:

1. CPU engines: before LMCache builds its engine, the worker registers one under LMCache's engine name
   with `CPUPagedKVConnector` (LMCache has no CPU path of its own). LMCache's service factory then
   reuses that engine instead of failing in `CreateGPUConnector`. No LMCache code is patched.
2. Tenants: the scheduler-side hooks derive the LMCache tag `tenant` from the request's `cache_salt`
   (the gateway sets it per tenant on every request) and put it where LMCache reads request configs,
   `sampling_params.extra_args["kv_transfer_params"]["lmcache.tag.tenant"]`. LMCache keys include the
   tags, so two tenants never share a tier entry, just as vLLM's own prefix cache already separates them
   by `cache_salt`. The tag is a digest: the salt itself never reaches a storage key.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

TENANT_TAG_KEY = "lmcache.tag.tenant"


def tenant_tag(cache_salt: str) -> str:
    """The LMCache tag value for a tenant's cache salt (hex digest; no separators, no salt text)."""
    return hashlib.sha256(cache_salt.encode()).hexdigest()[:32]


def apply_tenant_tag(sampling_params: Any, cache_salt: str | None) -> None:
    """Put the tenant tag into the request configs LMCache reads from `sampling_params`."""
    if sampling_params is None or not cache_salt:
        return
    extra = sampling_params.extra_args
    if extra is None:
        extra = sampling_params.extra_args = {}
    params = extra.get("kv_transfer_params")
    if not isinstance(params, dict):
        params = extra["kv_transfer_params"] = {}
    params[TENANT_TAG_KEY] = tenant_tag(cache_salt)


def register_cpu_lmcache_engine(vllm_config: VllmConfig) -> None:
    """Create LMCache's engine with the CPU connector, once per worker process."""
    from lmcache.integration.vllm.utils import ENGINE_NAME, lmcache_get_or_create_config
    from lmcache.integration.vllm.vllm_service_factory import VllmServiceFactory
    from lmcache.integration.vllm.vllm_v1_adapter import LMCacheConnectorV1Impl
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from vllm.distributed.parallel_state import get_tp_group

    from baton.dataplane.lmcache_cpu import CPUPagedKVConnector

    if LMCacheEngineBuilder.get(ENGINE_NAME) is not None:
        return
    config = lmcache_get_or_create_config()
    # The same overrides LMCache applies itself, applied first so the engine is built with them.
    LMCacheConnectorV1Impl._apply_extra_config(None, config, vllm_config)
    metadata = VllmServiceFactory(config, vllm_config, "worker").get_or_create_metadata()
    connector = CPUPagedKVConnector.from_metadata(metadata, block_size=vllm_config.cache_config.block_size)
    tpg = get_tp_group()
    LMCacheEngineBuilder.get_or_create(ENGINE_NAME, config, metadata, connector, tpg.broadcast, tpg.broadcast_object)
    logger.info("LMCache engine registered with the CPU paged-KV connector (block %d)", connector.block_size)


class BatonLMCacheConnectorV1(LMCacheConnectorV1):
    """vLLM's LMCache connector with a CPU path and per-tenant tier keys."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None):
        if role == KVConnectorRole.WORKER and vllm_config.device_config.device_type == "cpu":
            register_cpu_lmcache_engine(vllm_config)
        super().__init__(vllm_config, role, kv_cache_config)

    # Scheduler side: every hook that can see a new request tags it before LMCache reads it.

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        apply_tenant_tag(request.sampling_params, getattr(request, "cache_salt", None))
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        apply_tenant_tag(request.sampling_params, getattr(request, "cache_salt", None))
        super().update_state_after_alloc(request, blocks, num_external_tokens)
