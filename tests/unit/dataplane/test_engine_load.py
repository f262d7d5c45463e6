"""The engines' load reports (baton.dataplane.engine_load): what a vLLM engine's stat logger writes, when,
and the contract's round trip. That the shipped engines really write them is ``tests/e2e/test_flow_control.py``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from baton.core import contracts as c
from baton.dataplane import engine_load, facts


class FakeRedis:
    """What the writer queues on an asyncio pipeline: each key written and its index entry."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, bytes, int]] = []
        self.index: dict[str, dict[str, float]] = {}

    def pipeline(self, transaction: bool = True) -> FakeRedis:
        return self

    async def __aenter__(self) -> FakeRedis:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: bytes, ex: int) -> None:
        self.sets.append((key, value, ex))

    def zadd(self, index: str, mapping: dict[str, float]) -> None:
        self.index.setdefault(index, {}).update(mapping)

    def zremrangebyscore(self, index: str, low: object, high: object) -> None:
        pass

    async def execute(self) -> list[object]:
        return []


def stats(running: int, waiting: int = 0, kv: float = 0.2) -> Any:
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv)


@pytest.fixture
def redis(monkeypatch: pytest.MonkeyPatch) -> FakeRedis:
    fake = FakeRedis()
    monkeypatch.setattr(facts, "redis_client", lambda: fake)
    return fake


def test_the_contract_round_trips_and_refuses_what_a_writer_never_writes() -> None:
    load = c.EngineLoad(model="tiny", engine="h:1", role="decode", running=2.5, waiting=0.25, kv_usage=0.5,
                        steps=7, at=123.0)
    assert c.parse_engine_load(c.engine_load_message(load)) == load
    for bad in (None, b"", b"[]", b'{"model": "m"}', b'{"model":"m","engine":"e","running":"x","waiting":0,'
                b'"kv_usage":0,"steps":1,"at":1}', b'{"model":"m","engine":"e","running":NaN,"waiting":0,'
                b'"kv_usage":0,"steps":1,"at":1}'):
        assert c.parse_engine_load(bad) is None
    assert c.engine_load_key("tiny", "h:1").startswith(c.ENGINE_LOAD_PREFIX)


def test_a_busy_engine_reports_its_time_weighted_load_at_most_every_interval_and_once_when_idle(redis) -> None:
    now = {"t": 0.0}
    log = engine_load.EngineLoadLogger(SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny")),
                                       role="decode", clock=lambda: now["t"])

    async def steps() -> None:
        log.record(stats(2))  # idle -> busy: reported at once
        # a long decode step of two, then many short steps with four waiting (each count holds until the next)
        for t, running, waiting in ((0.25, 2, 0), (0.375, 0, 4), *((0.375 + i / 64, 0, 4) for i in range(1, 8))):
            now["t"] = t
            log.record(stats(running, waiting, kv=0.3 + 0.1 * running))
        now["t"] = 0.5  # the interval since the first report: this step closes the window
        log.record(stats(0, 4))
        now["t"] = 0.625
        log.record(stats(0, 0))  # busy -> idle: reported at once, long-lived
        log.record(None)  # a step without scheduler stats is not a step
        await asyncio.sleep(0)

    asyncio.run(steps())
    loads = [(c.parse_engine_load(v), ex) for _, v, ex in redis.sets]
    assert [ex for _, ex in loads] == [c.ENGINE_LOAD_BUSY_TTL_S, c.ENGINE_LOAD_BUSY_TTL_S, c.ENGINE_LOAD_IDLE_TTL_S]
    first, window, idle = (x for x, _ in loads)
    assert first is not None and first.running == 2 and first.model == "tiny" and first.role == "decode"
    # 2 running for 0.375 s of 0.5, 4 waiting for the last 0.125 s: 1.5 and 1.0 (a mean over the ten steps
    # would say 0.2 running and 3.6 waiting)
    assert window is not None and (window.running, window.waiting, window.steps) == (1.5, 1.0, 10)
    assert window.kv_usage == pytest.approx(0.5)
    assert idle is not None and idle.running == 0 and idle.waiting == 0 and not idle.busy


def test_nothing_is_written_or_installed_without_a_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(c.ENV_FACTS_REDIS_URL, raising=False)
    manager = SimpleNamespace(stat_loggers=[], engine_indexes=[0])
    assert not engine_load.install(SimpleNamespace(logger_manager=manager, vllm_config=None))
    assert manager.stat_loggers == []


def test_install_adds_one_logger_per_engine_through_vllms_adapter(monkeypatch: pytest.MonkeyPatch, redis) -> None:
    monkeypatch.setenv(c.ENV_FACTS_REDIS_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(c.ENV_ENGINE_ROLE, "prefill")
    manager = SimpleNamespace(stat_loggers=[], engine_indexes=[0])
    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny"))
    assert engine_load.install(SimpleNamespace(logger_manager=manager, vllm_config=config))
    [adapter] = manager.stat_loggers

    async def one() -> None:
        adapter.record(stats(1), None, engine_idx=0)
        await asyncio.sleep(0)

    asyncio.run(one())
    [(key, value, _)] = redis.sets
    load = c.parse_engine_load(value)
    assert load is not None and load.role == "prefill" and key == c.engine_load_key("tiny", load.engine)
    assert list(redis.index[c.ENGINE_LOAD_INDEX]) == [key]  # readers find it through the index
    # an engine that keeps no stats gets nothing
    assert not engine_load.install(SimpleNamespace(logger_manager=None, vllm_config=config))
