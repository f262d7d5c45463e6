"""KV load faults: Baton's NIXL connector that damages the KV a decode engine has just pulled.

A drill or test loads it in place of :mod:`baton.dataplane.kv_trace` (``kv_connector_module_path:
baton.bench.chaos.kv_faults``, same class name, on both pools so their NIXL compatibility hashes
match). The decode engine reads the fault to inject from a control file named by
``BATON_CHAOS_KV_FAULT_FILE`` in its environment, at each finished KV read, so one deployment can run
an undisturbed baseline and then each fault:

- ``off`` (or no file): nothing; the connector is Baton's traced NIXL connector.
- ``reported``: overwrite every block the read wrote, then report the load as failed, exactly as vLLM's
  NIXL worker reports a failed or partial read (the request in ``failed_recving``, its blocks in the
  load-error set). Under ``kv_load_failure_policy: recompute`` the engine must recompute the prompt
  and answer as if nothing happened.
- ``silent``: the same damage, not reported: the engine decodes on wrong KV. This is the control that
  shows the damage changes the output, so a test of ``reported`` can fail.

Each damaged request appends a JSON line (mode, request id, blocks) to ``<control file>.log``, so the
caller can check that the fault really fired.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from baton.dataplane.kv_trace import NixlConnector as _TracedNixlConnector

log = logging.getLogger(__name__)

MODULE = __name__  # what `kv_connector_module_path` names
CONTROL_ENV = "BATON_CHAOS_KV_FAULT_FILE"
MODES = ("off", "reported", "silent")
GARBAGE = 7.0  # every K and V element of a damaged block: uniform attention, a constant value


def read_mode(path: str | None) -> str:
    """The fault the control file asks for; ``off`` when there is none or it is unreadable."""
    if not path:
        return "off"
    try:
        with open(path, encoding="utf-8") as f:
            mode = f.read().strip()
    except OSError:
        return "off"
    return mode if mode in MODES else "off"


def damage_blocks(caches: dict[str, Any], block_ids: list[int], num_blocks: int) -> int:
    """Overwrite the given blocks of every layer's KV cache; return how many layers were hit.

    The block axis is the one sized ``num_blocks`` (the first, for vLLM's CPU and GPU layouts)."""
    if not block_ids:
        return 0
    import torch

    hit = 0
    for cache in caches.values():
        tensors = cache if isinstance(cache, list | tuple) else (cache,)
        for tensor in tensors:
            dim = next((d for d, size in enumerate(tensor.shape) if size == num_blocks), 0)
            index = torch.tensor(block_ids, dtype=torch.long, device=tensor.device)
            tensor.index_fill_(dim, index, GARBAGE)
            hit += 1
    return hit


class NixlConnector(_TracedNixlConnector):
    """Baton's traced NIXL connector with KV load faults on the receiving (decode) side."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._fault_file = os.environ.get(CONTROL_ENV)
        worker = getattr(self, "connector_worker", None)
        if worker is not None and self._fault_file:
            original = worker.get_transfer_results

            def get_transfer_results() -> Any:
                pending = dict(getattr(worker, "_recving_metadata", {}))  # popped by the call below
                results = original()
                try:
                    self._inject(worker, pending, results)
                except Exception:
                    log.exception("KV fault injection failed")
                return results

            worker.get_transfer_results = get_transfer_results

    def _inject(self, worker: Any, pending: dict[str, Any], results: Any) -> None:
        done = [r for r in results.finished_recving if r not in results.failed_recving and r in pending]
        if not done:
            return
        mode = read_mode(self._fault_file)
        if mode == "off":
            return
        for req_id in done:
            meta = pending[req_id]
            groups = getattr(meta, "local_physical_block_ids", None) or meta.local_block_ids
            blocks = [int(b) for b in groups[0]]
            layers = damage_blocks(worker.device_kv_caches, blocks, int(worker.num_blocks))
            if mode == "reported":
                results.failed_recving.add(req_id)
                worker._invalid_block_ids.put(set(int(b) for b in meta.local_block_ids[0]))
            log.warning("KV fault %s: request %s, %d blocks damaged in %d layers", mode, req_id, len(blocks), layers)
            entry = {"mode": mode, "request_id": req_id, "blocks": len(blocks), "layers": layers}
            with open(f"{self._fault_file}.log", "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
