"""What happens to a P/D request's KV when its load fails, and when its client goes away.

One P/D deployment of the tiny model whose NIXL connector is :mod:`baton.bench.chaos.kv_faults` (Baton's
traced connector plus a fault switch; with the switch off it is exactly the production connector).

- KV that fails to load is recomputed, never decoded on (vLLM's ``kv_load_failure_policy: recompute``):
  after each read the decode engine overwrites the blocks it received, and either reports the load as
  failed (what NIXL does for a missing or partial read) or says nothing. Greedy outputs are compared with
  the same deployment's undisturbed run: unreported damage changes them (the damage is real), reported
  damage does not (the engine dropped the blocks and recomputed the prompt). Prefix caching is off so
  that every request really reads its KV over NIXL.
- A cancelled stream frees its work on both sides: the decode engine stops generating, and no KV stays
  pinned on the prefill engine for a decode side that will never read it (NIXL's lease runs out).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from baton.dataplane import render
from baton.dataplane.spec import DeploymentSpec
from tests.engine_slots import slots_fixture

from .conftest import NIXL_PORT_BASE, completion
from .test_pd_serving import token_prompt

pytestmark = pytest.mark.e2e

APP = "tiny-kv-life"
PROMPTS = [token_prompt(n, seed=3000 + n) for n in (200, 450, 900)]
RUNNING = "ray_vllm_num_requests_running"
KV_USAGE = "ray_vllm_kv_cache_usage_perc"
GENERATED = "ray_vllm_generation_tokens_total"
LEASE_S = 30  # vLLM's NIXL KV lease on the prefill side (kv_lease_duration)


engine_room = slots_fixture(2)  # a P/D app of its own beside the shared stack (tests/engine_slots.py)


@pytest.fixture(scope="module")
def deployment(engine_room: float, serve_cluster, tiny_model,  # type: ignore[no-untyped-def]
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from baton.bench.chaos.kv_faults import CONTROL_ENV, MODULE

    control = tmp_path_factory.mktemp("kv-faults") / "mode"
    control.write_text("off")
    spec = DeploymentSpec(
        name=APP,
        model={"path": str(tiny_model), "served_name": "tiny"},
        mode="pd",
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 4, "enable_prefix_caching": False},
        kv={"connector": "nixl", "nixl_port_base": NIXL_PORT_BASE},
        env={CONTROL_ENV: str(control)},
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "NIXL_CONNECTOR_MODULE", MODULE)
        assert render.engine_kwargs(spec, "decode")["kv_transfer_config"]["kv_connector_module_path"] == MODULE
        url = serve_cluster.deploy(spec)  # the app is built (and its configs rendered) here
    try:
        yield url, control
    finally:
        control.write_text("off")
        serve_cluster.delete(APP)


def _outputs(url: str) -> list[str]:
    return [completion(url, p, max_tokens=16)["choices"][0]["text"] for p in PROMPTS]


def _fired(log: Path, mode: str) -> list[dict]:
    if not log.exists():
        return []
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["mode"] == mode]


def test_reported_kv_load_failures_recompute_and_unreported_damage_would_show(deployment) -> None:
    url, control = deployment
    log = Path(f"{control}.log")
    assert render.KV_LOAD_FAILURE_POLICY == "recompute"

    baseline = _outputs(url)
    assert not log.exists()  # "off" touches nothing

    control.write_text("silent")
    damaged = _outputs(url)
    assert len(_fired(log, "silent")) == len(PROMPTS)
    assert damaged != baseline, "overwriting the received KV must change greedy outputs"
    differ = sum(a != b for a, b in zip(damaged, baseline, strict=True))
    print(f"unreported damage: {differ} of {len(PROMPTS)} outputs differ")

    control.write_text("reported")
    recovered = _outputs(url)
    control.write_text("off")
    fired = _fired(log, "reported")
    assert len(fired) == len(PROMPTS) and all(e["blocks"] > 0 and e["layers"] > 0 for e in fired)
    # the same damage, reported: the engine threw the blocks away and recomputed the prompt
    assert recovered == baseline


def _stream(url: str, prompt: list[int], max_tokens: int, *, chunks: int, timeout_s: float | None = None) -> int:
    """Start a streamed completion and hang up after `chunks` SSE events (or when `timeout_s` runs out)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    seen = 0
    try:
        with httpx.stream("POST", f"{url}/completions", json=body, timeout=timeout_s or 300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    seen += 1
                    if seen >= chunks:
                        return seen
    except httpx.TimeoutException:
        pass
    return seen


def _last_reported(cluster, sides: dict[str, set[str]], timeout_s: float) -> dict[str, dict[str, float]]:
    """The last value of each side's running-requests and KV-usage gauges that Ray exported, polled until
    every side's last values are 0 or the time runs out; a gauge never seen is absent from the result."""
    last: dict[str, dict[str, float]] = {side: {} for side in sides}
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = cluster.metrics()
        for side, ids in sides.items():
            for name in (RUNNING, KV_USAGE):
                values = [m.value for m in metrics if m.name == name and m.labels.get("ReplicaId") in ids]
                if values:
                    last[side][name] = sum(values)
        if all(v.get(RUNNING) == 0 and v.get(KV_USAGE) == 0 for v in last.values()) or time.monotonic() > deadline:
            return last
        time.sleep(0.5)


def test_a_cancelled_stream_frees_its_work_on_both_sides(deployment, serve_cluster) -> None:
    url, _ = deployment
    prefill = serve_cluster.replica_ids(APP + ".prefill", "Prefill:tiny")
    decode = serve_cluster.replica_ids(APP, "Decode:tiny")
    max_tokens = 1000

    # mid-decode: the client hangs up after a few tokens; the decode engine stops generating. Three
    # hang-ups at different points: a cancellation lost only sometimes (a stream left for the garbage
    # collector to close, which ran on to max_tokens) must not pass on one lucky try.
    ran = []
    for i, chunks in enumerate((3, 8, 13)):
        generated_before = serve_cluster.settled(GENERATED, ReplicaId=decode)
        assert _stream(url, token_prompt(700, seed=41 + i), max_tokens, chunks=chunks) == chunks
        assert serve_cluster.wait_metric(RUNNING, lambda v: v == 0, timeout_s=60, ReplicaId=decode) == 0
        ran.append(serve_cluster.settled(GENERATED, ReplicaId=decode) - generated_before)
    print(f"hang-ups after 3, 8 and 13 chunks: the decode engine generated {ran} of {max_tokens} tokens")
    assert all(0 < n < max_tokens / 2 for n in ran), ran

    # before the first token: the client hangs up while the prompt is prefilled or its KV is on the way.
    for i, wait_s in enumerate((0.05, 0.3, 1.0)):
        _stream(url, token_prompt(900, seed=50 + i), max_tokens, chunks=1, timeout_s=wait_s)

    # nothing stays pinned: within NIXL's lease both engines hold no KV and run nothing. Ray drops a gauge's
    # series ~2 export intervals after the engine last set it, and an idle vLLM engine sets none, so an
    # absent series would read as 0: a short request makes both engines report, and the last value each
    # engine exported is what counts (a leaked block keeps it above 0: the engine reports nothing lower).
    start = time.monotonic()
    assert completion(url, token_prompt(40, seed=59), max_tokens=2)["usage"]["completion_tokens"] == 2
    last = _last_reported(serve_cluster, {"prefill": prefill, "decode": decode}, timeout_s=LEASE_S + 60)
    for side in ("prefill", "decode"):
        assert last[side].get(RUNNING) == 0 and last[side].get(KV_USAGE) == 0, f"{side} still holds work: {last}"
    print(f"both engines free of KV {time.monotonic() - start:.1f} s after the hang-ups (last reported: {last})")
    # and the deployment still serves
    assert completion(url, token_prompt(300, seed=60), max_tokens=8)["usage"]["completion_tokens"] == 8
