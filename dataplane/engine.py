"""Ray Serve LLM's vLLM engine with the executor Baton's device profile asks for.

Ray Serve LLM always gives vLLM the multiprocessing executor on CPU nodes: the engine-core process
spawns a worker process for the model and the two talk through vLLM's shared-memory message queue,
whose readers spin on ``sched_yield()`` for a second after every message (``SpinCondition``,
``busy_loop_s=1``). With one rank there is nothing to distribute: on a CPU host that is two processes
burning a core each around every request, beside the other engines, Ray and the gateway.

:class:`BatonVLLMEngine` runs the model inside the engine-core process instead (vLLM's ``uni``
executor) when the replica's environment says so (``ReplicaEnv.engine_executor == "uni"``, set by the CPU
profile in :mod:`baton.dataplane.render`) and the engine has a single rank. Everything else is Ray's
``VLLMEngine``. In every case the replica's detokenizer primes a prompt that ends inside a character
the way an undisturbed stream would have (:mod:`baton.dataplane.detokenize`: a resumed stream's
continuation). Ray picks the class from ``RAYLLM_VLLM_ENGINE_CLS`` in the replica's environment, for
the aggregated, prefill and decode servers alike. Every engine also reports its scheduler's load to
the gateway's flow control (:mod:`baton.dataplane.engine_load`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

from baton.core.contracts import ReplicaEnv
from baton.dataplane import detokenize, engine_load

log = logging.getLogger(__name__)


def choose_executor(parallel_config: Any, wanted: str | None) -> str | None:
    """The executor backend to run with, or None to keep Ray's choice."""
    if wanted != "uni":
        return None
    if int(getattr(parallel_config, "world_size", 1)) != 1:
        return None  # several ranks need the multiprocessing executor
    return "uni"


class BatonVLLMEngine(VLLMEngine):
    """Ray's vLLM engine; on a single-rank CPU engine the model runs in the engine-core process."""

    def _start_async_llm_engine(self, vllm_engine_args: Any, vllm_engine_config: Any, placement_group: Any) -> Any:
        detokenize.install()  # the front end (and its detokenizer) runs in this process
        parallel = vllm_engine_config.parallel_config
        backend = choose_executor(parallel, ReplicaEnv.from_environ().engine_executor)
        if backend is not None and parallel.distributed_executor_backend != backend:
            log.info("engine executor: %s (was %s)", backend, parallel.distributed_executor_backend)
            parallel.distributed_executor_backend = backend
        client = super()._start_async_llm_engine(vllm_engine_args, vllm_engine_config, placement_group)
        if engine_load.install(client):
            log.info("engine load reported to Redis for flow control")
        return client
