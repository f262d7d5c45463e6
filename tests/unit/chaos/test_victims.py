"""A replica fault's victim is a replica whose engine reports a request, read from the engines' own gauges
(``ray_vllm_num_requests_running``/``_waiting`` by ``ReplicaId``); an idle replica is never picked while a
busy one exists, and a pick the metrics could not back says so."""

from __future__ import annotations

import asyncio
import random

from baton.bench.chaos.faults import Replica, replica_id_in
from baton.bench.chaos.victims import (
    EngineLoad,
    RayMetricsAgent,
    choose_victim,
    metrics_urls_from_nodes,
    parse_engine_loads,
    wait_for_busy_victim,
)

PAGE = """\
# HELP ray_vllm_num_requests_running Number of requests in model execution batches.
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{Component="core_worker",ReplicaId="dec1",engine="0",model_name="tiny"} 2.0
ray_vllm_num_requests_running{Component="core_worker",ReplicaId="dec2",engine="0",model_name="tiny"} 0.0
ray_vllm_num_requests_running{Component="core_worker",ReplicaId="pre1",engine="0",model_name="tiny"} 0.0
# TYPE ray_vllm_num_requests_waiting gauge
ray_vllm_num_requests_waiting{Component="core_worker",ReplicaId="pre1",engine="0",model_name="tiny"} 1.0
ray_vllm_num_requests_waiting{Component="core_worker",ReplicaId="",engine="0",model_name="tiny"} 5.0
ray_vllm_num_requests_running_other{ReplicaId="dec2"} 9.0
ray_vllm_generation_tokens_total{ReplicaId="dec2"} 100.0
"""


def rep(pid: int, rid: str, pool="decode", engine=True) -> Replica:
    return Replica(pool, f"{pool.title()}:tiny", pid, children=(pid + 1,) if engine else (), replica_id=rid)


