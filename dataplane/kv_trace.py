"""The KV handoff timed inside the engines: vLLM's NIXL connector with Baton's spans around each transfer.

Loaded by vLLM through `kv_transfer_config` (`kv_connector: NixlConnector`,
`kv_connector_module_path: baton.dataplane.kv_trace`): the module path takes priority over vLLM's own
registry, while the connector keeps the name `NixlConnector`, so Ray Serve LLM still sets up NIXL's side
channel for it and vLLM still applies its NIXL-specific settings. Everything NIXL does is unchanged
but how it waits (`baton.dataplane.nixl_progress`, from the spec's `kv.nixl_progress_wakeup_ms` and
`kv.nixl_idle_step_pause_ms`): its progress thread, and the engine's empty steps while KV is held or
awaited; otherwise this subclass only watches it.

What it measures, and where:

- Decode engine, ``dataplane.kv_transfer``: the NIXL reads that pulled one request's KV from the prefill
  engine. Bytes and duration are NIXL's own per-transfer telemetry (``totalBytes``, ``postDuration`` +
  ``xferDuration``, which vLLM enables with ``capture_telemetry``); ``baton.kv.wait_ms`` is the whole
  wait from the worker first seeing the request to the transfer being reported done (NIXL handshake
  with a new peer and queueing included). The span's parent is the ``dataplane.kv_handoff`` span of the
  decode server, whose ``traceparent`` rides in the request's ``kv_transfer_params``.
- Prefill engine, ``dataplane.kv_hold``: how long the prefill engine kept a finished request's KV
  blocks pinned for the decode side, from the request finishing to the decode side's "read done"
  notification (or NIXL's expiry of an abandoned lease). Its parent is the ``dataplane.prefill`` span.

The scheduler half of the connector sees each request's ``kv_transfer_params`` (trace context, Baton's
request id, prompt length) and hands them to the worker half in the connector metadata it builds for
the step; the worker half times the transfer. The decode engine also posts the measured figures as the
request's ``kv_transfer`` fact, which the gateway merges into the request record. None of this may
break serving: every hook swallows its own failures, and its bookkeeping is bounded.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector as _VllmNixlConnector

from baton.core import telemetry as t
from baton.core.contracts import KvLoadFailedFact, KvTransferFact, dtype_bytes
from baton.dataplane import nixl_progress
from baton.dataplane import tracing as dp_tracing
from baton.dataplane.facts import post_fact

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

META_ATTR = "baton_trace"
MAX_TRACKED = 4096  # requests remembered per side; the oldest are dropped first
STALE_S = 600.0


@dataclass
class _Note:
    """What the scheduler half knows of a request, handed to the worker half."""

    traceparent: str
    request_id: str | None
    prompt_tokens: int
    t_ns: int  # wall clock when the scheduler half saw it (alloc on decode, finish on prefill)


@dataclass
class _Recv:
    note: _Note
    seen_pc: float
    seen_ns: int
    blocks: int
    telemetry: list[Any] = field(default_factory=list)


class _Bounded(OrderedDict[str, Any]):
    def put(self, key: str, value: Any) -> None:
        self[key] = value
        while len(self) > MAX_TRACKED:
            self.popitem(last=False)


def ensure_bindable(host: str, port: int) -> None:
    """Raises if ``host:port`` cannot be bound now (ZMQ binds without SO_REUSEADDR too)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"NIXL side-channel port {host}:{port} is not free ({exc.strerror}); another "
                               "engine (or a leftover of one) holds it") from None


def _note_of(request: Any, t_ns: int) -> _Note | None:
    params = getattr(request, "kv_transfer_params", None)
    if not isinstance(params, dict):
        return None
    tp = params.get(dp_tracing.TRACEPARENT_PARAM)
    if not isinstance(tp, str) or not tp:
        return None
    rid = params.get(dp_tracing.REQUEST_ID_PARAM)
    return _Note(tp, rid if isinstance(rid, str) else None, int(getattr(request, "num_prompt_tokens", 0) or 0), t_ns)


