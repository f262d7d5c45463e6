"""KV read back from an LMCache tier is checked: a chunk that does not verify is not loaded (recomputed).

Real LMCache objects throughout: memory objects from LMCache's allocator, its cache engine with Baton's
CPU paged-KV connector, and its real fs / local-disk / Redis tiers (Redis where one answers)."""

from __future__ import annotations

import importlib.util
import time
import uuid
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmcache")

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj  # noqa: E402

from baton.dataplane import kv_integrity as ki  # noqa: E402
from baton.dataplane.lmcache_cpu import CPUPagedKVConnector  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BLOCK, CHUNK = 2, 2, 32, 128, 256
TENANT = "0123456789abcdef0123456789abcdef"
REDIS_URL = "redis://127.0.0.1:6379"


def tensor_obj(shape=(2, LAYERS, 4, HEADS * HEAD_DIM), seed=0) -> TensorMemoryObj:
    shape = torch.Size(shape)
    nbytes = shape.numel() * 4
    meta = MemoryObjMetadata(shape=shape, dtype=torch.float32, address=0, phy_size=nbytes, ref_count=1,
                             fmt=MemoryFormat.KV_2LTD, shapes=[shape], dtypes=[torch.float32])
    obj = TensorMemoryObj(torch.empty(nbytes, dtype=torch.uint8), meta, None)
    obj.tensor.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(seed)))
    return obj


def key(chunk_hash: int = 7, tenant: str | None = TENANT, model: str = "m") -> CacheEngineKey:
    configs = {"lmcache.tag.tenant": tenant} if tenant else None
    return CacheEngineKey(model, 1, 0, chunk_hash, torch.float32, configs)


# -- frames ---------------------------------------------------------------------------------------------


def test_an_intact_frame_gives_back_the_chunk_byte_for_byte():
    obj = tensor_obj()
    frame = ki.seal(key().to_string(), obj)
    meta, payload = ki.open_frame(key().to_string(), frame)
    assert bytes(payload) == bytes(ki._bytes_view(obj.byte_array))
    assert meta["fmt"] == MemoryFormat.KV_2LTD
    assert meta["shapes"] == obj.get_shapes() and meta["dtypes"] == [torch.float32]


def test_every_single_byte_flip_is_rejected():
    k = key().to_string()
    frame = ki.seal(k, tensor_obj())
    for i in range(len(frame)):
        damaged = bytearray(frame)
        damaged[i] ^= 0x01
        with pytest.raises(ki.IntegrityError):
            ki.open_frame(k, damaged)


def test_a_chunk_under_another_key_is_rejected():
    """Another tenant's (or another prefix's) entry copied under this key does not verify."""
    frame = ki.seal(key(tenant="aaaa").to_string(), tensor_obj())
    with pytest.raises(ki.IntegrityError) as err:
        ki.open_frame(key(tenant="bbbb").to_string(), frame)
    assert err.value.reason == ki.MISMATCH


@pytest.mark.parametrize("cut", [1, 100, None])
def test_short_frames_are_rejected(cut):
    k = key().to_string()
    frame = ki.seal(k, tensor_obj())
    damaged = frame[:6] if cut is None else frame[:-cut]
    with pytest.raises(ki.IntegrityError) as err:
        ki.open_frame(k, damaged)
    assert err.value.reason in (ki.SHORT, ki.MISSING)


def test_an_entry_without_a_checksum_is_rejected_as_missing():
    """What LMCache wrote before Baton checked (the KV bytes alone), or random bytes."""
    k = key().to_string()
    obj = tensor_obj()
    for raw in (bytes(ki._bytes_view(obj.byte_array)), b"", torch.randn(300).numpy().tobytes()):
        with pytest.raises(ki.IntegrityError) as err:
            ki.open_frame(k, raw)
        assert err.value.reason == ki.MISSING


def test_tenant_comes_from_the_key_tag():
    assert ki.tenant_of(key()) == TENANT
    assert ki.tenant_of(key(tenant=None)) == ki.NO_TENANT


# -- through LMCache's cache engine and its real tiers -----------------------------------------------------