class FakeMetrics:
    """Answers the given loads in turn (the last one repeats); None: unreadable."""

    def __init__(self, *answers: dict[str, EngineLoad] | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def loads(self) -> dict[str, EngineLoad] | None:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def listing(*reps: Replica):  # type: ignore[no-untyped-def]
    async def replicas() -> list[Replica]:
        return list(reps)
    return replicas


def test_the_gauges_are_read_per_replica_id():
    loads = parse_engine_loads(PAGE)
    assert loads == {"dec1": EngineLoad(2.0, 0.0), "dec2": EngineLoad(0.0, 0.0), "pre1": EngineLoad(0.0, 1.0)}
    assert loads["dec1"].busy("decode") and not loads["dec2"].busy("decode")
    # a request waiting counts on a prefill engine (a prefill queued or in progress), not on a decode one
    assert loads["pre1"].busy("prefill") and not loads["pre1"].busy("decode")


def test_a_busy_replica_is_chosen_never_the_idle_one():
    reps = [rep(10, "dec1"), rep(20, "dec2")]
    loads = {"dec1": EngineLoad(0, 0), "dec2": EngineLoad(1, 0)}
    for seed in range(20):
        choice = choose_victim("decode", reps, loads, random.Random(seed))
        assert choice is not None and choice.replica.pid == 20 and choice.busy is True
    assert "running requests on victim: 1 from metrics" in choice.evidence
    assert choose_victim("decode", reps, {"dec1": EngineLoad(0, 0), "dec2": EngineLoad(0, 3)},
                         random.Random(0)) is None


def test_a_replica_without_an_engine_process_is_not_a_victim():
    starting, serving = rep(10, "dec1", engine=False), rep(20, "dec2")
    loads = {"dec1": EngineLoad(4, 0), "dec2": EngineLoad(0, 0)}
    assert choose_victim("decode", [starting, serving], loads, random.Random(0)) is None


def test_the_wait_fires_as_soon_as_a_replica_reports_a_request():
    reps = [rep(10, "pre1", "prefill"), rep(20, "pre2", "prefill")]
    idle = {"pre1": EngineLoad(), "pre2": EngineLoad()}
    metrics = FakeMetrics(idle, idle, {"pre1": EngineLoad(), "pre2": EngineLoad(0, 1)})
    choice = run(wait_for_busy_victim("prefill", listing(*reps), metrics, random.Random(0), timeout_s=5,
                                      poll_s=0.01))
    assert choice is not None and choice.busy is True and choice.replica.pid == 20
    assert choice.load == EngineLoad(0, 1) and metrics.calls == 3


def test_when_no_replica_gets_busy_the_pick_says_it_was_idle():
    reps = [rep(10, "dec1"), rep(20, "dec2")]
    metrics = FakeMetrics({"dec1": EngineLoad(), "dec2": EngineLoad()})
    choice = run(wait_for_busy_victim("decode", listing(*reps), metrics, random.Random(0), timeout_s=0.1,
                                      poll_s=0.01))
    assert choice is not None and choice.busy is False and "within 0.1 s" in choice.evidence
    assert metrics.calls > 1


def test_unreadable_metrics_make_the_victim_unknown():
    reps = [rep(10, "dec1"), rep(20, "dec2")]
    metrics = FakeMetrics(None)
    choice = run(wait_for_busy_victim("decode", listing(*reps), metrics, random.Random(0), timeout_s=5,
                                      poll_s=0.01, unreadable_grace_s=0.05))
    assert choice is not None and choice.busy == "unknown" and "unreachable" in choice.evidence
    # readable once, not busy, unreadable afterwards: it was seen idle
    metrics = FakeMetrics({"dec1": EngineLoad(), "dec2": EngineLoad()}, None)
    choice = run(wait_for_busy_victim("decode", listing(*reps), metrics, random.Random(0), timeout_s=0.1,
                                      poll_s=0.01, unreadable_grace_s=0.05))
    assert choice is not None and choice.busy is False


def test_replicas_without_a_known_id_make_the_victim_unknown_at_once():
    reps = [rep(10, ""), rep(20, "")]
    metrics = FakeMetrics({"dec1": EngineLoad(3, 0)})
    choice = run(wait_for_busy_victim("decode", listing(*reps), metrics, random.Random(0), timeout_s=5,
                                      poll_s=0.01))
    assert choice is not None and choice.busy == "unknown" and "ids unknown" in choice.evidence
    assert metrics.calls == 1


def test_no_replica_at_all_is_no_choice():
    assert run(wait_for_busy_victim("decode", listing(), FakeMetrics({}), random.Random(0), timeout_s=0.05,
                                    poll_s=0.01)) is None


def test_the_replica_id_comes_from_the_actor_name_or_the_process_title():
    assert replica_id_in("SERVE_REPLICA::chaos-1a#Decode:tiny-chaos#k2j4h5g6", "chaos-1a") == "k2j4h5g6"
    title = "ray::SERVE_REPLICA::chaos-1a#Prefill:tiny-chaos#abc123:ServeReplica:chaos-1a:Prefill:tiny-chaos.x"
    assert replica_id_in(title, "chaos-1a") == "abc123"
    assert replica_id_in("SERVE_REPLICA::other#Decode:tiny-chaos#abc", "chaos-1a") == ""
    assert replica_id_in("ray::ServeReplica:chaos-1a:Decode:tiny-chaos", "chaos-1a") == ""


def test_metrics_agents_are_found_from_the_dashboards_node_table():
    payload = {"data": {"summary": [
        {"raylet": {"nodeManagerAddress": "127.0.0.1", "metricsExportPort": 51234, "state": "ALIVE"}},
        {"raylet": {"nodeManagerAddress": "10.0.0.2", "metricsExportPort": 40000, "state": "DEAD"}},
        {"raylet": {"nodeManagerAddress": "10.0.0.3"}},
    ]}}
    assert metrics_urls_from_nodes(payload) == ["http://127.0.0.1:51234/metrics"]
    assert metrics_urls_from_nodes({}) == [] and metrics_urls_from_nodes(None) == []


def test_an_agent_that_cannot_be_reached_reads_as_unreadable():
    assert RayMetricsAgent().loads() is None  # nothing to read
    assert RayMetricsAgent(["http://127.0.0.1:9/metrics"], timeout_s=0.5).loads() is None


def test_a_busy_replica_is_taken_only_while_the_caller_wants_it():
    reps = [rep(10, "pre1", "prefill")]
    metrics = FakeMetrics({"pre1": EngineLoad(1, 0)})
    wanted = iter([False, False, True])
    choice = run(wait_for_busy_victim("prefill", listing(*reps), metrics, random.Random(0), timeout_s=5,
                                      poll_s=0.01, accept=lambda: next(wanted)))
    assert choice is not None and choice.busy is True and metrics.calls == 3
    choice = run(wait_for_busy_victim("prefill", listing(*reps), metrics, random.Random(0), timeout_s=0.1,
                                      poll_s=0.01, accept=lambda: False))
    assert choice is not None and choice.busy is False and "when wanted" in choice.evidence
