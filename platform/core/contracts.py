"""What crosses a process boundary in Baton, each defined once here and imported by both sides.

A Ray Serve replica, a vLLM engine process, the gateway and the console run apart (on other hosts, in
other releases during a rolling upgrade) and agree only on what this module says. A change here is a
change to both ends and to the records already written, so readers are lenient (a malformed field is
dropped, never the request) and writers go through the typed classes.

- **Request facts.** The data plane writes what only it sees of a request to the Redis hash
  :func:`fact_key` (``FACT_KEY_PREFIX + <request id hex>``, one JSON value per :class:`FactField`,
  expiring after :data:`FACT_TTL_S`); the gateway's meter reads the hash once, off the request path,
  and merges it into the request record. Payloads: :class:`HandoffFact` (decode server, at the first
  token), :class:`KvTransferFact` and :class:`KvLoadFailedFact` (the decode engine's NIXL connector),
  :class:`RecoveryStepsFact` and :class:`PhasesFact` (the decode server's prefill ladder). Read back
  with :meth:`RequestFacts.from_hash`. The request id is the gateway's, sent upstream in
  :data:`REQUEST_ID_HEADER` as ``req-<hex>`` (Ray Serve takes it as its request id).
- **Recovery steps.** :class:`RecoveryStep` is one rung of the recovery ladder taken for a request
  (names: :data:`RECOVERY_STEP_NAMES`), as the gateway records it in ``request_records.recovery_steps``
  and as the data plane reports it in its ``recovery_steps`` fact.
- **Phases.** :class:`Phase` is one measured interval of a request on the decode server (remote
  prefill attempt, KV handoff, local prefill); the ``phases`` fact carries them on the decode server's
  clock, the request record (``request_records.phases``) on the gateway's request axis.
- **Replica environment.** :class:`ReplicaEnv` is every ``BATON_*`` variable a Ray replica or an
  engine process reads (names: the ``ENV_*`` constants); the renderer writes it with
  :meth:`ReplicaEnv.to_environ`, the replicas read it with :meth:`ReplicaEnv.from_environ`.
- **Cache invalidations.** The control plane publishes on the Redis channel :data:`INVALIDATION_CHANNEL`
  what every gateway process must forget at once (a key, a tenant, or everything): written with
  :func:`invalidation_message`, read with :func:`parse_invalidation`.
- **Flow-control views.** Each gateway process writes its queues (limit, waiting per band, per-tenant
  figures) under :func:`flow_view_key` every second (:func:`flow_view_message`, read with
  :func:`parse_flow_view`); the operators' view merges every process's.
- **KV size.** :func:`kv_bytes` is the seed's formula, ``2 x layers x kv_heads x head_dim x tokens x
  bytes``, and :data:`DTYPE_BYTES` the one table of element sizes (:func:`dtype_bytes`).

Standard library only, and nothing is built at import time.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Literal

# --- KV size ----------------------------------------------------------------------------------------

#: Bytes per element by dtype name (torch's, vLLM's ``kv_cache_dtype`` values and the usual short names).
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({
    "float64": 8, "double": 8,
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "int8": 1, "uint8": 1,
})


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a dtype (``"bfloat16"``, ``torch.float16``, ``"fp8_e4m3"``, ...).

    Raises ValueError for a name the table does not know (``"auto"`` included: resolve it to the
    model's dtype first), so that no size is ever guessed."""
    name = str(dtype).strip().lower().removeprefix("torch.")
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


