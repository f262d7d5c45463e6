"""How a NIXL engine waits: its UCX progress thread, and its engine loop while KV is held or awaited.

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

The engine loop has a busy wait of its own in P/D: vLLM keeps stepping an engine, with nothing to
compute, for as long as a finished request's KV is pinned for the decode side (prefill) or a request
waits for its KV (decode), so that it sees the "read done" notification or the finished transfer at
once. On a GPU host an empty step is cheap against a core's worth of spare capacity; on a CPU host it
is a core taken from the other engine for every handoff. :func:`idle_pause_s` is the pause the
connector takes before such an empty step (``baton_idle_step_pause_ms``), which bounds what it adds
to noticing either event.

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

#: Extra-config keys of the NixlConnector (``kv_connector_extra_config``) that carry the settings.
EXTRA_CONFIG_KEY = "baton_progress_wakeup_ms"
IDLE_PAUSE_KEY = "baton_idle_step_pause_ms"

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


def _extra(kv_transfer_config: Any, key: str) -> float | None:
    try:
        value = kv_transfer_config.get_from_extra_config(key, None)
        return None if value is None else float(value)
    except (AttributeError, TypeError, ValueError):
        return None


def wakeup_ms_of(kv_transfer_config: Any) -> float | None:
    """The progress-thread setting from a vLLM ``KVTransferConfig`` (``None``: NIXL's default)."""
    return _extra(kv_transfer_config, EXTRA_CONFIG_KEY)


def idle_pause_s(kv_transfer_config: Any) -> float:
    """Seconds the engine pauses before a step with nothing to compute (0: vLLM's own busy steps)."""
    ms = _extra(kv_transfer_config, IDLE_PAUSE_KEY)
    return max(ms or 0.0, 0.0) / 1000.0


def empty_step(scheduler_output: Any, meta: Any) -> bool:
    """A step that computes nothing and starts no KV load: only waiting on a transfer or a notification."""
    return (getattr(scheduler_output, "total_num_scheduled_tokens", 1) == 0
            and not getattr(meta, "reqs_to_recv", None))
