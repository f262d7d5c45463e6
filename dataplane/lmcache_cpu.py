"""LMCache's "GPU connector" for vLLM's CPU paged KV cache.

LMCache moves KV between the engine's paged cache and its own memory objects through a
`GPUConnectorInterface`; it ships CUDA/XPU/MUSA/HPU implementations only, so on a CPU engine it stops
with "No supported cpu connector found". This is the CPU implementation.

Design: whole KV blocks are copied as bytes. A memory object of T tokens (T a multiple of the block
size, which Baton's chunk size guarantees) holds, for each layer, the T / block_size blocks that the
slot mapping names, byte for byte as the CPU attention backend laid them out. The bytes are
therefore readable only by engines with the same KV layout (same ISA path, dtype and model shape),
which LMCache's keys already separate by model and world size; nothing depends on how the backend
packs K and V inside a block. The memory object keeps LMCache's logical shape `[2, L, T, H*D]` so
sizes and allocations match the CUDA connector's.

Contract (from `lmcache.v1.gpu_connector.gpu_connectors.GPUConnectorInterface`):
- `from_gpu(memory_obj, start, end, kvcaches=..., slot_mapping=...)`: engine cache -> memory object
  for tokens [start, end) of the request, `slot_mapping` covering the whole token sequence.
- `to_gpu(...)`: memory object -> engine cache; tokens below `vllm_cached_tokens` are already in the
  engine's prefix cache (possibly shared with running requests) and are not overwritten.
- `batched_*`: the same over lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryFormat


class KVLayoutError(RuntimeError):
    """The request's token range does not map onto whole KV blocks."""


class CPUPagedKVConnector(GPUConnectorInterface):  # type: ignore[misc]
    """Copies whole blocks between vLLM's CPU paged KV cache and LMCache memory objects."""

    def __init__(self, *, num_layers: int, hidden_dim_size: int, block_size: int, dtype: torch.dtype):
        self.num_layers = num_layers
        self.hidden_dim_size = hidden_dim_size
        self.block_size = block_size
        self.dtype = dtype
        self.kvcaches: list[torch.Tensor] | None = None
        self._blocks: list[torch.Tensor] | None = None

    @classmethod
    def from_metadata(cls, metadata: Any, *, block_size: int) -> CPUPagedKVConnector:
        num_layers, _, _, num_kv_heads, head_size = metadata.kv_shape
        return cls(
            num_layers=num_layers,
            hidden_dim_size=num_kv_heads * head_size,
            block_size=block_size,
            dtype=metadata.kv_dtype,
        )

    # -- interface ---------------------------------------------------------------------------------

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.num_layers, num_tokens, self.hidden_dim_size])

    def initialize_kvcaches_ptr(self, **kwargs: Any) -> None:
        if "kvcaches" in kwargs and kwargs["kvcaches"] is not self.kvcaches:
            caches = kwargs["kvcaches"]
            if isinstance(caches, Mapping):
                caches = list(caches.values())
            self.kvcaches = list(caches)
            self._blocks = [block_major_bytes(t) for t in self.kvcaches]

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        blocks = self._layer_blocks(kwargs)
        ids = self._block_ids(kwargs, start, end)
        dst = self._memory_blocks(memory_obj, len(ids))
        index = torch.tensor(ids, dtype=torch.long)
        for layer, layer_blocks in enumerate(blocks):
            dst[layer].copy_(layer_blocks.index_select(0, index))
        memory_obj.metadata.fmt = MemoryFormat.KV_2LTD

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        if memory_obj.metadata.fmt != MemoryFormat.KV_2LTD:
            raise ValueError(f"expected a KV_2LTD memory object, got {memory_obj.metadata.fmt}")
        blocks = self._layer_blocks(kwargs)
        ids = self._block_ids(kwargs, start, end)
        src = self._memory_blocks(memory_obj, len(ids))
        # Blocks wholly below vllm_cached_tokens are in vLLM's prefix cache already; leave them.
        cached = int(kwargs.get("vllm_cached_tokens", 0) or 0)
        first = max(0, (cached - start + self.block_size - 1) // self.block_size) if cached > start else 0
        if first >= len(ids):
            return
        index = torch.tensor(ids[first:], dtype=torch.long)
        for layer, layer_blocks in enumerate(blocks):
            layer_blocks.index_copy_(0, index, src[layer, first:])

    def batched_from_gpu(self, memory_objs: Any, starts: Sequence[int], ends: Sequence[int], **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)

    # -- helpers -----------------------------------------------------------------------------------

    def _layer_blocks(self, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
        self.initialize_kvcaches_ptr(**kwargs)
        if self._blocks is None:
            raise ValueError("kvcaches were not provided")
        if len(self._blocks) != self.num_layers:
            raise KVLayoutError(f"{len(self._blocks)} KV cache tensors for {self.num_layers} layers")
        return self._blocks

    def _block_ids(self, kwargs: Mapping[str, Any], start: int, end: int) -> list[int]:
        if "slot_mapping" not in kwargs:
            raise ValueError("'slot_mapping' should be provided in kwargs")
        bs = self.block_size
        if start % bs or (end - start) % bs:
            raise KVLayoutError(f"tokens [{start}, {end}) are not whole blocks of {bs}")
        slots = kwargs["slot_mapping"][start:end].to("cpu", torch.long).view(-1, bs)
        firsts = slots[:, 0]
        if bool((firsts < 0).any()) or bool((firsts % bs).ne(0).any()):
            raise KVLayoutError("slot mapping does not start each block at a block boundary")
        expected = firsts.unsqueeze(1) + torch.arange(bs)
        if not torch.equal(slots, expected):
            raise KVLayoutError("slot mapping is not contiguous within a block")
        ids: list[int] = (firsts // bs).tolist()
        return ids

    def _memory_blocks(self, memory_obj: Any, n_blocks: int) -> torch.Tensor:
        """The memory object's bytes viewed as [layers, blocks, bytes per block per layer]."""
        raw = memory_obj.tensor
        if raw is None:
            raise ValueError("memory object has no tensor")
        flat = raw.reshape(-1).view(torch.uint8)
        blocks: torch.Tensor = flat.view(self.num_layers, n_blocks, -1)
        return blocks


def block_major_bytes(layer_cache: torch.Tensor) -> torch.Tensor:
    """A layer's KV cache as a [num_blocks, bytes per block] uint8 view of its storage.

    The CPU backend allocates each layer block-major (`[num_blocks, kv_heads, block_size, 2*head_dim]`
    physically); a logical view with permuted dims is put back in physical order first.
    """
    t = layer_cache
    if not t.is_contiguous():
        order = sorted(range(t.dim()), key=t.stride, reverse=True)
        t = t.permute(*order)
        if not t.is_contiguous():
            raise KVLayoutError(f"KV cache tensor of shape {tuple(layer_cache.shape)} is not dense")
    blocks: torch.Tensor = t.view(torch.uint8).view(t.shape[0], -1)
    return blocks
