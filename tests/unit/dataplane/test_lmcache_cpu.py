"""Op-level layout test of the CPU paged-KV connector: store blocks, load them elsewhere, compare bytes."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmcache")

from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj  # noqa: E402

from baton.dataplane.lmcache_cpu import CPUPagedKVConnector, KVLayoutError  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BLOCK, NUM_BLOCKS = 2, 2, 32, 128, 12


def cpu_kv_cache(fill: str) -> list:
    """vLLM's CPU attention layout: one [num_blocks, kv_heads, block_size, 2*head_dim] tensor per layer."""
    shape = (NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM)
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen) if fill == "random" else torch.zeros(shape) for _ in range(LAYERS)]


def slot_mapping(block_ids: list[int]) -> "torch.Tensor":
    return torch.cat([torch.arange(b * BLOCK, (b + 1) * BLOCK) for b in block_ids])


def memory_obj(connector: CPUPagedKVConnector, tokens: int) -> TensorMemoryObj:
    shape = connector.get_shape(tokens)
    nbytes = shape.numel() * 4
    meta = MemoryObjMetadata(
        shape=shape, dtype=torch.float32, address=0, phy_size=nbytes, ref_count=1, fmt=MemoryFormat.KV_2LTD
    )
    return TensorMemoryObj(torch.empty(nbytes, dtype=torch.uint8), meta, None)


@pytest.fixture
def connector() -> CPUPagedKVConnector:
    return CPUPagedKVConnector(
        num_layers=LAYERS, hidden_dim_size=HEADS * HEAD_DIM, block_size=BLOCK, dtype=torch.float32
    )


def test_shape_matches_lmcache_kv_2ltd(connector):
    assert tuple(connector.get_shape(256)) == (2, LAYERS, 256, HEADS * HEAD_DIM)


def test_store_then_load_moves_whole_blocks_byte_for_byte(connector):
    src, dst = cpu_kv_cache("random"), cpu_kv_cache("zeros")
    src_blocks, dst_blocks = [5, 2, 9, 0], [1, 7, 3, 11]
    chunks = [(0, 256), (256, 512)]
    objs = [memory_obj(connector, 256) for _ in chunks]
    connector.batched_from_gpu(
        objs, [s for s, _ in chunks], [e for _, e in chunks], kvcaches=src, slot_mapping=slot_mapping(src_blocks)
    )
    loader = CPUPagedKVConnector(
        num_layers=LAYERS, hidden_dim_size=HEADS * HEAD_DIM, block_size=BLOCK, dtype=torch.float32
    )
    loader.batched_to_gpu(
        objs, [s for s, _ in chunks], [e for _, e in chunks], kvcaches=dst, slot_mapping=slot_mapping(dst_blocks)
    )
    for layer in range(LAYERS):
        for s, d in zip(src_blocks, dst_blocks, strict=True):
            assert torch.equal(src[layer][s], dst[layer][d])
        untouched = sorted(set(range(NUM_BLOCKS)) - set(dst_blocks))
        assert not dst[layer][untouched].any()


def test_load_leaves_blocks_already_in_vllms_prefix_cache(connector):
    src, dst = cpu_kv_cache("random"), cpu_kv_cache("zeros")
    obj = memory_obj(connector, 256)
    connector.from_gpu(obj, 0, 256, kvcaches=src, slot_mapping=slot_mapping([3, 4]))
    connector.to_gpu(obj, 0, 256, kvcaches=dst, slot_mapping=slot_mapping([6, 8]), vllm_cached_tokens=128)
    for layer in range(LAYERS):
        assert not dst[layer][6].any()  # cached by vLLM: not overwritten
        assert torch.equal(dst[layer][8], src[layer][4])


def test_partial_blocks_are_refused(connector):
    obj = memory_obj(connector, 100)
    with pytest.raises(KVLayoutError):
        connector.from_gpu(obj, 0, 100, kvcaches=cpu_kv_cache("random"), slot_mapping=slot_mapping([0]))


def test_scattered_slots_within_a_block_are_refused(connector):
    slots = slot_mapping([2])
    slots[5] = 7 * BLOCK
    with pytest.raises(KVLayoutError):
        connector.from_gpu(memory_obj(connector, 128), 0, 128, kvcaches=cpu_kv_cache("random"), slot_mapping=slots)