def kv_bytes(*, num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: int, tokens: int = 1) -> int:
    """KV cache bytes of ``tokens`` tokens: ``2 x layers x kv_heads x head_dim x tokens x bytes`` (K and V)."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * bytes_per_element


def kv_bytes_block_rounded(tokens: int, *, num_layers: int, num_kv_heads: int, head_dim: int,
                           bytes_per_element: int, block_size: int = 128) -> int:
    """KV bytes of ``tokens`` tokens when the KV moves as whole blocks of ``block_size`` tokens."""
    return kv_bytes(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                    bytes_per_element=bytes_per_element, tokens=math.ceil(tokens / block_size) * block_size)


# --- lenient JSON readers ---------------------------------------------------------------------------

def _int(obj: Mapping[str, Any], key: str) -> int | None:
    v = obj.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(obj: Mapping[str, Any], key: str) -> float | None:
    v = obj.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _str(obj: Mapping[str, Any], key: str) -> str | None:
    v = obj.get(key)
    return v if isinstance(v, str) else None


def _object(obj: Any) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# --- recovery steps ---------------------------------------------------------------------------------

StepName = Literal["prefill_retry", "local_prefill", "kv_recompute", "decode_resume", "aggregated_fallback"]
#: Another attempt of the remote prefill (data plane: the decode server's ladder).
STEP_PREFILL_RETRY: StepName = "prefill_retry"
#: The decode replica prefilled the prompt itself (data plane).
STEP_LOCAL_PREFILL: StepName = "local_prefill"
#: The decode engine could not pull the prompt's KV and recomputed it (gateway, from ``kv_load_failed``).
STEP_KV_RECOMPUTE: StepName = "kv_recompute"
#: The gateway continued a broken stream on another decode replica.
STEP_DECODE_RESUME: StepName = "decode_resume"
#: The gateway sent the request, or the rest of it, to the deployment's fallback pool.
STEP_AGGREGATED_FALLBACK: StepName = "aggregated_fallback"
RECOVERY_STEP_NAMES: frozenset[str] = frozenset(
    {STEP_PREFILL_RETRY, STEP_LOCAL_PREFILL, STEP_KV_RECOMPUTE, STEP_DECODE_RESUME, STEP_AGGREGATED_FALLBACK})
#: Steps taken by the decode server before the first token (the prefill rungs).
PREFILL_STEPS: tuple[StepName, ...] = (STEP_PREFILL_RETRY, STEP_LOCAL_PREFILL)

StepOutcome = Literal["recovered", "failed"]
StepSource = Literal["gateway", "dataplane"]
DETAIL_MAX = 200


@dataclass(frozen=True, slots=True)
class RecoveryStep:
    """One recovery step: what was done (``step``), when (``at_ms`` from the request's start on the
    recorder's clock), for how long, whether it worked, and who took it (``source``; None: the gateway).
    ``client_gap_ms``: for a stream resumed after a break, what its client waited, from the last token
    sent before the break to the first one after it (None: not known, or not a resume)."""

    step: str
    at_ms: float
    duration_ms: float
    outcome: str
    detail: str = ""
    source: StepSource | None = None
    client_gap_ms: float | None = None

    @classmethod
    def timed(cls, step: StepName, *, origin_pc: float, started_pc: float, now_pc: float, outcome: StepOutcome,
              detail: str, source: StepSource | None = None) -> RecoveryStep:
        """A step from ``time.perf_counter()`` readings: the request's origin, the step's start, now."""
        return cls(step, round((started_pc - origin_pc) * 1000, 3), round((now_pc - started_pc) * 1000, 3),
                   outcome, detail[:DETAIL_MAX], source)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "at_ms": self.at_ms, "duration_ms": self.duration_ms,
                               "outcome": self.outcome, "detail": self.detail}
        if self.source is not None:
            out["source"] = self.source
        if self.client_gap_ms is not None:
            out["client_gap_ms"] = self.client_gap_ms
        return out

    @classmethod
    def from_json(cls, obj: Any) -> RecoveryStep:
        """Raises ValueError unless ``obj`` is an object with a ``step`` name; other fields default."""
        o = _object(obj)
        name = _str(o, "step")
        if not name:
            raise ValueError("a recovery step needs its name")
        source = o.get("source")
        return cls(name, _num(o, "at_ms") or 0.0, _num(o, "duration_ms") or 0.0, _str(o, "outcome") or "",
                   (_str(o, "detail") or "")[:DETAIL_MAX],
                   source if source in ("gateway", "dataplane") else None, _num(o, "client_gap_ms"))


# --- phases -----------------------------------------------------------------------------------------

PhaseName = Literal["remote_prefill", "kv_handoff", "local_prefill"]
#: One call to a prefill replica, dispatch to its answer (queueing + prefill), or to its failure.
PHASE_REMOTE_PREFILL: PhaseName = "remote_prefill"
#: Submitting the decode request with the prefill's KV handle to the decode engine's first token: the KV
#: pull plus scheduling and one decode step (an upper bound of the transfer).
PHASE_KV_HANDOFF: PhaseName = "kv_handoff"
#: The decode replica prefilling the prompt itself, submit to its first token (the ladder's fallback).
PHASE_LOCAL_PREFILL: PhaseName = "local_prefill"
PHASE_NAMES: frozenset[str] = frozenset({PHASE_REMOTE_PREFILL, PHASE_KV_HANDOFF, PHASE_LOCAL_PREFILL})
PhaseOutcome = Literal["ok", "failed"]


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured phase of a request: ``start_ms`` from an origin that the holder says (the decode
    server's receipt of the request in a :class:`PhasesFact`, the gateway's start in a request record)."""

    phase: str
    start_ms: float
    duration_ms: float
    outcome: str = "ok"
    attempt: int | None = None
    detail: str = ""

    @property
    def end_ms(self) -> float:
        return self.start_ms + self.duration_ms

    def to_json(self) -> dict[str, Any]:
        return _drop_none({"phase": self.phase, "start_ms": self.start_ms, "duration_ms": self.duration_ms,
                           "outcome": self.outcome, "attempt": self.attempt, "detail": self.detail or None})

    @classmethod
    def from_json(cls, obj: Any) -> Phase:
        """Raises ValueError unless ``obj`` names a known phase with a start and a duration."""
        o = _object(obj)
        name, start, dur = _str(o, "phase"), _num(o, "start_ms"), _num(o, "duration_ms")
        if name not in PHASE_NAMES or start is None or dur is None or dur < 0:
            raise ValueError(f"not a phase: {dict(o)!r}"[:DETAIL_MAX])
        return cls(name, start, dur, _str(o, "outcome") or "ok", _int(o, "attempt"),
                   (_str(o, "detail") or "")[:DETAIL_MAX])


def phases_from_json(obj: Any) -> list[Phase]:
    """The phases of a list (a record's ``phases`` column, a fact's ``phases``); malformed entries dropped."""
    out: list[Phase] = []
    for item in obj if isinstance(obj, list) else []:
        try:
            out.append(Phase.from_json(item))
        except ValueError:
            continue
    return out


# --- facts ------------------------------------------------------------------------------------------

REQUEST_ID_HEADER = "x-request-id"
#: The gateway sends its request id upstream as ``req-<hex>``; the fact key uses the bare hex.
REQUEST_ID_PREFIX = "req-"
FACT_KEY_PREFIX = "baton:req:"
FACT_TTL_S = 600


def fact_key(request_id: str) -> str:
    """The Redis hash holding one request's facts; ``request_id`` as hex, or as sent upstream (``req-<hex>``)."""
    return FACT_KEY_PREFIX + request_id.removeprefix(REQUEST_ID_PREFIX)


class FactField(StrEnum):
    """The fields of a request's fact hash (each value: one payload's JSON)."""

    HANDOFF = "handoff"
    KV_TRANSFER = "kv_transfer"
    KV_LOAD_FAILED = "kv_load_failed"
    RECOVERY_STEPS = "recovery_steps"
    PHASES = "phases"


@dataclass(frozen=True, slots=True)
class HandoffFact:
    """The KV handoff as the decode server saw it: submit to the decode engine's first token (an upper
    bound of the transfer, ``transfer_ms_kind``); ``kv_bytes``: the prefill's blocks, whole."""

    FIELD: ClassVar[FactField] = FactField.HANDOFF
    connector: str = "nixl"
    kv_bytes: int | None = None
    expected_bytes: int | None = None
    transfer_ms: float | None = None
    transfer_ms_kind: str | None = "upper_bound_to_first_token"
    prompt_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"connector": self.connector, "kv_bytes": self.kv_bytes, "expected_bytes": self.expected_bytes,
                "transfer_ms": self.transfer_ms, "transfer_ms_kind": self.transfer_ms_kind,
                "prompt_tokens": self.prompt_tokens}

    @classmethod
    def from_json(cls, obj: Any) -> HandoffFact:
        o = _object(obj)
        return cls(_str(o, "connector") or "nixl", _int(o, "kv_bytes"), _int(o, "expected_bytes"),
                   _num(o, "transfer_ms"), _str(o, "transfer_ms_kind"), _int(o, "prompt_tokens"))