def paged_cache(fill: str, num_blocks: int = 12) -> list:
    shape = (num_blocks, HEADS, BLOCK, 2 * HEAD_DIM)
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=gen) if fill == "random" else torch.zeros(shape) for _ in range(LAYERS)]


def slots(first_block: int, n: int) -> torch.Tensor:
    return torch.arange(first_block * BLOCK, first_block * BLOCK + n)


class Engine:
    """An LMCache engine as the vLLM worker builds it on a CPU host (Baton's paged-KV connector)."""

    def __init__(self, tier: str, where: str, *, checked: bool = True, model: str = "m"):
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata

        cfg: dict = {"chunk_size": CHUNK, "local_cpu": False, "max_local_cpu_size": 0.05,
                     "save_unfull_chunk": False, "pre_caching_hash_algorithm": "sha256_cbor", "remote_serde": "naive"}
        if tier == "fs":
            cfg |= {"remote_storage_plugins": ["fs"], "extra_config": {"remote_storage_plugin.fs.base_path": where}}
        elif tier == "disk":
            cfg |= {"local_disk": f"file://{where}", "max_local_disk_size": 0.05}
        else:
            cfg |= {"remote_url": where}
        self.config = LMCacheEngineConfig.from_defaults(**cfg)
        metadata = LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                                   kv_dtype=torch.float32, kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM),
                                   chunk_size=CHUNK)
        self.name = f"baton-test-{uuid.uuid4().hex[:8]}"
        connector = CPUPagedKVConnector(num_layers=LAYERS, hidden_dim_size=HEADS * HEAD_DIM, block_size=BLOCK,
                                        dtype=torch.float32)
        self.engine = LMCacheEngineBuilder.get_or_create(self.name, self.config, metadata, connector,
                                                         lambda t, _src: t, lambda o, _src: o)
        self.engine.post_init()
        self.tiers = ki.install(self.engine) if checked else None

    def close(self) -> None:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder

        sm = self.engine.storage_manager
        for backend in getattr(sm, "storage_backends", {}).values():
            if "redis" in str(getattr(backend, "remote_url", "")):
                # LMCache's RedisConnector.close() waits on its job queue from inside its own event
                # loop and never returns; drop the connection instead (the pool closes with the process).
                backend.connection = None
        LMCacheEngineBuilder.destroy(self.name)

    def keys(self, tokens) -> list[CacheEngineKey]:
        return [k for _, _, k in self.engine.token_database.process_tokens(
            tokens=tokens, request_configs={"lmcache.tag.tenant": TENANT})]

    def store(self, tokens, kv) -> None:
        self.engine.store(tokens, kvcaches=kv, slot_mapping=slots(0, len(tokens)),
                          request_configs={"lmcache.tag.tenant": TENANT})

    def retrieve(self, tokens, kv) -> int:
        mask = self.engine.retrieve(tokens, kvcaches=kv, slot_mapping=slots(6, len(tokens)),
                                    request_configs={"lmcache.tag.tenant": TENANT}, req_id=uuid.uuid4().hex)
        return int(mask.sum())


