"""The NIXL progress-thread setting: what reaches NIXL's agent config, and what is left alone."""

from types import SimpleNamespace
from typing import Any

from baton.dataplane import nixl_progress


class _Bind:
    def __init__(self) -> None:
        self.configs: list[Any] = []
        self.DRAM_SEG = "dram"

    def nixlAgent(self, name: str, config: Any) -> str:
        self.configs.append(config)
        return name


def test_agents_created_inside_get_the_delay_and_the_module_is_restored():
    bind = _Bind()
    mod = SimpleNamespace(nixlBind=bind)
    with nixl_progress.progress_wakeup(10, module=mod):
        assert mod.nixlBind.DRAM_SEG == "dram"  # everything else is NIXL's
        mod.nixlBind.nixlAgent("a", SimpleNamespace(pthrDelay=0))
    assert mod.nixlBind is bind
    assert bind.configs[0].pthrDelay == 10_000


def test_none_and_zero_keep_nixl_default():
    bind = _Bind()
    mod = SimpleNamespace(nixlBind=bind)
    for value in (None, 0):
        with nixl_progress.progress_wakeup(value, module=mod):
            assert mod.nixlBind is bind


def test_delay_is_at_least_one_millisecond():
    assert nixl_progress.delay_us(0.2) == 1000
    assert nixl_progress.delay_us(2.5) == 2500
    assert nixl_progress.delay_us(None) == 0


def test_setting_is_read_from_the_connector_extra_config():
    class Cfg:
        def __init__(self, extra: dict[str, Any]) -> None:
            self.extra = extra

        def get_from_extra_config(self, key: str, default: Any) -> Any:
            return self.extra.get(key, default)

    assert nixl_progress.wakeup_ms_of(Cfg({"baton_progress_wakeup_ms": 10})) == 10.0
    assert nixl_progress.wakeup_ms_of(Cfg({})) is None
    assert nixl_progress.wakeup_ms_of(None) is None


def test_only_a_step_that_computes_nothing_and_starts_no_load_pauses():
    def out(tokens: int) -> SimpleNamespace:
        return SimpleNamespace(total_num_scheduled_tokens=tokens)

    assert nixl_progress.empty_step(out(0), SimpleNamespace(reqs_to_recv={}))
    assert not nixl_progress.empty_step(out(0), SimpleNamespace(reqs_to_recv={"r": 1}))  # a load starts now
    assert not nixl_progress.empty_step(out(17), SimpleNamespace(reqs_to_recv={}))


def test_the_pause_comes_from_the_extra_config():
    class Cfg:
        def __init__(self, extra: dict[str, Any]) -> None:
            self.extra = extra

        def get_from_extra_config(self, key: str, default: Any) -> Any:
            return self.extra.get(key, default)

    assert nixl_progress.idle_pause_s(Cfg({"baton_idle_step_pause_ms": 1})) == 0.001
    assert nixl_progress.idle_pause_s(Cfg({})) == 0.0
