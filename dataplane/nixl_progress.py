"""How NIXL's UCX progress thread waits: on UCX's wake-up fds, or by busy-polling.

NIXL's UCX backend runs one shared progress thread per agent: it progresses every UCX worker, arms
them, then ``poll()``s their event fds with a timeout of the agent's ``pthrDelay``. NIXL's Python API
(``nixl_agent``, which vLLM's NixlConnector uses) always sets ``pthrDelay = 0``: the thread never
sleeps, ``poll(fds, 2, 0)`` in a loop, a whole core per engine while nothing happens. That is NIXL's
choice for RDMA NICs (completion latency in microseconds, cores to spare); on a CPU host it takes the
cores the engines and everything else need.

:func:`progress_wakeup` makes the agents created inside it wait in ``poll()`` for UCX's events, with a
periodic wake-up every ``wakeup_ms`` as NIXL's own safety net for an event that never fires
(``nixlUcxSharedThread``). Transfers complete on the events, not on the period: the period bounds the
stall of a lost event, and costs one progress pass per period when idle.

This is the one place Baton reaches into NIXL's Python API: for the duration of the block, the
bindings module ``nixl_agent.__init__`` uses is replaced by a proxy whose ``nixlAgent`` constructor
applies the delay to the config NIXL built. Nothing else of NIXL changes. ``None`` (and 0) keep NIXL's
own behaviour. ``tests/integration/dataplane/test_nixl_progress.py`` checks it against the real NIXL: a
pair of agents reads KV correctly and their progress threads sleep between events.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

#: Extra-config key of the NixlConnector (``kv_connector_extra_config``) that carries the setting.
EXTRA_CONFIG_KEY = "baton_progress_wakeup_ms"

_lock = threading.RLock()


class _Bindings:
    """NIXL's bindings module, except that ``nixlAgent(name, config)`` gets the delay."""

    def __init__(self, real: Any, delay_us: int) -> None:
        self._real = real
        self._delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # NIXL's name
        config.pthrDelay = self._delay_us
        return self._real.nixlAgent(name, config)


def delay_us(wakeup_ms: float | None) -> int:
    """NIXL's ``pthrDelay`` (microseconds) for a wake-up period; 0 is NIXL's busy-poll."""
    if wakeup_ms is None or wakeup_ms <= 0:
        return 0
    return max(round(wakeup_ms * 1000), 1000)  # NIXL rounds to whole ms: at least 1 ms


def api_module() -> Any:
    """The module whose ``nixl_agent`` vLLM instantiates (``nixl_cu13._api`` or its sibling)."""
    from vllm.distributed.nixl_utils import NixlWrapper

    if NixlWrapper is None:
        raise RuntimeError("NIXL is not available")
    return sys.modules[NixlWrapper.__module__]


@contextlib.contextmanager
def progress_wakeup(wakeup_ms: float | None, *, module: Any = None) -> Iterator[None]:
    """NIXL agents created inside this block wait on UCX events, waking every ``wakeup_ms`` at most."""
    us = delay_us(wakeup_ms)
    if us == 0:
        yield
        return
    mod = module if module is not None else api_module()
    with _lock:
        real = mod.nixlBind
        mod.nixlBind = _Bindings(real, us)
        try:
            yield
        finally:
            mod.nixlBind = real


def wakeup_ms_of(kv_transfer_config: Any) -> float | None:
    """The setting from a vLLM ``KVTransferConfig`` (``None`` when the spec left NIXL's default)."""
    try:
        value = kv_transfer_config.get_from_extra_config(EXTRA_CONFIG_KEY, None)
        return None if value is None else float(value)
    except (AttributeError, TypeError, ValueError):
        return None