@dataclass(frozen=True, slots=True)
class KvTransferFact:
    """The KV pull timed inside the decode engine (NIXL's own telemetry, or the worker's clock: ``timing``);
    preferred by the gateway over :class:`HandoffFact`'s upper bound."""

    FIELD: ClassVar[FactField] = FactField.KV_TRANSFER
    connector: str = "nixl"
    kv_bytes: int | None = None
    expected_bytes: int | None = None
    transfer_ms: float | None = None
    wait_ms: float | None = None
    timing: str | None = None
    prompt_tokens: int | None = None
    bytes_source: str | None = None
    """``nixl``: NIXL's own count of the bytes moved; ``formula``: blocks x block bytes (NIXL reported none)."""

    def to_json(self) -> dict[str, Any]:
        return {"connector": self.connector, "kv_bytes": self.kv_bytes, "expected_bytes": self.expected_bytes,
                "transfer_ms": self.transfer_ms, "wait_ms": self.wait_ms, "timing": self.timing,
                "prompt_tokens": self.prompt_tokens, "bytes_source": self.bytes_source}

    @classmethod
    def from_json(cls, obj: Any) -> KvTransferFact:
        o = _object(obj)
        return cls(_str(o, "connector") or "nixl", _int(o, "kv_bytes"), _int(o, "expected_bytes"),
                   _num(o, "transfer_ms"), _num(o, "wait_ms"), _str(o, "timing"), _int(o, "prompt_tokens"),
                   _str(o, "bytes_source"))