def _count(block_ids: Any) -> int:
    if not block_ids:
        return 0
    return sum(_count(b) if isinstance(b, list | tuple) else 1 for b in block_ids)


def _hkey(handle: Any) -> Any:
    try:
        hash(handle)
    except TypeError:
        return id(handle)
    return handle


class NixlConnector(_VllmNixlConnector):
    """vLLM's NIXL connector (pull mode) with the transfer and the prefill-side hold timed per request.

    The class keeps vLLM's name on purpose: vLLM's ``MultiConnector`` files each connector's KV stats
    under its class name, and the engine's front-end process rebuilds them from vLLM's registry by that
    name (another name kills the engine at its first KV statistics)."""

    _baton_idle_pause_s = 0.0

    def __init__(self, vllm_config: VllmConfig, role: Any, kv_cache_config: Any = None):
        # The worker half creates the NIXL agent here: its progress thread waits as the spec says.
        with nixl_progress.progress_wakeup(nixl_progress.wakeup_ms_of(vllm_config.kv_transfer_config)):
            super().__init__(vllm_config, role, kv_cache_config)
        self._baton_idle_pause_s = nixl_progress.idle_pause_s(vllm_config.kv_transfer_config)
        self._baton_pending: _Bounded = _Bounded()  # scheduler half: req id -> _Note
        self._baton_recv: _Bounded = _Bounded()  # worker half: req id -> _Recv
        self._baton_hold: _Bounded = _Bounded()  # worker half: req id -> _Note
        self._baton_handles: dict[Any, str] = {}  # during one results poll: NIXL handle -> req id
        self._baton_patched = False
        self._baton_shape: dp_tracing.ModelShape | None = None
        try:
            mc = vllm_config.model_config
            # The KV cache's own dtype (``fp8_e4m3``, ...) where one is set, else the model's.
            cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", None)
            dtype = mc.dtype if cache_dtype in (None, "", "auto") else cache_dtype
            self._baton_shape = dp_tracing.ModelShape(
                mc.get_num_layers(vllm_config.parallel_config), mc.get_num_kv_heads(vllm_config.parallel_config),
                mc.get_head_size(), dtype_bytes(dtype), int(vllm_config.cache_config.block_size))
        except Exception:  # an unknown dtype included: bytes then come from NIXL's telemetry only
            self._baton_shape = None

    # -- scheduler half ---------------------------------------------------------------------------

    def set_xfer_handshake_metadata_pp_aware(self, metadata: Any) -> None:
        """vLLM starts the NIXL side-channel listener here and waits, without a timeout, for a thread that
        dies if the port is taken: the engine would hang forever in its start-up. A port that cannot be
        bound fails the engine's start instead (so Ray restarts the replica), with the reason."""
        sched: Any = self.connector_scheduler
        if sched is not None and getattr(sched, "_nixl_handshake_listener_t", None) is None:
            ensure_bindable(str(sched.side_channel_host), int(sched.side_channel_port))
        super().set_xfer_handshake_metadata_pp_aware(metadata)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        if num_external_tokens > 0:
            try:
                note = _note_of(request, time.time_ns())
                if note is not None:
                    self._baton_pending.put(request.request_id, note)
            except Exception:
                log.debug("KV trace hook failed", exc_info=True)
        return super().update_state_after_alloc(request, blocks, num_external_tokens)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        out = super().request_finished(request, block_ids)
        self._baton_finished(request, out)
        return out

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[
            bool, dict[str, Any] | None]:
        out = super().request_finished_all_groups(request, block_ids)
        self._baton_finished(request, out)
        return out

    def _baton_finished(self, request: Any, out: tuple[bool, dict[str, Any] | None]) -> None:
        """Prefill side: blocks kept for the decode side to pull start their hold now."""
        try:
            self._baton_pending.pop(request.request_id, None)
            if out and out[0]:
                note = _note_of(request, time.time_ns())
                if note is not None:
                    self._baton_pending.put(request.request_id, note)
        except Exception:
            log.debug("KV trace hook failed", exc_info=True)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        if self._baton_pending:
            try:
                handed: dict[str, _Note] = {}
                for req_id in (*getattr(meta, "reqs_to_recv", {}), *getattr(meta, "reqs_to_send", {})):
                    note = self._baton_pending.pop(req_id, None)
                    if note is not None:
                        handed[req_id] = note
                if handed:
                    setattr(meta, META_ATTR, handed)
                self._drop_stale(self._baton_pending, lambda n: n.t_ns / 1e9)
            except Exception:
                log.debug("KV trace hook failed", exc_info=True)
        if self._baton_idle_pause_s and nixl_progress.empty_step(scheduler_output, meta):
            time.sleep(self._baton_idle_pause_s)  # instead of stepping again at once: a CPU host's core
        return meta

    # -- worker half ------------------------------------------------------------------------------

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        handed = getattr(meta, META_ATTR, None)
        if handed:
            try:
                self._baton_patch()
                now_pc, now_ns = time.perf_counter(), time.time_ns()
                recv = getattr(meta, "reqs_to_recv", {})
                for req_id, note in handed.items():
                    if req_id in recv:
                        self._baton_recv.put(req_id, _Recv(note, now_pc, now_ns, _count(recv[req_id].local_block_ids)))
                    else:
                        self._baton_hold.put(req_id, note)
            except Exception:
                log.debug("KV trace hook failed", exc_info=True)
        super().start_load_kv(forward_context, **kwargs)

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        if not (self._baton_recv or self._baton_hold):
            return super().get_transfer_results(finished_req_ids)
        try:
            worker: Any = self.connector_worker
            self._baton_handles = {_hkey(h): req for req, hs in getattr(worker, "_recving_transfers", {}).items()
                                   if req in self._baton_recv for h in hs}
        except Exception:
            self._baton_handles = {}
        results = super().get_transfer_results(finished_req_ids)
        self._baton_handles = {}
        try:
            failed = set(getattr(results, "failed_recving", ()) or ())
            for req_id in getattr(results, "finished_recving", ()) or ():
                rec = self._baton_recv.pop(req_id, None)
                if rec is not None:
                    self._baton_transferred(rec, failed=req_id in failed)
            for req_id in getattr(results, "finished_sending", ()) or ():
                note = self._baton_hold.pop(req_id, None)
                if note is not None:
                    self._baton_held(note)
            self._drop_stale(self._baton_recv, lambda r: r.seen_ns / 1e9)
            self._drop_stale(self._baton_hold, lambda n: n.t_ns / 1e9)
        except Exception:
            log.debug("KV trace hook failed", exc_info=True)
        return results

    def _baton_patch(self) -> None:
        """Sees NIXL's telemetry of each finished read (vLLM reads it for its own stats)."""
        if self._baton_patched:
            return
        self._baton_patched = True
        wrapper: Any = getattr(self.connector_worker, "nixl_wrapper", None)
        original = getattr(wrapper, "get_xfer_telemetry", None)
        if original is None:
            return

        def get_xfer_telemetry(handle: Any) -> Any:
            res = original(handle)
            try:
                req_id = self._baton_handles.get(_hkey(handle))
                rec = self._baton_recv.get(req_id) if req_id is not None else None
                if rec is not None and res is not None:
                    rec.telemetry.append(res)
            except Exception:
                log.debug("KV trace hook failed", exc_info=True)
            return res

        try:
            wrapper.get_xfer_telemetry = get_xfer_telemetry
        except (AttributeError, TypeError):
            log.debug("NIXL telemetry not observable; KV transfers are timed from the worker only")

    def _baton_transferred(self, rec: _Recv, *, failed: bool) -> None:
        done_pc, done_ns = time.perf_counter(), time.time_ns()
        wait_ms = (done_pc - rec.seen_pc) * 1000
        nixl_bytes = sum(int(getattr(r, "totalBytes", 0) or 0) for r in rec.telemetry)
        nixl_us = max((float(getattr(r, "postDuration", 0) or 0) + float(getattr(r, "xferDuration", 0) or 0)
                       for r in rec.telemetry), default=0.0)
        shape = self._baton_shape
        block_bytes = rec.blocks * shape.block_size * shape.bytes_per_token if shape is not None else 0
        kv_bytes = nixl_bytes or block_bytes
        transfer_ms = nixl_us / 1000 if nixl_us > 0 else wait_ms
        expected = rec.note.prompt_tokens * shape.bytes_per_token if shape is not None and rec.note.prompt_tokens \
            else None
        attrs = t.handoff_attributes(connector="nixl", kv_bytes=kv_bytes, expected_bytes=expected,
                                     transfer_ms=transfer_ms, bandwidth_gbps=dp_tracing.link_bandwidth_gbps())
        attrs.update({
            "baton.kv.wait_ms": wait_ms,
            "baton.kv.blocks": rec.blocks,
            "baton.kv.transfers": len(rec.telemetry),
            "baton.kv.timing": "nixl_telemetry" if nixl_us > 0 else "worker_clock",
            # NIXL's telemetry counts no bytes on CPU/UCX today: then the figure is the KV formula's
            "baton.kv.bytes_source": "nixl" if nixl_bytes else "formula",
        })
        if shape is not None:
            attrs["baton.kv.block_size"] = shape.block_size
        if rec.note.prompt_tokens:
            attrs[t.ATTR_INPUT_TOKENS] = rec.note.prompt_tokens
        start_ns = done_ns - int(transfer_ms * 1e6)
        self._baton_span(t.SPAN_KV_TRANSFER, rec.note, attrs, start_ns=max(start_ns, rec.seen_ns), end_ns=done_ns,
                         error="KV load failed" if failed else None)
        if rec.note.request_id and failed:
            # vLLM recomputes the prompt (kv_load_failure_policy: recompute): a rung of the ladder, on record.
            post_fact(rec.note.request_id, KvLoadFailedFact(connector="nixl", blocks=rec.blocks, wait_ms=wait_ms,
                                                             t_unix=done_ns / 1e9))
        if rec.note.request_id and not failed:
            post_fact(rec.note.request_id, KvTransferFact(
                connector="nixl", kv_bytes=kv_bytes, expected_bytes=expected, transfer_ms=transfer_ms,
                wait_ms=wait_ms, timing=str(attrs["baton.kv.timing"]), prompt_tokens=rec.note.prompt_tokens,
                bytes_source=str(attrs["baton.kv.bytes_source"])))

    def _baton_held(self, note: _Note) -> None:
        done_ns = time.time_ns()
        attrs: dict[str, Any] = {"baton.kv.connector": "nixl", "baton.kv.hold_ms": (done_ns - note.t_ns) / 1e6}
        if note.prompt_tokens:
            attrs[t.ATTR_INPUT_TOKENS] = note.prompt_tokens
        self._baton_span(t.SPAN_KV_HOLD, note, attrs, start_ns=note.t_ns, end_ns=done_ns)

    @staticmethod
    def _baton_span(name: str, note: _Note, attrs: dict[str, Any], *, start_ns: int, end_ns: int,
                    error: str | None = None) -> None:
        tracing = dp_tracing.tracing_from_env()
        if tracing.provider is None:
            return
        parent = t.context_from_traceparent(note.traceparent)
        span = tracing.tracer.start_span(name, context=parent, start_time=start_ns, attributes=attrs)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    @staticmethod
    def _drop_stale(table: _Bounded, when: Any) -> None:
        if not table:
            return
        cutoff = time.time() - STALE_S
        while table:
            key, first = next(iter(table.items()))
            if when(first) >= cutoff:
                return
            table.pop(key, None)


#: How Baton's code and tests refer to it.
BatonNixlConnector = NixlConnector
