"""A checksum on every KV chunk LMCache keeps in a tier: KV that does not verify is a miss, never decoded on.

LMCache keeps KV chunks (one `MemoryObj` of `chunk_size` tokens each) in tiers: its remote backend
(Redis, the `fs` plugin, any other connector) and its local disk backend. Neither checks what it reads
back, so a chunk changed in the tier (a bit flip, a truncated write, another writer's bytes) goes
straight into vLLM's KV cache. Baton wraps the tiers of the engine's LMCache instance once its storage
manager exists (`install`):

- Remote tiers: the backend's connector is replaced by :class:`ChecksummedRemoteConnector`, which
  writes each chunk as a *frame* (`seal`): a header naming the chunk's shapes, dtypes and format, a
  BLAKE3 digest over the chunk key, the header and the KV bytes, then the KV bytes. The frame travels
  as LMCache's own `BINARY_BUFFER` object, so the connector stores it as it stores any object (Redis:
  `<key>kv_bytes` + `<key>metadata`; fs: one file with LMCache's metadata in front). Reading verifies
  the frame (`open_frame`) and copies the KV into an ordinary memory object of the original shape.
  Connectors that store the object's own length and shape carry a frame (Redis, fs with LMCache's
  default `save_chunk_meta`); one that reads back a fixed full-chunk size never verifies: all misses.
- Local disk tier: LMCache keeps that tier's index in process memory, so the digest of each chunk
  written is kept next to it, and what is read back from the file is checked against it.

A chunk whose frame is missing, short, malformed or whose digest does not match is returned as
*not found* (None). LMCache then retrieves only the prefix of chunks before it, vLLM's LMCache adapter
reports the blocks it did not get (`get_block_ids_with_load_errors`), and vLLM recomputes them under
`kv_load_failure_policy: recompute`. The entry is also removed from the tier when the connector can
(Redis, fs), so the recomputed KV is stored again by the next request that misses it. Each failure is
logged (WARNING, tier, tenant tag and a prefix of the chunk hash; never KV bytes or a salt) and counted
per tier, tenant tag and reason; the engine's vLLM connector hands the counts out as connector stats
(`baton.dataplane.kv_connector`), which reach Prometheus / Ray metrics as
``baton_kv_integrity_failures_total``.

Entries written before this check (no frame) are misses: a tier is never trusted without a digest.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import struct
import threading
from collections import Counter
from typing import Any
from urllib.parse import urlparse

import blake3
import torch
from lmcache.v1.memory_management import BytesBufferMemoryObj, MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.connector.instrumented_connector import InstrumentedRemoteConnector

log = logging.getLogger(__name__)

MAGIC = b"BKV1"
DIGEST_SIZE = 32
_PREFIX = struct.Struct("<4sI")  # magic, header length
_MAX_HEADER = 1 << 16
NO_TENANT = "none"
SPARE_BYTES = 64 << 20  # frame buffers kept for reuse per remote tier
COPYING_CONNECTORS = frozenset({"RedisConnector", "RedisSentinelConnector", "RedisClusterConnector", "FSConnector"})

#: Reasons a chunk fails its check (a label of the counter).
MISSING = "missing"  # no frame: written without a checksum, or the frame's start is damaged
MALFORMED = "malformed"  # a frame whose header cannot be read
SHORT = "short"  # fewer (or more) bytes than the header says
MISMATCH = "mismatch"  # the digest differs: the key, header or KV bytes changed


class IntegrityError(ValueError):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# -- frames -------------------------------------------------------------------------------------------


def _bytes_view(buf: Any) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _digest(key: str, header: bytes | memoryview, payload: memoryview) -> bytes:
    h = blake3.blake3()
    h.update(MAGIC)
    h.update(key.encode())
    h.update(b"\0")
    h.update(header)
    h.update(payload)
    return h.digest()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise IntegrityError(MALFORMED, f"dtype {name!r}")
    return dtype


def seal(key: str, memory_obj: MemoryObj, buffer: Any = None) -> bytearray:
    """The frame of one chunk: prefix, header, digest, KV bytes (one copy of the KV).

    ``buffer(size)`` may give the bytearray to write the frame into (reused frames: fresh memory of a
    chunk's size costs more to fault in than the copy itself)."""
    payload = _bytes_view(memory_obj.byte_array)
    header = json.dumps({
        "n": len(payload),
        "fmt": memory_obj.get_memory_format().name,
        "shapes": [list(s) for s in memory_obj.get_shapes()],
        "dtypes": [_dtype_name(d) for d in memory_obj.get_dtypes()],
    }, separators=(",", ":")).encode()
    start = _PREFIX.size + len(header) + DIGEST_SIZE
    frame = buffer(start + len(payload)) if buffer is not None else bytearray(start + len(payload))
    _PREFIX.pack_into(frame, 0, MAGIC, len(header))
    frame[_PREFIX.size:_PREFIX.size + len(header)] = header
    frame[start - DIGEST_SIZE:start] = _digest(key, header, payload)
    frame[start:] = payload
    return frame


def open_frame(key: str, frame: Any) -> tuple[dict[str, Any], memoryview]:
    """The header and KV bytes of a verified frame; raises :class:`IntegrityError` otherwise."""
    view = _bytes_view(frame)
    if len(view) < _PREFIX.size:
        raise IntegrityError(MISSING, f"{len(view)} bytes")
    magic, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise IntegrityError(MISSING)
    start = _PREFIX.size + header_len + DIGEST_SIZE
    if header_len > _MAX_HEADER or start > len(view):
        raise IntegrityError(SHORT if header_len <= _MAX_HEADER else MALFORMED, "header")
    header = view[_PREFIX.size:_PREFIX.size + header_len]
    payload = view[start:]
    try:
        meta = json.loads(bytes(header))
        n = int(meta["n"])
        fmt = MemoryFormat[meta["fmt"]]
        shapes = [torch.Size(int(d) for d in s) for s in meta["shapes"]]
        dtypes = [_dtype_of(d) for d in meta["dtypes"]]
    except IntegrityError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(MALFORMED, type(exc).__name__) from None
    if not hmac.compare_digest(bytes(view[start - DIGEST_SIZE:start]), _digest(key, header, payload)):
        # A wrong length is also caught here: the digest covers the header and every byte read.
        raise IntegrityError(SHORT if len(payload) != n else MISMATCH)
    if len(payload) != n or len(shapes) != len(dtypes) or not shapes:
        raise IntegrityError(MALFORMED, "sizes")
    return {"n": n, "fmt": fmt, "shapes": shapes, "dtypes": dtypes}, payload


class FrameMemoryObj(BytesBufferMemoryObj):  # type: ignore[misc]
    """A frame as LMCache's byte-buffer object, with one (empty) shape per KV group so that LMCache's
    remote metadata (sized for the engine's number of groups) can describe it."""

    def __init__(self, frame: bytearray, num_groups: int = 1):
        super().__init__(frame)
        self._groups = max(1, num_groups)

    def get_shapes(self) -> list[torch.Size]:
        return [torch.Size([len(self.raw_data), 0, 0, 0])] + [torch.Size([0, 0, 0, 0])] * (self._groups - 1)

    def get_dtypes(self) -> list[torch.dtype]:
        return [None] * self._groups  # type: ignore[list-item]


# -- failures -------------------------------------------------------------------------------------------

_lock = threading.Lock()
_pending: Counter[tuple[str, str, str]] = Counter()  # drained into the engine's connector stats
_totals: Counter[tuple[str, str, str]] = Counter()  # since the process started


def tenant_of(key: Any) -> str:
    """The LMCache tag `tenant` of a chunk key (`CacheEngineKey.tags`), or ``none``."""
    for name, value in getattr(key, "tags", None) or ():
        if name == "tenant":
            return str(value)
    return NO_TENANT


def _chunk_ref(key: Any) -> str:
    try:
        return f"{int(key.chunk_hash) & 0xFFFFFFFF:08x}"
    except (AttributeError, TypeError, ValueError):
        return "?"


def record_failure(tier: str, key: Any, reason: str) -> None:
    tenant = tenant_of(key)
    with _lock:
        _pending[(tier, tenant, reason)] += 1
        _totals[(tier, tenant, reason)] += 1
    log.warning("KV integrity check failed, chunk not loaded (recomputed): tier=%s tenant_tag=%s reason=%s chunk=%s",
                tier, tenant, reason, _chunk_ref(key))


def drain_failures() -> list[list[Any]]:
    """The failures counted since the last drain, as ``[tier, tenant_tag, reason, count]`` rows."""
    with _lock:
        rows = [[tier, tenant, reason, n] for (tier, tenant, reason), n in _pending.items()]
        _pending.clear()
    return rows


def failure_totals() -> dict[tuple[str, str, str], int]:
    with _lock:
        return dict(_totals)


# -- remote tiers ------------------------------------------------------------------------------------


def _checked_prefix(keys: list[Any], objs: list[Any], check: Any) -> list[MemoryObj]:
    """The longest prefix of chunks that pass ``check(key, obj)`` (LMCache's non-blocking contract: a
    retrieve ends at the first missing chunk); the objects after the first failure are released."""
    out: list[MemoryObj] = []
    for i, (key, obj) in enumerate(zip(keys, objs, strict=False)):
        good = check(key, obj)
        if good is None:
            for rest in objs[i + 1:]:
                if rest is not None:
                    _release(rest)
            break
        out.append(good)
    return out


def _release(obj: Any) -> None:
    try:
        obj.ref_count_down()
    except Exception:
        log.debug("could not release a memory object", exc_info=True)


class ChecksummedRemoteConnector(InstrumentedRemoteConnector):  # type: ignore[misc]
    """LMCache's instrumented remote connector, writing frames and returning only verified chunks.

    It takes the place of the `InstrumentedRemoteConnector` LMCache wraps each connector in (same
    statistics, same delegation of everything else), around the same real connector."""

    def __init__(self, connector: RemoteConnector, *, tier: str, allocator: Any, num_groups: int = 1):
        super().__init__(connector)
        self.tier = tier
        self._allocator = allocator
        self._num_groups = num_groups
        self._purges: set[asyncio.Task[None]] = set()
        self._spare: list[bytearray] = []
        self._spare_bytes = 0
        self._spare_lock = threading.Lock()
        self.name: str = f"ChecksummedRemoteConnector({connector})"

    # writes

    def _buffer(self, size: int) -> bytearray:
        with self._spare_lock:
            for i, buf in enumerate(self._spare):
                if len(buf) == size:
                    self._spare_bytes -= size
                    return self._spare.pop(i)
        return bytearray(size)

    def _recycle(self, frames: list[FrameMemoryObj]) -> None:
        """Keeps written frames' buffers for the next writes (at most SPARE_BYTES, or one buffer), for
        connectors known to have copied the bytes out once their put returns."""
        if type(self._connector).__name__ not in COPYING_CONNECTORS:
            return
        with self._spare_lock:
            for frame in frames:
                buf = frame.raw_data
                if self._spare and self._spare_bytes + len(buf) > SPARE_BYTES:
                    continue
                self._spare.append(buf)
                self._spare_bytes += len(buf)

    def _seal(self, key: Any, memory_obj: MemoryObj) -> FrameMemoryObj | None:
        try:
            return FrameMemoryObj(seal(key.to_string(), memory_obj, self._buffer), self._num_groups)
        except Exception as exc:
            log.warning("KV chunk not written to tier %s: no frame (%s)", self.tier, type(exc).__name__)
            return None

    async def put(self, key: Any, memory_obj: MemoryObj) -> None:
        try:
            frame = self._seal(key, memory_obj)
        finally:
            _release(memory_obj)  # the reference RemoteBackend handed to the put
        if frame is not None:
            await super().put(key, frame)
            self._recycle([frame])  # the put returned: the connector holds no reference to it any more

    async def batched_put(self, keys: list[Any], memory_objs: list[MemoryObj]) -> None:
        sealed_keys, frames = [], []
        for key, obj in zip(keys, memory_objs, strict=True):
            try:
                frame = self._seal(key, obj)
            finally:
                _release(obj)
            if frame is not None:
                sealed_keys.append(key)
                frames.append(frame)
        if frames:
            await super().batched_put(sealed_keys, frames)
            self._recycle(frames)

    # reads

    def _open(self, key: Any, frame_obj: MemoryObj | None) -> MemoryObj | None:
        if frame_obj is None:
            return None
        try:
            try:
                meta, payload = open_frame(key.to_string(), frame_obj.byte_array)
            except IntegrityError as exc:
                record_failure(self.tier, key, exc.reason)
                self._purge(key)
                return None
            obj = self._allocator.allocate(meta["shapes"], meta["dtypes"], meta["fmt"])
            if obj is None:
                log.debug("no memory for a KV chunk read from tier %s", self.tier)
                return None
            target = _bytes_view(obj.byte_array)
            if len(target) != meta["n"]:
                _release(obj)
                record_failure(self.tier, key, MALFORMED)
                self._purge(key)
                return None
            target[:] = payload
            return obj
        except Exception as exc:  # never raise into LMCache's retrieve: a miss is recomputed
            log.warning("KV chunk from tier %s not loaded (%s)", self.tier, type(exc).__name__)
            return None
        finally:
            _release(frame_obj)

    async def get(self, key: Any) -> MemoryObj | None:
        return self._open(key, await super().get(key))

    async def batched_get(self, keys: list[Any]) -> list[MemoryObj | None]:
        frames = await super().batched_get(keys)
        return [self._open(key, frame) for key, frame in zip(keys, frames, strict=True)]

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[Any]) -> list[MemoryObj]:
        """A prefix of the keys' chunks (LMCache's contract): it ends at the first chunk that fails."""
        frames = await super().batched_get_non_blocking(lookup_id, keys)
        return _checked_prefix(keys, frames, self._open)

    # a damaged entry is removed, so that the next miss stores the recomputed KV again

    def _purge(self, key: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the connector's event loop: nothing to schedule on
            return
        task = loop.create_task(self._purge_async(key))
        self._purges.add(task)  # a task nobody references may be collected before it runs
        task.add_done_callback(self._purges.discard)

    async def _purge_async(self, key: Any) -> None:
        raw = self._connector
        try:
            if type(raw).remove_sync is not RemoteConnector.remove_sync:
                raw.remove_sync(key)
                return
            client = getattr(raw, "connection", None)
            delete = getattr(client, "delete", None)
            if delete is not None and type(raw).__name__.startswith("Redis"):
                key_str = key.to_string()
                await delete(key_str + "kv_bytes", key_str + "metadata")
        except Exception:
            log.debug("damaged KV entry not removed from tier %s", self.tier, exc_info=True)


def remote_tier_name(backend: Any) -> str:
    plugin = getattr(backend, "plugin_name", None)
    if plugin:
        return str(plugin).split(".", 1)[0]
    scheme = urlparse(str(getattr(backend, "remote_url", "") or "")).scheme or "remote"
    if scheme in ("rediss", "unix") or scheme.startswith("redis"):
        return "redis"
    return scheme


def _num_groups(backend: Any) -> int:
    try:
        return int(backend.metadata.get_num_groups())
    except Exception:
        return 1


def _checksummed(connection: Any, backend: Any) -> ChecksummedRemoteConnector:
    raw = connection.getWrappedConnector() if isinstance(connection, InstrumentedRemoteConnector) else connection
    allocator = backend.local_cpu_backend
    return ChecksummedRemoteConnector(raw, tier=remote_tier_name(backend), allocator=allocator,
                                      num_groups=_num_groups(backend))


def wrap_remote_backend(backend: Any) -> str:
    """Checks every chunk `backend` (an LMCache `RemoteBackend`) reads; also after a reconnect."""
    if getattr(backend, "_baton_integrity", False):
        return remote_tier_name(backend)
    if not hasattr(backend, "connection") or not callable(getattr(backend, "init_connection", None)):
        raise RuntimeError("LMCache's RemoteBackend changed shape: KV integrity checks cannot be installed")

    def wrap_connection() -> None:
        conn = backend.connection
        if conn is not None and not isinstance(conn, ChecksummedRemoteConnector):
            backend.connection = _checksummed(conn, backend)

    reconnect = backend.init_connection  # a bound method of LMCache's class

    def init_connection() -> None:
        reconnect()
        wrap_connection()

    wrap_connection()
    backend.init_connection = init_connection  # LMCache's health monitor reconnects through it
    backend._baton_integrity = True
    return remote_tier_name(backend)


# -- local disk tier ---------------------------------------------------------------------------------

DISK_TIER = "disk"


def wrap_local_disk_backend(backend: Any) -> str:
    """Checks every chunk read back from LMCache's `LocalDiskBackend` against the digest of what it wrote.

    The tier's index lives in this process (LMCache's local disk backend is not shared nor kept across
    restarts), so the digests live beside it, one per entry, pruned as entries leave the index."""
    if getattr(backend, "_baton_integrity", False):
        return DISK_TIER
    for name in ("async_save_bytes_to_disk", "get_blocking", "batched_get_blocking", "batched_get_non_blocking"):
        if not callable(getattr(backend, name, None)):
            raise RuntimeError(f"LMCache's LocalDiskBackend has no {name}: KV integrity checks cannot be installed")
    digests: dict[Any, bytes] = {}
    digests_lock = threading.Lock()
    save, get_one, get_many, get_async = (backend.async_save_bytes_to_disk, backend.get_blocking,
                                          backend.batched_get_blocking, backend.batched_get_non_blocking)

    def digest_of(key: Any, obj: MemoryObj) -> bytes:
        return _digest(key.to_string(), b"", _bytes_view(obj.byte_array))

    def prune() -> None:
        index = getattr(backend, "dict", None)
        if index is not None and len(digests) > 2 * len(index) + 1024:
            for k in [k for k in digests if k not in index]:
                digests.pop(k, None)

    def async_save_bytes_to_disk(key: Any, memory_obj: MemoryObj, *args: Any, **kwargs: Any) -> Any:
        try:
            d = digest_of(key, memory_obj)
        except Exception:
            d = b""
        with digests_lock:
            digests[key] = d
            prune()
        return save(key, memory_obj, *args, **kwargs)

    def checked(key: Any, obj: MemoryObj | None) -> MemoryObj | None:
        if obj is None:
            return None
        with digests_lock:
            want = digests.get(key)
        try:
            ok = bool(want) and hmac.compare_digest(want, digest_of(key, obj))  # type: ignore[arg-type]
        except Exception:
            ok = False
        if ok:
            return obj
        _release(obj)
        record_failure(DISK_TIER, key, MISSING if not want else MISMATCH)
        try:
            backend.remove(key, force=True)
        except Exception:
            log.debug("damaged KV entry not removed from the disk tier", exc_info=True)
        return None

    def get_blocking(key: Any) -> MemoryObj | None:
        return checked(key, get_one(key))

    def batched_get_blocking(keys: list[Any]) -> list[MemoryObj | None]:
        if len(keys) <= 1:  # LMCache's batched read calls get_blocking (checked above) for one key
            return [get_blocking(k) for k in keys]
        return [checked(k, o) for k, o in zip(keys, get_many(keys), strict=True)]

    async def batched_get_non_blocking(lookup_id: str, keys: list[Any], *args: Any, **kwargs: Any) -> list[MemoryObj]:
        objs = await get_async(lookup_id, keys, *args, **kwargs)
        return _checked_prefix(keys, objs, checked)

    backend.async_save_bytes_to_disk = async_save_bytes_to_disk
    backend.get_blocking = get_blocking
    backend.batched_get_blocking = batched_get_blocking
    backend.batched_get_non_blocking = batched_get_non_blocking
    backend._baton_integrity = True
    return DISK_TIER


# -- installation ------------------------------------------------------------------------------------


def install_on_storage_manager(storage_manager: Any) -> list[str]:
    """Checks every tier of an LMCache storage manager; returns the tiers now checked.

    Raises when a tier Baton knows cannot be wrapped (an LMCache upgrade changed it): an engine must not
    serve KV from a tier it cannot check."""
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    tiers: list[str] = []
    for name, backend in list(getattr(storage_manager, "storage_backends", {}).items()):
        if isinstance(backend, RemoteBackend):
            tiers.append(wrap_remote_backend(backend))
        elif isinstance(backend, LocalDiskBackend):
            tiers.append(wrap_local_disk_backend(backend))
        elif not isinstance(backend, LocalCPUBackend):  # memory of this process: not re-read from a tier
            log.warning("LMCache tier %s is not checked: chunks read from it are not verified", name)
    if not getattr(storage_manager, "_baton_integrity", False):
        for method in ("create_backends", "recreate_backend"):  # LMCache's admin API can rebuild tiers
            original = getattr(storage_manager, method, None)
            if callable(original):
                setattr(storage_manager, method, _reinstalling(storage_manager, original))
        storage_manager._baton_integrity = True
    return tiers


def _reinstalling(storage_manager: Any, original: Any) -> Any:
    def method(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        install_on_storage_manager(storage_manager)
        return result

    return method


def install(engine: Any) -> list[str] | None:
    """Checks the tiers of an LMCache engine; None while its storage manager does not exist yet."""
    storage_manager = getattr(engine, "storage_manager", None)
    if storage_manager is None:
        return None
    tiers = install_on_storage_manager(storage_manager)
    if tiers:
        log.info("KV integrity checks on LMCache tiers: %s", ", ".join(tiers))
    return tiers