@dataclass(frozen=True, slots=True)
class KvLoadFailedFact:
    """The decode engine could not pull the KV (``blocks`` of it) and recomputed the prompt instead;
    ``t_unix``: when the pull was given up, on the engine's wall clock."""

    FIELD: ClassVar[FactField] = FactField.KV_LOAD_FAILED
    connector: str = "nixl"
    blocks: int | None = None
    wait_ms: float | None = None
    t_unix: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"connector": self.connector, "blocks": self.blocks, "wait_ms": self.wait_ms, "t_unix": self.t_unix}

    @classmethod
    def from_json(cls, obj: Any) -> KvLoadFailedFact:
        o = _object(obj)
        return cls(_str(o, "connector") or "nixl", _int(o, "blocks"), _num(o, "wait_ms"), _num(o, "t_unix"))


@dataclass(frozen=True, slots=True)
class RecoveryStepsFact:
    """The recovery steps the data plane took for the request (the whole list; a later write replaces it)."""

    FIELD: ClassVar[FactField] = FactField.RECOVERY_STEPS
    steps: tuple[RecoveryStep, ...] = ()

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.steps]

    @classmethod
    def from_json(cls, obj: Any) -> RecoveryStepsFact:
        if not isinstance(obj, list):
            raise ValueError("recovery steps are a list")
        steps = []
        for item in obj:
            try:
                steps.append(RecoveryStep.from_json(item))
            except ValueError:
                continue
        return cls(tuple(steps))