def wait_for(predicate, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


class Tier:
    """Where a tier keeps a chunk, to damage it behind LMCache's back."""

    def __init__(self, kind: str, tmp_path):
        self.kind = kind
        self.model = f"baton-test-{uuid.uuid4().hex[:8]}"
        self.where = str(tmp_path / kind)
        self.redis = None
        if kind == "redis":
            redis = pytest.importorskip("redis")
            self.redis = redis.Redis.from_url(REDIS_URL)
            try:
                self.redis.ping()
            except redis.RedisError:
                pytest.skip("no Redis at 127.0.0.1:6379")
            self.where = REDIS_URL
        self.engines: list[Engine] = []

    def engine(self, *, checked: bool = True) -> Engine:
        e = Engine(self.kind, self.where, checked=checked, model=self.model)
        self.engines.append(e)
        return e

    def _disk_path(self, engine: Engine, k) -> str:
        backend = engine.engine.storage_manager.storage_backends["LocalDiskBackend"]
        return backend.dict[k].path

    def stored(self, engine: Engine, k) -> bool:
        if self.kind == "redis":
            return bool(self.redis.exists(k.to_string() + "metadata"))
        if self.kind == "fs":
            return (tmp_file := self._fs_path(k)) is not None and tmp_file.exists()
        return k in engine.engine.storage_manager.storage_backends["LocalDiskBackend"].dict

    def _fs_path(self, k):
        from pathlib import Path

        return Path(self.where) / (k.to_string().replace("/", "-SEP-") + ".data")

    def flip_byte(self, engine: Engine, k, offset_from_end: int = 1000) -> None:
        if self.kind == "redis":
            name = k.to_string() + "kv_bytes"
            value = bytearray(self.redis.get(name))
            value[-offset_from_end] ^= 0x01
            self.redis.set(name, bytes(value))
            return
        path = self._fs_path(k) if self.kind == "fs" else self._disk_path(engine, k)
        with open(path, "r+b") as f:
            f.seek(-offset_from_end, 2)
            byte = f.read(1)[0]
            f.seek(-offset_from_end, 2)
            f.write(bytes([byte ^ 0x01]))

    def close(self) -> None:
        for e in self.engines:
            e.close()
        if self.redis is not None:
            for name in self.redis.scan_iter(match=f"{self.model}@*"):
                self.redis.delete(name)


@pytest.fixture(params=["fs", "disk", "redis"])
def tier(request, tmp_path):
    t = Tier(request.param, tmp_path)
    yield t
    t.close()


def test_intact_chunks_load(tier):
    tokens = torch.arange(600)
    src = paged_cache("random")
    writer = tier.engine()
    assert writer.tiers == [{"fs": "fs", "disk": "disk", "redis": "redis"}[tier.kind]]
    writer.store(tokens, src)
    wait_for(lambda: all(tier.stored(writer, k) for k in writer.keys(tokens)))
    reader = writer if tier.kind == "disk" else tier.engine()  # the disk tier's index is per process
    dst = paged_cache("zeros")
    assert reader.retrieve(tokens, dst) == 2 * CHUNK
    for layer in range(LAYERS):
        assert torch.equal(dst[layer][6:10], src[layer][0:4])


def test_a_one_byte_change_makes_that_chunk_a_miss_and_is_counted(tier):
    tokens = torch.arange(600)
    src = paged_cache("random")
    writer = tier.engine()
    writer.store(tokens, src)
    first, second = writer.keys(tokens)
    wait_for(lambda: tier.stored(writer, first) and tier.stored(writer, second))
    tier.flip_byte(writer, second)
    before = ki.failure_totals()

    reader = writer if tier.kind == "disk" else tier.engine()
    dst = paged_cache("zeros")
    # LMCache retrieves the prefix that verified: the first chunk; vLLM recomputes the rest.
    assert reader.retrieve(tokens, dst) == CHUNK
    for layer in range(LAYERS):
        assert torch.equal(dst[layer][6:8], src[layer][0:2])
        assert not dst[layer][8:10].any()  # the damaged chunk's blocks were never written

    after = ki.failure_totals()
    k = (tier.kind, TENANT, ki.MISMATCH)
    assert after.get(k, 0) - before.get(k, 0) == 1
    # The damaged entry is gone from the tier (the recomputed KV can be stored again); the good one stays.
    wait_for(lambda: not tier.stored(writer, second))
    assert tier.stored(writer, first)


@pytest.mark.parametrize("kind", ["fs", "redis"])
def test_frame_buffers_written_once_are_reused_without_mixing_chunks(kind, tmp_path):
    t = Tier(kind, tmp_path)
    try:
        writer = t.engine()
        conn = next(b.connection for b in writer.engine.storage_manager.storage_backends.values()
                    if isinstance(getattr(b, "connection", None), ki.ChecksummedRemoteConnector))
        first, second = torch.arange(600), torch.arange(1000, 1600)
        src_first, src_second = paged_cache("random"), [torch.randn_like(c) for c in paged_cache("zeros")]
        writer.store(first, src_first)
        wait_for(lambda: all(t.stored(writer, k) for k in writer.keys(first)))
        # the written frames' buffers are kept (once each put has returned, a moment after its key is visible) ...
        wait_for(lambda: bool(conn._spare))
        writer.store(second, src_second)  # ... and written into again
        wait_for(lambda: all(t.stored(writer, k) for k in writer.keys(second)))
        reader = t.engine()
        for tokens, src in ((first, src_first), (second, src_second)):
            dst = paged_cache("zeros")
            assert reader.retrieve(tokens, dst) == 2 * CHUNK
            for layer in range(LAYERS):
                assert torch.equal(dst[layer][6:10], src[layer][0:4])
    finally:
        t.close()


def test_without_the_check_the_damaged_chunk_would_be_loaded(tmp_path):
    """The control: LMCache alone loads the changed bytes into the engine's KV cache."""
    t = Tier("fs", tmp_path)
    try:
        tokens = torch.arange(600)
        src = paged_cache("random")
        writer = t.engine(checked=False)
        writer.store(tokens, src)
        _first, second = writer.keys(tokens)
        wait_for(lambda: t.stored(writer, second))
        t.flip_byte(writer, second)
        dst = paged_cache("zeros")
        assert t.engine(checked=False).retrieve(tokens, dst) == 2 * CHUNK
        assert any(not torch.equal(dst[layer][8:10], src[layer][2:4]) for layer in range(LAYERS))
    finally:
        t.close()


@pytest.mark.parametrize("kind", ["fs", "redis"])
def test_entries_written_without_a_checksum_are_misses(kind, tmp_path):
    t = Tier(kind, tmp_path)
    try:
        tokens = torch.arange(600)
        legacy = t.engine(checked=False)
        legacy.store(tokens, paged_cache("random"))
        wait_for(lambda: all(t.stored(legacy, k) for k in legacy.keys(tokens)))
        before = ki.failure_totals()
        assert t.engine().retrieve(tokens, paged_cache("zeros")) == 0
        k = (kind, TENANT, ki.MISSING)
        assert ki.failure_totals().get(k, 0) - before.get(k, 0) >= 1
    finally:
        t.close()


def test_a_reconnected_remote_tier_is_still_checked(tmp_path):
    t = Tier("fs", tmp_path)
    try:
        e = t.engine()
        backend = e.engine.storage_manager.storage_backends["RemoteBackend-fs"]
        backend.connection = None  # as after a lost connection; LMCache's health monitor reconnects
        backend.init_connection()
        assert isinstance(backend.connection, ki.ChecksummedRemoteConnector)
    finally:
        t.close()


# -- counting: vLLM connector stats and the exported counter ---------------------------------------------


def test_failures_drain_once():
    ki.drain_failures()
    ki.record_failure("redis", key(), ki.MISMATCH)
    ki.record_failure("redis", key(), ki.MISMATCH)
    ki.record_failure("fs", key(tenant=None), ki.MISSING)
    rows = sorted(ki.drain_failures())
    assert rows == [["fs", ki.NO_TENANT, ki.MISSING, 1], ["redis", TENANT, ki.MISMATCH, 2]]
    assert ki.drain_failures() == []


def test_the_warning_names_tier_and_tenant_but_no_kv(caplog):
    obj = tensor_obj()
    frame = ki.seal(key().to_string(), obj)
    frame[-1] ^= 1
    conn = ki.ChecksummedRemoteConnector(SimpleNamespace(), tier="redis", allocator=None)
    with caplog.at_level("WARNING", logger="baton.dataplane.kv_integrity"):
        assert conn._open(key(), ki.FrameMemoryObj(frame)) is None
    text = caplog.text
    assert "tier=redis" in text and f"tenant_tag={TENANT}" in text and "reason=mismatch" in text
    assert str(float(obj.tensor.flatten()[0])) not in text


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


@needs_vllm
def test_stats_cross_processes_as_plain_rows_and_aggregate():
    from baton.dataplane.kv_connector import BatonLMCacheConnectorV1, KVIntegrityStats

    a = KVIntegrityStats(data={"integrity_failures": [["redis", "t1", "mismatch", 2]]})
    b = BatonLMCacheConnectorV1.build_kv_connector_stats(data={"integrity_failures": [["redis", "t1", "mismatch", 1],
                                                                                       ["fs", "t2", "missing", 1]]})
    merged = a.aggregate(b)
    rows = sorted(merged.to_dict()["integrity_failures"])
    assert rows == [["fs", "t2", "missing", 1], ["redis", "t1", "mismatch", 3]]
    assert merged.reduce() == {"kv_integrity_failures": 4}
    assert not merged.is_empty()
    merged.reset()
    assert merged.is_empty()


@needs_vllm
def test_only_the_worker_half_hands_out_failures():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from baton.dataplane.kv_connector import BatonLMCacheConnectorV1

    ki.drain_failures()
    ki.record_failure("redis", key(), ki.MISMATCH)
    scheduler = SimpleNamespace(role=KVConnectorRole.SCHEDULER)
    worker = SimpleNamespace(role=KVConnectorRole.WORKER)
    assert BatonLMCacheConnectorV1.get_kv_connector_stats(scheduler) is None
    stats = BatonLMCacheConnectorV1.get_kv_connector_stats(worker)
    assert stats is not None and stats.data == {"integrity_failures": [["redis", TENANT, ki.MISMATCH, 1]]}
    assert BatonLMCacheConnectorV1.get_kv_connector_stats(worker) is None


@needs_vllm
def test_the_counter_is_exported_per_tier_and_tenant():
    from functools import partial

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from baton.dataplane.kv_connector import BatonLMCacheConnectorV1

    registry = CollectorRegistry()
    types = {Counter: partial(Counter, registry=registry), Gauge: partial(Gauge, registry=registry),
             Histogram: partial(Histogram, registry=registry)}
    vllm_config = SimpleNamespace(kv_transfer_config=None)
    prom = BatonLMCacheConnectorV1.build_prom_metrics(vllm_config, types, ["model_name", "engine"], {0: ["tiny", "0"]})
    prom.observe({"integrity_failures": [["redis", TENANT, "mismatch", 2], ["redis", TENANT, "missing", 1]]}, 0)
    labels = {"model_name": "tiny", "engine": "0", "tier": "redis", "tenant_tag": TENANT}
    assert registry.get_sample_value("baton_kv_integrity_failures_total", labels | {"reason": "mismatch"}) == 2
    assert registry.get_sample_value("baton_kv_integrity_failures_total", labels | {"reason": "missing"}) == 1


@needs_vllm
def test_multiconnector_rebuilds_the_stats_in_the_front_end():
    """vLLM's MultiConnector looks its children up by class name in the front-end process."""
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

    from baton.dataplane.kv_connector import KVIntegrityStats

    stats = MultiConnector.build_kv_connector_stats(
        data={"BatonLMCacheConnectorV1": {"integrity_failures": [["redis", "t", "mismatch", 1]]}})
    assert isinstance(stats.data["BatonLMCacheConnectorV1"], KVIntegrityStats)


@needs_vllm
def test_prefill_stats_count_rolled_back_tokens_as_computed():
    from vllm.v1.metrics.stats import PrefillStats

    from baton.dataplane.kv_connector import correct_prefill_stats

    stats = PrefillStats()
    stats.set(num_prompt_tokens=600, num_local_cached_tokens=0, num_external_cached_tokens=512)
    # vLLM rolled the request back to the first failed block (the second chunk): 256 tokens loaded.
    request = SimpleNamespace(prefill_stats=stats, num_computed_tokens=256, num_preemptions=0)
    assert correct_prefill_stats(request)
    assert (stats.num_external_cached_tokens, stats.num_computed_tokens) == (256, 344)

    request.num_computed_tokens = 0
    assert correct_prefill_stats(request)
    assert (stats.num_external_cached_tokens, stats.num_computed_tokens) == (0, 600)

    ok = PrefillStats()
    ok.set(num_prompt_tokens=600, num_local_cached_tokens=128, num_external_cached_tokens=384)
    assert not correct_prefill_stats(SimpleNamespace(prefill_stats=ok, num_computed_tokens=600, num_preemptions=0))
    assert ok.num_external_cached_tokens == 384
