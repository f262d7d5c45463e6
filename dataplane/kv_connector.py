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
3. Integrity: once LMCache's storage manager exists (`register_kv_caches`), every tier it reads from is
   checked (`baton.dataplane.kv_integrity`: a digest per stored chunk). A chunk that fails its check is a
   miss: LMCache retrieves fewer tokens, reports the blocks it did not load, and vLLM recomputes them
   (`kv_load_failure_policy: recompute`). The worker half hands the failures out as this connector's KV
   stats, which vLLM's stat loggers (Ray's, under Ray Serve) export as the counter
   ``baton_kv_integrity_failures_total{tier, tenant_tag, reason}``. The scheduler half corrects the
   request's prefill statistics when loaded blocks fail, so ``prompt_tokens_by_source`` counts the
   recomputed tokens as ``local_compute``, not as ``external_kv_transfer``.
4. P/D: on the decode side NIXL supplies the prompt's KV (the connector listed first in the
   ``MultiConnector`` wins a request it can load), and the prefill side stored it in the tiers already.
   vLLM's ``MultiConnector`` still asks every connector for its hits, so LMCache's lookup (a round trip
   to its lookup server and the tiers, Redis included) sat on the way to each P/D request's first token,
   for KV that NIXL loads anyway. A request whose KV a peer hands over
   (``do_remote_prefill``) is not looked up and is marked ``lmcache.skip_save``: LMCache, which then has
   no record of what the tiers hold, does not store the prompt a second time.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

TENANT_TAG_KEY = "lmcache.tag.tenant"
#: LMCache's request config that keeps a request's KV out of the tiers.
SKIP_STORE_KEY = "lmcache.skip_save"


def tenant_tag(cache_salt: str) -> str:
    """The LMCache tag value for a tenant's cache salt (hex digest; no separators, no salt text)."""
    return hashlib.sha256(cache_salt.encode()).hexdigest()[:32]


def apply_tenant_tag(sampling_params: Any, cache_salt: str | None) -> None:
    """Put the tenant tag into the request configs LMCache reads from `sampling_params`."""
    if sampling_params is None or not cache_salt:
        return
    _request_configs(sampling_params)[TENANT_TAG_KEY] = tenant_tag(cache_salt)


def _request_configs(sampling_params: Any) -> dict[str, Any]:
    """The dict LMCache reads request configs from (``extra_args["kv_transfer_params"]``), made if missing;
    NIXL's transfer params live in the same dict."""
    extra = sampling_params.extra_args
    if extra is None:
        extra = sampling_params.extra_args = {}
    params = extra.get("kv_transfer_params")
    if not isinstance(params, dict):
        params = extra["kv_transfer_params"] = {}
    configs: dict[str, Any] = params
    return configs


def kv_from_peer(request: Any) -> bool:
    """Whether a P/D peer hands this request's prompt KV over (NIXL's ``do_remote_prefill``)."""
    params = getattr(request, "kv_transfer_params", None)
    return isinstance(params, dict) and bool(params.get("do_remote_prefill"))