@dataclass(frozen=True, slots=True)
class PhasesFact:
    """The phases the decode server measured, ``start_ms`` from ``received_unix`` (its wall clock when it
    began handling the request)."""

    FIELD: ClassVar[FactField] = FactField.PHASES
    received_unix: float
    phases: tuple[Phase, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"received_unix": self.received_unix, "phases": [p.to_json() for p in self.phases]}

    @classmethod
    def from_json(cls, obj: Any) -> PhasesFact:
        o = _object(obj)
        received = _num(o, "received_unix")
        if received is None:
            raise ValueError("phases need the time the decode server received the request")
        return cls(received, tuple(phases_from_json(o.get("phases"))))

    def on_request_axis(self, request_started_unix: float) -> list[Phase]:
        """The phases from the gateway's start of the request (the record's axis). The two wall clocks
        may disagree: a decode server that seems to have started before the gateway did starts at 0."""
        offset = max((self.received_unix - request_started_unix) * 1000, 0.0)
        return [replace(p, start_ms=round(p.start_ms + offset, 3)) for p in self.phases]


Fact = HandoffFact | KvTransferFact | KvLoadFailedFact | RecoveryStepsFact | PhasesFact


def encode_fact(fact: Fact) -> tuple[str, str]:
    """The hash field and JSON value of one fact."""
    return fact.FIELD.value, json.dumps(fact.to_json(), separators=(",", ":"))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """A request's facts as read back (``HGETALL`` of :func:`fact_key`); absent or malformed ones are None."""

    handoff: HandoffFact | None = None
    kv_transfer: KvTransferFact | None = None
    kv_load_failed: KvLoadFailedFact | None = None
    recovery_steps: RecoveryStepsFact | None = None
    phases: PhasesFact | None = None
    _READERS: ClassVar[Mapping[str, Any]] = {
        FactField.HANDOFF: HandoffFact.from_json, FactField.KV_TRANSFER: KvTransferFact.from_json,
        FactField.KV_LOAD_FAILED: KvLoadFailedFact.from_json,
        FactField.RECOVERY_STEPS: RecoveryStepsFact.from_json, FactField.PHASES: PhasesFact.from_json,
    }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> RequestFacts:
        """From the hash's fields and values (bytes or str); unknown fields are ignored."""
        parsed: dict[str, Any] = {}
        for k, v in raw.items():
            name = _text(k)
            reader = cls._READERS.get(name)
            if reader is None:
                continue
            try:
                parsed[name] = reader(json.loads(_text(v)))
            except (ValueError, TypeError):
                continue
        return cls(**parsed)

    @classmethod
    def of(cls, facts: Iterable[Fact]) -> RequestFacts:
        """The facts as if written and read back (the later of two with the same field wins)."""
        return cls.from_hash(dict(encode_fact(f) for f in facts))


# --- cache invalidations ----------------------------------------------------------------------------

#: Redis pub/sub channel on which gateway caches are told to forget an entry.
INVALIDATION_CHANNEL = "baton:gateway:invalidate"

InvalidationKind = Literal["key", "tenant", "all"]


def invalidation_message(kind: InvalidationKind, id_: object | None = None) -> bytes:
    """The wire form of one invalidation: ``{"kind": ..., "id": ...}`` as JSON (``id``: a UUID's text)."""
    return json.dumps({"kind": kind, "id": str(id_) if id_ else None}, separators=(",", ":")).encode()


def parse_invalidation(message: bytes | str) -> tuple[str, uuid.UUID | None] | None:
    """``(kind, id or None)`` of one invalidation message; None when it is malformed (the reader then
    forgets everything, which is always safe)."""
    try:
        data = json.loads(message)
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            return None
        id_ = data.get("id")
        return data["kind"], uuid.UUID(id_) if id_ else None
    except (ValueError, TypeError, AttributeError):  # not JSON, or an id that is not a UUID's text
        return None


# --- indexed, expiring keys -------------------------------------------------------------------------

#: A reader finds the live keys of a kind (each gateway process's flow view, each engine's load) through a
#: sorted set of its own, never by SCAN: a SCAN walks the whole keyspace (an LMCache tier on the same Redis
#: holds tens of thousands of keys), once a second in every gateway process. Each member is a key, scored by
#: the wall-clock time it expires; the key itself expires in Redis, so a member whose key is gone reads as
#: nothing, and writers trim members past ``INDEX_SLACK_S``.
INDEX_SLACK_S = 60.0


def indexed_set(pipe: Any, index: str, key: str, value: bytes, ttl_s: float, *, now: float) -> None:
    """Queues on ``pipe`` (a Redis pipeline, synchronous or asyncio) the write of ``key`` expiring after
    ``ttl_s`` and its entry in ``index``; the caller executes it."""
    pipe.set(key, value, ex=max(math.ceil(ttl_s), 1))
    pipe.zadd(index, {key: now + ttl_s})
    pipe.zremrangebyscore(index, "-inf", now - INDEX_SLACK_S)


def index_live_from(now: float) -> float:
    """The lowest score of a member that may still be live (``ZRANGEBYSCORE index <this> +inf``): clocks of
    two hosts may disagree by a few seconds, and a key already gone reads as nothing anyway."""
    return now - 5.0


# --- flow-control views ----------------------------------------------------------------------------

#: Each gateway process writes its flow-control queues (one JSON list of model views, as
#: ``baton.api.gateway.flow.FlowController.view`` makes them) to ``FLOW_VIEW_PREFIX + <process id>``,
#: expiring after :data:`FLOW_VIEW_TTL_S`: a process that stopped drops out of the operators' view by itself.
FLOW_VIEW_PREFIX = "baton:flow:view:"
FLOW_VIEW_TTL_S = 10
#: The live views' keys (:func:`indexed_set`).
FLOW_VIEW_INDEX = "baton:flow:views"


def flow_view_key(process: str) -> str:
    return FLOW_VIEW_PREFIX + process


def flow_view_message(process: str, models: list[dict[str, Any]]) -> bytes:
    """The stored form of one process's view: ``{"process": ..., "models": [...]}`` as JSON."""
    return json.dumps({"process": process, "models": models}, separators=(",", ":")).encode()


def parse_flow_view(message: bytes | str | None) -> tuple[str, list[dict[str, Any]]] | None:
    """``(process, model views)`` of one stored view; None when it is missing or malformed."""
    if message is None:
        return None
    try:
        data = json.loads(message)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("process"), str) or not isinstance(
            data.get("models"), list):
        return None
    return data["process"], [v for v in data["models"] if isinstance(v, dict)]


# --- engine load -----------------------------------------------------------------------------------

#: Each vLLM engine of a Serve deployment writes its scheduler's load (:class:`EngineLoad`, from vLLM's
#: per-step scheduler stats, averaged over the time between two writes) to
#: ``ENGINE_LOAD_PREFIX + <model> + ":" + <engine>`` (listed in :data:`ENGINE_LOAD_INDEX`): while it steps,
#: at most every :data:`ENGINE_LOAD_INTERVAL_S`, expiring after :data:`ENGINE_LOAD_BUSY_TTL_S` (an engine that stops
#: stepping or dies drops out by itself); when it goes idle, once, expiring after
#: :data:`ENGINE_LOAD_IDLE_TTL_S`. Writer: ``baton.dataplane.engine_load``; readers: the gateway's flow
#: control (``baton.api.gateway.flow.ViewPublisher``) and the operators' view (``baton.control.flow``).
ENGINE_LOAD_PREFIX = "baton:engine:load:"
ENGINE_LOAD_INTERVAL_S = 0.5
ENGINE_LOAD_BUSY_TTL_S = 3
ENGINE_LOAD_IDLE_TTL_S = 60
#: The live engine loads' keys (:func:`indexed_set`).
ENGINE_LOAD_INDEX = "baton:engine:loads"


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's scheduler over the last interval: requests running and waiting (their means over the
    interval's time), the largest KV-cache usage (0..1) and the steps taken."""

    model: str
    engine: str  #: ``host:pid`` of the engine's front end (the Serve replica's process)
    role: str  #: ``prefill``, ``decode`` or ``both`` (an aggregated engine)
    running: float
    waiting: float
    kv_usage: float
    steps: int
    at: float  #: wall-clock seconds of the write

    @property
    def busy(self) -> bool:
        return self.running > 0 or self.waiting > 0