def skip_tier_store(sampling_params: Any) -> None:
    """Tell LMCache not to store this request's KV (its ``lmcache.skip_save`` request config)."""
    if sampling_params is not None:
        _request_configs(sampling_params)[SKIP_STORE_KEY] = True


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
    """vLLM's LMCache connector with a CPU path, per-tenant tier keys and checked tiers."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None):
        if role == KVConnectorRole.WORKER and vllm_config.device_config.device_type == "cpu":
            register_cpu_lmcache_engine(vllm_config)
        super().__init__(vllm_config, role, kv_cache_config)
        self._baton_integrity_tiers: list[str] | None = None
        # Scheduler half: requests loading KV from a tier -> (request, its block ids), until finished.
        self._baton_loads: OrderedDict[str, tuple[Any, set[int]]] = OrderedDict()

    # Worker side: the tiers are checked before the first load or store.

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        super().register_kv_caches(kv_caches)
        self._baton_check_tiers()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._baton_integrity_tiers is None:
            self._baton_check_tiers()
        super().start_load_kv(forward_context, **kwargs)

    def _baton_check_tiers(self) -> None:
        from lmcache.integration.vllm.utils import ENGINE_NAME
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        from baton.dataplane.kv_integrity import install

        engine = LMCacheEngineBuilder.get(ENGINE_NAME)
        if engine is not None:
            self._baton_integrity_tiers = install(engine)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.role != KVConnectorRole.WORKER:
            return None  # the two halves share a process under the uni executor: the worker half drains
        from baton.dataplane.kv_integrity import drain_failures

        rows = drain_failures()
        return KVIntegrityStats(data={_ROWS: rows}) if rows else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KVIntegrityStats(data=data) if data is not None else KVIntegrityStats(data={_ROWS: []})

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KVConnectorPromMetrics | None:
        return KVIntegrityPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # Scheduler side: every hook that can see a new request tags it before LMCache reads it.

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        apply_tenant_tag(request.sampling_params, getattr(request, "cache_salt", None))
        if kv_from_peer(request):
            # P/D decode side: NIXL supplies this prompt's KV (the connector listed before this one wins
            # the request), and the prefill side already stored it in the tiers. LMCache's lookup would
            # only cost a round trip to the lookup server and the remote tier on the way to the first
            # token; without it LMCache has no record of the prompt, so it is told not to store it again.
            skip_tier_store(request.sampling_params)
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        apply_tenant_tag(request.sampling_params, getattr(request, "cache_salt", None))
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._baton_loads[request.request_id] = (request, _block_ids(blocks))
            while len(self._baton_loads) > 4096:
                self._baton_loads.popitem(last=False)

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if not invalid or not self._baton_loads:
            return
        try:
            for req_id, (request, blocks) in list(self._baton_loads.items()):
                if getattr(request, "prefill_stats", None) is None:
                    self._baton_loads.pop(req_id, None)  # its first output went out: nothing to correct
                elif blocks & invalid and correct_prefill_stats(request):
                    self._baton_loads.pop(req_id, None)
        except Exception:
            logger.debug("prefill statistics not corrected after a KV load failure", exc_info=True)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._baton_loads.pop(request.request_id, None)
        return super().request_finished(request, block_ids)


# -- integrity failures as vLLM connector stats -------------------------------------------------------

INTEGRITY_METRIC = "baton_kv_integrity_failures"
INTEGRITY_LABELS = ("tier", "tenant_tag", "reason")
_ROWS = "integrity_failures"


@dataclass
class KVIntegrityStats(KVConnectorStats):
    """KV integrity failures of one interval: ``data["integrity_failures"]`` holds
    ``[tier, tenant_tag, reason, count]`` rows (msgpack-able: they cross from the engine core to the
    front end)."""

    def rows(self) -> list[list[Any]]:
        rows = self.data.get(_ROWS)
        return rows if isinstance(rows, list) else []

    def reset(self) -> None:
        self.data = {_ROWS: []}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merged: dict[tuple[str, str, str], int] = {}
        for tier, tenant, reason, n in [*self.rows(), *KVIntegrityStats(data=other.data).rows()]:
            merged[(tier, tenant, reason)] = merged.get((tier, tenant, reason), 0) + int(n)
        self.data = {_ROWS: [[*k, n] for k, n in merged.items()]}
        return self

    def reduce(self) -> dict[str, int | float]:
        return {"kv_integrity_failures": sum(int(r[3]) for r in self.rows())}

    def is_empty(self) -> bool:
        return not self.rows()


def _counter(counter_cls: Any, labelnames: list[str]) -> Any:
    kwargs = {"name": INTEGRITY_METRIC, "labelnames": labelnames,
              "documentation": "KV chunks read from an LMCache tier that failed their checksum (recomputed)."}
    try:
        return counter_cls(**kwargs)
    except ValueError:  # prometheus_client: already registered in this process (a second logger)
        from prometheus_client import REGISTRY

        names = getattr(REGISTRY, "_names_to_collectors", {})
        existing = names.get(INTEGRITY_METRIC) or names.get(INTEGRITY_METRIC + "_total")
        if existing is None:
            raise
        return existing


class KVIntegrityPromMetrics(KVConnectorPromMetrics):
    """``baton_kv_integrity_failures_total{model_name, engine, tier, tenant_tag, reason}`` in the metric
    classes of whichever vLLM stat logger builds it (prometheus_client, or Ray's metrics under Ray Serve,
    where it is exported as ``ray_baton_kv_integrity_failures_total`` with the replica's ``ReplicaId``)."""

    def __init__(self, vllm_config: Any, metric_types: Any, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._failures = _counter(self._counter_cls, [*labelnames, *INTEGRITY_LABELS])

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        engine_labels = self.per_engine_labelvalues.get(engine_idx, [])
        for tier, tenant, reason, n in KVIntegrityStats(data=transfer_stats_data).rows():
            if n:
                self._failures.labels(*engine_labels, tier, tenant, reason).inc(n)


def _block_ids(blocks: Any) -> set[int]:
    try:
        groups = blocks.get_block_ids()
    except Exception:
        return set()
    return {int(b) for group in groups or () for b in group}


def correct_prefill_stats(request: Any) -> bool:
    """After vLLM rolled a request back to the blocks that loaded (invalid blocks, recompute policy),
    counts the rolled-back tokens as computed locally instead of loaded from a tier.

    vLLM records a request's prefill breakdown when it schedules it and does not revise it when KV
    fails to load, so ``prompt_tokens_by_source`` would report KV that was never used. Returns
    whether the stats changed."""
    stats = getattr(request, "prefill_stats", None)
    if stats is None or getattr(request, "num_preemptions", 0) > 0:
        return False
    valid = int(request.num_computed_tokens)
    if valid >= stats.num_cached_tokens:
        return False
    local = min(stats.num_local_cached_tokens, valid)
    stats.set(num_prompt_tokens=stats.num_prompt_tokens, num_local_cached_tokens=local,
              num_external_cached_tokens=valid - local)
    return True


# vLLM's MultiConnector files its children's stats under their class names and rebuilds them in the
# front-end process from its registry by that name: Baton's connector must be found there. This module
# is imported in the front end too (vLLM's stat loggers build each child's metrics from its module path).
if "BatonLMCacheConnectorV1" not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector("BatonLMCacheConnectorV1", __name__, "BatonLMCacheConnectorV1")