def engine_load_key(model: str, engine: str) -> str:
    return f"{ENGINE_LOAD_PREFIX}{model}:{engine}"


def engine_load_message(load: EngineLoad) -> bytes:
    return json.dumps({"model": load.model, "engine": load.engine, "role": load.role,
                       "running": round(load.running, 3), "waiting": round(load.waiting, 3),
                       "kv_usage": round(load.kv_usage, 4), "steps": load.steps, "at": round(load.at, 3)},
                      separators=(",", ":")).encode()


def parse_engine_load(message: bytes | str | None) -> EngineLoad | None:
    """One stored engine load; None when it is missing or malformed."""
    if message is None:
        return None
    try:
        d = json.loads(message)
        if not isinstance(d, dict) or not isinstance(d.get("model"), str) or not isinstance(d.get("engine"), str):
            return None
        nums = [d.get(k) for k in ("running", "waiting", "kv_usage", "steps", "at")]
        if any(not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) for v in nums):
            return None
        return EngineLoad(model=d["model"], engine=d["engine"], role=str(d.get("role") or "both"),
                          running=max(float(d["running"]), 0.0), waiting=max(float(d["waiting"]), 0.0),
                          kv_usage=min(max(float(d["kv_usage"]), 0.0), 1.0), steps=max(int(d["steps"]), 0),
                          at=float(d["at"]))
    except ValueError:
        return None


# --- replica environment ----------------------------------------------------------------------------

#: Redis URL of the request facts (unset: no facts are written).
ENV_FACTS_REDIS_URL = "BATON_DATAPLANE_REDIS_URL"
#: The prefill ladder: seconds to wait for a prefill replica's answer; attempts in all; first backoff.
ENV_PREFILL_TIMEOUT_S = "BATON_PREFILL_TIMEOUT_S"
ENV_PREFILL_ATTEMPTS = "BATON_PREFILL_ATTEMPTS"
ENV_PREFILL_BACKOFF_S = "BATON_PREFILL_BACKOFF_S"
#: ``0`` turns the ladder's local-prefill rung off (then: 503).
ENV_LOCAL_PREFILL = "BATON_LOCAL_PREFILL"
#: ``uni``: a single-rank engine runs its model in the engine-core process (``baton.dataplane.engine``).
ENV_ENGINE_EXECUTOR = "BATON_ENGINE_EXECUTOR"
#: The pool an engine serves: ``prefill``, ``decode`` or ``both`` (aggregated); its :class:`EngineLoad` says so.
ENV_ENGINE_ROLE = "BATON_ENGINE_ROLE"
#: Tracing of the replicas (the same names as the settings tree's ``telemetry`` section).
ENV_TELEMETRY_ENABLED = "BATON_TELEMETRY__ENABLED"
ENV_TELEMETRY_OTLP_ENDPOINT = "BATON_TELEMETRY__OTLP_ENDPOINT"
ENV_TELEMETRY_SERVICE_NAME = "BATON_TELEMETRY__SERVICE_NAME"
ENV_TELEMETRY_LINK_BANDWIDTH_GBPS = "BATON_TELEMETRY__LINK_BANDWIDTH_GBPS"
REPLICA_ENV_NAMES: frozenset[str] = frozenset({
    ENV_FACTS_REDIS_URL, ENV_PREFILL_TIMEOUT_S, ENV_PREFILL_ATTEMPTS, ENV_PREFILL_BACKOFF_S, ENV_LOCAL_PREFILL,
    ENV_ENGINE_EXECUTOR, ENV_ENGINE_ROLE, ENV_TELEMETRY_ENABLED, ENV_TELEMETRY_OTLP_ENDPOINT,
    ENV_TELEMETRY_SERVICE_NAME, ENV_TELEMETRY_LINK_BANDWIDTH_GBPS,
})
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class PrefillPolicy:
    """The prefill side of the recovery ladder (``baton.dataplane.recovery``)."""

    timeout_s: float = 10.0
    attempts: int = 3
    backoff_s: float = 0.2
    local_prefill: bool = True

    def delay(self, attempt: int) -> float:
        """Wait before attempt ``attempt`` (2-based: the first retry waits ``backoff_s``, then it doubles, to 5 s)."""
        return float(min(self.backoff_s * 2.0 ** (attempt - 2), 5.0))


@dataclass(frozen=True, slots=True)
class ReplicaTelemetry:
    """Tracing of a replica process (``baton.dataplane.tracing``)."""

    enabled: bool = True
    otlp_endpoint: str | None = None
    service_name: str = "baton-dataplane"
    link_bandwidth_gbps: float = 1.9


@dataclass(frozen=True, slots=True)
class ReplicaEnv:
    """Everything Baton passes to a Ray replica and its engine processes through the environment."""

    facts_redis_url: str | None = None
    prefill: PrefillPolicy = field(default_factory=PrefillPolicy)
    engine_executor: str | None = None
    engine_role: str | None = None
    telemetry: ReplicaTelemetry = field(default_factory=ReplicaTelemetry)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ReplicaEnv:
        """Reads ``environ`` (default: ``os.environ``). Never raises: a replica must start, so a malformed
        number keeps its default (the renderer never writes one; only a hand-set spec ``env`` can)."""
        e = os.environ if environ is None else environ
        d, dt = PrefillPolicy(), ReplicaTelemetry()

        def num(name: str, default: float) -> float:
            try:
                v = float(e.get(name, default))
            except ValueError:
                return default
            return v if math.isfinite(v) else default

        def flag(name: str, default: bool) -> bool:
            v = e.get(name)
            return default if v is None else v.strip().lower() not in _FALSE

        return cls(
            facts_redis_url=e.get(ENV_FACTS_REDIS_URL) or None,
            prefill=PrefillPolicy(timeout_s=max(num(ENV_PREFILL_TIMEOUT_S, d.timeout_s), 0.001),
                                  attempts=max(int(num(ENV_PREFILL_ATTEMPTS, d.attempts)), 1),
                                  backoff_s=max(num(ENV_PREFILL_BACKOFF_S, d.backoff_s), 0.0),
                                  local_prefill=flag(ENV_LOCAL_PREFILL, d.local_prefill)),
            engine_executor=e.get(ENV_ENGINE_EXECUTOR) or None,
            engine_role=e.get(ENV_ENGINE_ROLE) or None,
            telemetry=ReplicaTelemetry(enabled=flag(ENV_TELEMETRY_ENABLED, dt.enabled),
                                       otlp_endpoint=e.get(ENV_TELEMETRY_OTLP_ENDPOINT) or None,
                                       service_name=e.get(ENV_TELEMETRY_SERVICE_NAME) or dt.service_name,
                                       link_bandwidth_gbps=num(ENV_TELEMETRY_LINK_BANDWIDTH_GBPS,
                                                               dt.link_bandwidth_gbps)),
        )

    def to_environ(self) -> dict[str, str]:
        """The variables for a replica's runtime env (unset optional values are left out)."""
        p, t = self.prefill, self.telemetry
        env = {
            ENV_PREFILL_TIMEOUT_S: repr(p.timeout_s),
            ENV_PREFILL_ATTEMPTS: str(p.attempts),
            ENV_PREFILL_BACKOFF_S: repr(p.backoff_s),
            ENV_LOCAL_PREFILL: "1" if p.local_prefill else "0",
            ENV_TELEMETRY_ENABLED: "true" if t.enabled else "false",
            ENV_TELEMETRY_SERVICE_NAME: t.service_name,
            ENV_TELEMETRY_LINK_BANDWIDTH_GBPS: repr(t.link_bandwidth_gbps),
        }
        if t.otlp_endpoint:
            env[ENV_TELEMETRY_OTLP_ENDPOINT] = t.otlp_endpoint
        if self.facts_redis_url:
            env[ENV_FACTS_REDIS_URL] = self.facts_redis_url
        if self.engine_executor:
            env[ENV_ENGINE_EXECUTOR] = self.engine_executor
        if self.engine_role:
            env[ENV_ENGINE_ROLE] = self.engine_role
        return env
