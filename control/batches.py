"""The Batch API's use cases (docs/batch.md): files kept a part at a time, a batch checked into its lines,
the lines' claims and results, and a batch's end with its output and error files.

Called by the gateway (``/v1/files``, ``/v1/batches`` and its batch runner, which runs the lines through
the gateway's own pipeline) and by the worker's sweep (expired files; batches whose gateways are gone).
Every call here is blocking: the gateway runs them in a worker thread.

Exactly once: a line is claimed under a lease (``attempt`` is its fencing token) and its result is written
only by the attempt that still holds it; the output file is written from the lines, one row each, in one
transaction with the batch's end. A line that ran twice (its gateway died after the engine answered)
has one result, and one usage record: its request id is the line's, and usage rows are unique by it.
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import orjson

from baton.control.audit import audit
from baton.control.roles import TenantAction, authorize
from baton.control.usecase import Actor
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database, UnitOfWork

#: A batch line's ``url`` -> the gateway endpoint it runs on.
ENDPOINTS: dict[str, str] = {
    "/v1/chat/completions": "chat/completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
PURPOSES = ("batch", "batch_output")
COMPLETION_WINDOWS = {"24h": dt.timedelta(hours=24)}
#: Statuses after which nothing changes.
ENDED = ("completed", "failed", "expired", "cancelled")
#: How many of a file's problems a refusal lists.
MAX_LISTED_ERRORS = 10
LINE_ROWS = 1000  # lines inserted per statement


class BatchInputError(errors.ValidationError):
    code = "invalid_batch_input"


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def _ts(value: dt.datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


# -- files ----------------------------------------------------------------------------------------------


def file_json(f: m.StoredFile) -> dict[str, Any]:
    """A file as OpenAI's ``File`` object."""
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": _ts(f.created_at),
            "expires_at": _ts(f.expires_at), "filename": f.filename, "purpose": f.purpose,
            "status": "processed", "status_details": None}


def store_file(db: Database, *, tenant_id: uuid.UUID, key_id: uuid.UUID | None, purpose: str, filename: str,
               source: IO[bytes], part_bytes: int, max_bytes: int, max_lines: int) -> dict[str, Any]:
    """Stores ``source`` (read ``part_bytes`` at a time) as one file, in one transaction. A ``batch`` file
    must be JSON lines: its lines are counted and each must be a JSON object (the batch checks the rest)."""
    if purpose != "batch":
        raise errors.ValidationError(f"Files are uploaded with purpose `batch` (the Batch API's input); got "
                                     f"`{purpose}`.", param="purpose")
    if not filename or len(filename) > 255:
        raise errors.ValidationError("A file needs a name of at most 255 characters.", param="file")
    now = dt.datetime.now(dt.UTC)
    row = m.StoredFile(id=new_id("file-"), tenant_id=tenant_id, api_key_id=key_id, purpose=purpose,
                       filename=filename, created_at=now)
    lines = JsonLines()
    size = seq = 0
    with db.tenant(tenant_id) as uow:
        uow.files.add(row)
        while chunk := source.read(part_bytes):
            size += len(chunk)
            if size > max_bytes:
                raise errors.ValidationError(f"The file is larger than the {max_bytes / 2**20:.0f} MiB a batch "
                                             "file may be.", param="file")
            for _ in lines.feed(chunk):
                if lines.count > max_lines:
                    raise BatchInputError(f"A batch file may hold at most {max_lines:,} requests.", param="file")
            uow.files.add_part(row, seq, chunk)
            seq += 1
        for _ in lines.end():
            pass
        if lines.count > max_lines:
            raise BatchInputError(f"A batch file may hold at most {max_lines:,} requests.", param="file")
        if lines.problems:
            raise BatchInputError(_problems(lines.problems), param="file")
        if lines.count == 0:
            raise BatchInputError("The file holds no request: a batch file has one JSON object per line.",
                                  param="file")
        row.bytes, row.lines = size, lines.count
        uow.flush()
        uow.commit()
        return file_json(row)


def _problems(problems: list[str]) -> str:
    more = f" (and {len(problems) - MAX_LISTED_ERRORS} more)" if len(problems) > MAX_LISTED_ERRORS else ""
    return "The batch file is not valid: " + "; ".join(problems[:MAX_LISTED_ERRORS]) + more + "."


#: The longest line a batch file may hold: a request body larger than the gateway accepts (4 MiB by default)
#: could not run anyway, and a line is held whole in memory while it is read.
MAX_LINE_BYTES = 16 * 2**20


class JsonLines:
    """Splits a stream of bytes into JSON-object lines across chunk borders (blank lines skipped); notes
    each line that is not a JSON object (by its 1-based number). A line longer than ``max_line`` is noted
    and skipped as it arrives, never gathered: a file of one 200 MiB line would otherwise be copied whole at
    every chunk."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self.rest = b""
        self.skipping = False  # inside a line too long to keep
        self.number = 0  # lines seen, blank ones included
        self.count = 0  # requests (non-blank lines)
        self.problems: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
        if self.skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                return
            self.skipping, chunk = False, chunk[cut + 1:]
        *whole, self.rest = (self.rest + chunk).split(b"\n")
        for raw in whole:
            yield from self._one(raw)
        if len(self.rest) > self.max_line:
            self.number += 1
            self.count += 1
            self.problems.append(f"line {self.number} is longer than {self.max_line / 2**20:g} MiB")
            self.rest, self.skipping = b"", True

    def end(self) -> Iterator[tuple[int, dict[str, Any]]]:
        rest, self.rest = self.rest, b""
        if rest.strip() and not self.skipping:
            yield from self._one(rest)

    def _one(self, raw: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
        self.number += 1
        if not raw.strip():
            return
        self.count += 1
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.problems.append(f"line {self.number} is not JSON")
            return
        if not isinstance(value, dict):
            self.problems.append(f"line {self.number} is not a JSON object")
            return
        yield self.number, value


def read_parts(db: Database, tenant_id: uuid.UUID, file_id: str) -> Iterator[bytes]:
    """A file's bytes, a few parts per query (a generator: one part in memory at a time)."""
    after = -1
    while True:
        with db.tenant(tenant_id) as uow:
            parts = uow.files.parts(file_id, after=after)
        if not parts:
            return
        for seq, data in parts:
            after = seq
            yield data


def get_file(db: Database, tenant_id: uuid.UUID, file_id: str) -> dict[str, Any]:
    with db.tenant(tenant_id) as uow:
        row = uow.files.live(file_id, dt.datetime.now(dt.UTC))
        if row is None:
            raise errors.NotFoundError(f"No such File object: {file_id}", param="file_id")
        return file_json(row)


def list_files(db: Database, tenant_id: uuid.UUID, *, purpose: str | None, after: str | None, limit: int,
               order: str) -> dict[str, Any]:
    with db.tenant(tenant_id) as uow:
        rows = uow.files.listed(now=dt.datetime.now(dt.UTC), purpose=purpose, after=after, limit=limit + 1,
                              newest_first=order != "asc")
        data = [file_json(f) for f in rows[:limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}


def delete_file(db: Database, tenant_id: uuid.UUID, file_id: str) -> dict[str, Any]:
    with db.tenant(tenant_id) as uow:
        row = uow.files.live(file_id, dt.datetime.now(dt.UTC))
        if row is None:
            raise errors.NotFoundError(f"No such File object: {file_id}", param="file_id")
        uow.files.delete(row)
        uow.commit()
    return {"id": file_id, "object": "file", "deleted": True}


# -- batches ----------------------------------------------------------------------------------------------


def batch_json(b: m.Batch, counts: Mapping[str, int] | None = None) -> dict[str, Any]:
    """A batch as OpenAI's ``Batch`` object (``request_counts`` from its lines' states now)."""
    counts = counts or {}
    errs = {"object": "list", "data": b.errors} if b.errors else None
    return {
        "id": b.id, "object": "batch", "endpoint": _url_of(b.endpoint), "model": b.model, "errors": errs,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window, "status": b.status,
        "output_file_id": b.output_file_id, "error_file_id": b.error_file_id, "created_at": _ts(b.created_at),
        "in_progress_at": _ts(b.in_progress_at), "expires_at": _ts(b.expires_at),
        "finalizing_at": _ts(b.finalizing_at), "completed_at": _ts(b.completed_at), "failed_at": _ts(b.failed_at),
        "expired_at": _ts(b.expired_at), "cancelling_at": _ts(b.cancelling_at), "cancelled_at": _ts(b.cancelled_at),
        "request_counts": {"total": b.total, "completed": counts.get("done", 0), "failed": counts.get("failed", 0)},
        "metadata": b.metadata_,
    }


def _url_of(endpoint: str) -> str:
    return f"/v1/{endpoint}"


@dataclass(frozen=True)
class NewBatch:
    input_file_id: str
    endpoint: str  # the request's ``endpoint`` (a URL path)
    completion_window: str
    metadata: dict[str, str] | None


def create_batch(db: Database, *, tenant_id: uuid.UUID, key_id: uuid.UUID | None, req: NewBatch,
                 allowed: Iterable[str], max_lines: int) -> dict[str, Any]:
    """Checks the input file line by line and keeps its requests as the batch's lines, in one transaction.

    Each line must be ``{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}``
    with unique ``custom_id``s and one model the key may use for every line. A file that breaks any of
    this is refused whole (400, naming the first lines at fault); a body the endpoint refuses later fails
    only its line (its error in the batch's error file)."""
    endpoint = ENDPOINTS.get(req.endpoint)
    if endpoint is None:
        raise errors.ValidationError(f"Batches serve {', '.join(ENDPOINTS)}; not `{req.endpoint}`.",
                                     param="endpoint")
    window = COMPLETION_WINDOWS.get(req.completion_window)
    if window is None:
        raise errors.ValidationError(f"The completion window must be one of {', '.join(COMPLETION_WINDOWS)}.",
                                     param="completion_window")
    models = set(allowed)
    now = dt.datetime.now(dt.UTC)
    batch_id = new_id("batch_")
    with db.tenant(tenant_id) as uow:
        source = uow.files.live(req.input_file_id, now)
        if source is None:
            raise errors.NotFoundError(f"No such File object: {req.input_file_id}", param="input_file_id")
        if source.purpose != "batch":
            raise errors.ValidationError(f"The file {source.id} has purpose `{source.purpose}`; a batch reads a file "
                                         "uploaded with purpose `batch`.", param="input_file_id")
        batch = m.Batch(id=batch_id, tenant_id=tenant_id, api_key_id=key_id, endpoint=endpoint, model="",
                        input_file_id=source.id, completion_window=req.completion_window, status="in_progress",
                        metadata_=req.metadata, created_at=now, in_progress_at=now, expires_at=now + window)
        uow.batches.add(batch)
        check = LineCheck(req.endpoint, models)
        rows: list[dict[str, Any]] = []
        lines = JsonLines()
        for chunk in read_parts(db, tenant_id, source.id):
            for number, value in lines.feed(chunk):
                _keep(check, number, value, rows=rows, batch_id=batch_id, tenant_id=tenant_id, uow=uow)
        for number, value in lines.end():
            _keep(check, number, value, rows=rows, batch_id=batch_id, tenant_id=tenant_id, uow=uow)
        problems = lines.problems + check.problems
        if problems:
            raise BatchInputError(_problems(sorted(problems, key=_line_number)), param="input_file_id")
        if check.count == 0:
            raise BatchInputError("The batch file holds no request.", param="input_file_id")
        if check.count > max_lines:
            raise BatchInputError(f"A batch may hold at most {max_lines:,} requests.", param="input_file_id")
        uow.batches.add_lines(rows)
        batch.model, batch.total = check.model or "", check.count
        uow.flush()
        uow.commit()
        return batch_json(batch, {})


def _line_number(problem: str) -> int:
    try:
        return int(problem.split()[1])
    except (IndexError, ValueError):
        return 0


def _keep(check: LineCheck, number: int, value: dict[str, Any], *, rows: list[dict[str, Any]], batch_id: str,
          tenant_id: uuid.UUID, uow: UnitOfWork) -> None:
    line = check.line(number, value)
    if line is None or check.problems:
        return
    rows.append({"batch_id": batch_id, "line": number, "tenant_id": tenant_id, "custom_id": line[0],
                 "body": orjson.dumps(line[1]), "request_id": uuid.uuid4()})
    if len(rows) >= LINE_ROWS:
        uow.batches.add_lines(rows)
        rows.clear()


class LineCheck:
    """The structure of each line of a batch file (see :func:`create_batch`)."""

    def __init__(self, url: str, models: set[str]) -> None:
        self.url = url
        self.models = models
        self.model: str | None = None
        self.ids: set[str] = set()
        self.count = 0
        self.problems: list[str] = []

    def line(self, n: int, value: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        self.count += 1
        custom_id, body = value.get("custom_id"), value.get("body")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            return self._bad(n, "needs a `custom_id` text of 1 to 512 characters")
        if custom_id in self.ids:
            return self._bad(n, f"repeats the custom_id `{custom_id[:64]}` (each must be unique in the file)")
        self.ids.add(custom_id)
        if value.get("method", "POST") != "POST":
            return self._bad(n, "has a `method` other than POST")
        if value.get("url") != self.url:
            return self._bad(n, f"has the url `{str(value.get('url'))[:64]}`; this batch's endpoint is {self.url}")
        if not isinstance(body, dict):
            return self._bad(n, "needs a `body` object (the request)")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return self._bad(n, "names no `model` in its body")
        if self.model is None:
            if model not in self.models:
                return self._bad(n, f"names the model `{model[:100]}`, which does not exist or this key may not use")
            self.model = model
        elif model != self.model:
            return self._bad(n, f"names the model `{model[:100]}`; a batch runs one model (`{self.model}` above)")
        if body.get("stream"):
            return self._bad(n, "asks for a stream; batch requests are answered whole (omit `stream`)")
        return custom_id, body

    def _bad(self, n: int, why: str) -> tuple[str, dict[str, Any]] | None:
        if len(self.problems) <= MAX_LISTED_ERRORS:
            self.problems.append(f"line {n} {why}")
        return None


def get_batch(db: Database, tenant_id: uuid.UUID, batch_id: str) -> dict[str, Any]:
    with db.tenant(tenant_id) as uow:
        b = uow.batches.get(batch_id)
        if b is None:
            raise errors.NotFoundError(f"No such Batch object: {batch_id}", param="batch_id")
        return batch_json(b, uow.batches.counts([b.id]).get(b.id))


def list_batches(db: Database, tenant_id: uuid.UUID, *, after: str | None, limit: int) -> dict[str, Any]:
    with db.tenant(tenant_id) as uow:
        rows = uow.batches.listed(after=after, limit=limit + 1)
        shown = list(rows[:limit])
        counts = uow.batches.counts([b.id for b in shown])
        data = [batch_json(b, counts.get(b.id)) for b in shown]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}


def cancel_batch(db: Database, tenant_id: uuid.UUID, batch_id: str) -> dict[str, Any]:
    """Stops the batch's dispatch: lines not started end ``cancelled``; lines running finish and are kept;
    the batch ends ``cancelled`` with its output and error files once they have (:func:`finalize_ready`)."""
    now = dt.datetime.now(dt.UTC)
    with db.tenant(tenant_id) as uow:
        b = uow.batches.get(batch_id)
        if b is None:
            raise errors.NotFoundError(f"No such Batch object: {batch_id}", param="batch_id")
        if b.status in ("in_progress", "validating"):
            b.status, b.cancelling_at = "cancelling", now
            uow.batches.end_open_lines(b.id, state="cancelled", now=now, running_too=False, error={
                "code": "batch_cancelled", "message": "The batch was cancelled before this request ran."})
            uow.flush()
            uow.commit()
        elif b.status not in ("cancelling", "cancelled"):
            raise errors.ConflictError(f"Cannot cancel a batch with status '{b.status}'.", param="batch_id")
        return batch_json(b, uow.batches.counts([b.id]).get(b.id))


def cancel_batch_for(db: Database, tenant_id: uuid.UUID, batch_id: str, *, actor: Actor) -> dict[str, Any]:
    """:func:`cancel_batch` for a person of the tenant (the console): only a role that may cancel batches
    (:mod:`baton.control.roles`), and audited (``batch.cancel``, in a transaction of its own after the
    cancel's) when this call is the one that stopped the batch."""
    authorize(actor.role, TenantAction.CANCEL_BATCHES)
    before = get_batch(db, tenant_id, batch_id)
    out = cancel_batch(db, tenant_id, batch_id)
    if out["status"] != before["status"]:
        named = {"name": batch_id, "model": out["model"]}  # the audit log names a target from ``name``
        with db.tenant(tenant_id) as uow:
            audit(uow, actor, "batch.cancel", "batch", batch_id, tenant_id=tenant_id,
                  before={**named, "status": before["status"]}, after={**named, "status": out["status"]})
            uow.commit()
    return out


# -- the operators' view -------------------------------------------------------------------------------------

#: How many open batches the operators' view lists, all models together.
OPEN_LISTED = 200


def batches_by_model(db: Database, *, since: dt.datetime, limit: int = OPEN_LISTED) -> dict[str, Any]:
    """Every tenant's batches per model: those still open or created since ``since`` counted by status and
    their lines by state, and the open ones (oldest first, at most ``limit`` in all) with their tenant and
    progress. ``more``: open batches were left out."""
    with db.system() as uow:
        models: dict[str, dict[str, Any]] = {}

        def of(model: str) -> dict[str, Any]:
            return models.setdefault(model, {"model": model, "batches": {}, "lines": {}, "open": []})

        for model, status, n in uow.batches.status_by_model(since=since):
            of(model)["batches"][status] = n
        for model, state, n in uow.batches.lines_by_model(since=since):
            of(model)["lines"][state] = n
        listed = uow.batches.open_with_tenants(limit=limit + 1)
        counts = uow.batches.counts([b.id for b, _, _ in listed[:limit]])
        for b, name, display in listed[:limit]:
            of(b.model)["open"].append({**batch_json(b, counts.get(b.id)), "tenant_id": str(b.tenant_id),
                                        "tenant_name": name, "tenant_display_name": display})
    return {"since": since.isoformat(), "models": [models[k] for k in sorted(models)], "more": len(listed) > limit}


# -- running the lines --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """A line this runner holds (``attempt``: its fencing token)."""

    batch_id: str
    line: int
    attempt: int
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    endpoint: str
    custom_id: str
    body: bytes  # the request's JSON
    request_id: uuid.UUID

    @property
    def held(self) -> tuple[str, int, int]:
        return self.batch_id, self.line, self.attempt


def running_models(db: Database) -> list[str]:
    with db.system() as uow:
        return uow.batches.running_models()


def claim(db: Database, *, models: list[str], limit: int, lease_s: float) -> list[Claimed]:
    with db.system() as uow:
        rows = uow.batches.claim(models=models, limit=limit, lease_s=lease_s, now=dt.datetime.now(dt.UTC))
        uow.commit()
    return [Claimed(**r) for r in rows]


def renew(db: Database, held: list[tuple[str, int, int]], *, lease_s: float) -> int:
    with db.system() as uow:
        n = uow.batches.renew(held, lease_until=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=lease_s))
        uow.commit()
    return n


def finish(db: Database, line: Claimed, *, ok: bool, response: dict[str, Any],
           usage: dict[str, Any] | None = None) -> bool:
    """The line's answer (``response``: OpenAI's ``{"status_code", "request_id", "body"}``, the body as an
    ``orjson.Fragment`` of the answer's bytes or as a value), if this attempt still holds it, and its usage
    row (a ``usage_records`` row, unique by the line's request id) in the same transaction: a line whose
    result is kept is metered, once, whatever happens to the process that ran it next."""
    with db.system() as uow:
        kept = uow.batches.finish_line(line.batch_id, line.line, line.attempt, state="done" if ok else "failed",
                                       response=orjson.dumps(response), error=None, now=dt.datetime.now(dt.UTC))
        if kept and usage is not None:
            uow.usage.insert_many([usage])
        uow.commit()
    return kept


@dataclass(frozen=True, slots=True)
class Result:
    """One line's answer for :func:`finish_many` (see :func:`finish`)."""

    line: Claimed
    ok: bool
    response: dict[str, Any]
    usage: dict[str, Any] | None = None


def finish_many(db: Database, results: list[Result]) -> list[bool]:
    """:func:`finish` of many lines in one transaction (two statements: the results, then the usage rows of
    the kept ones): a runner's results written as they come in, a group at a time. Whether each was kept."""
    with db.system() as uow:
        kept = uow.batches.finish_lines([(r.line.batch_id, r.line.line, r.line.attempt, "done" if r.ok else "failed",
                                          orjson.dumps(r.response)) for r in results], now=dt.datetime.now(dt.UTC))
        held = [(r.line.batch_id, r.line.line) in kept for r in results]
        usage = [r.usage for r, k in zip(results, held, strict=True) if k and r.usage is not None]
        if usage:
            uow.usage.insert_many(usage)
        uow.commit()
    return held


def put_back(db: Database, line: Claimed, *, after_s: float) -> bool:
    with db.system() as uow:
        kept = uow.batches.put_back(line.batch_id, line.line, line.attempt,
                                    not_before=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=after_s))
        uow.commit()
    return kept


# -- a batch's end ------------------------------------------------------------------------------------------


def finalize_ready(db: Database, *, part_bytes: int, retention: dt.timedelta, limit: int = 4) -> list[str]:
    """Ends the batches that are done (every line ended), past their window (``expired``: lines not run end
    ``batch_expired``) or cancelled with nothing left running: writes their output and error files and
    their final status, each in one transaction. Safe to call from many processes at once (``SKIP
    LOCKED``). Returns the ids ended."""
    ended: list[str] = []
    while len(ended) < limit:
        with db.system() as uow:
            now = dt.datetime.now(dt.UTC)
            found = uow.batches.to_finalize(now=now, limit=1)
            if not found:
                return ended
            b = found[0]
            _finalize(uow, b, now=now, part_bytes=part_bytes, retention=retention)
            uow.commit()
            ended.append(b.id)
    return ended


def _finalize(uow: UnitOfWork, b: m.Batch, *, now: dt.datetime, part_bytes: int, retention: dt.timedelta) -> None:
    if b.status == "cancelling":
        final = "cancelled"
        uow.batches.end_open_lines(b.id, state="cancelled", now=now, running_too=True, error={
            "code": "batch_cancelled", "message": "The batch was cancelled before this request finished."})
    elif b.expires_at <= now and uow.batches.open_lines(b.id):
        final = "expired"
        uow.batches.end_open_lines(b.id, state="expired", now=now, running_too=True, error={
            "code": "batch_expired", "message": "This request could not be run before the batch expired."})
    else:
        final = "completed"
    b.finalizing_at = now
    expires = now + retention
    b.output_file_id = _write_lines(uow, b, ("done",), f"{b.id}_output.jsonl", now=now, expires=expires,
                                    part_bytes=part_bytes)
    b.error_file_id = _write_lines(uow, b, ("failed", "expired", "cancelled"), f"{b.id}_error.jsonl", now=now,
                                   expires=expires, part_bytes=part_bytes)
    b.status = final
    setattr(b, f"{final}_at", now)
    uow.flush()


def output_line(line: m.BatchLine) -> bytes:
    """One line of a batch's output or error file, as OpenAI writes it."""
    response = orjson.Fragment(line.response) if line.response is not None else None
    return orjson.dumps({"id": f"batch_req_{line.request_id.hex}", "custom_id": line.custom_id,
                         "response": response, "error": line.error}) + b"\n"


def _write_lines(uow: UnitOfWork, b: m.Batch, states: tuple[str, ...], filename: str, *, now: dt.datetime,
                 expires: dt.datetime, part_bytes: int) -> str | None:
    """A file of the batch's lines in ``states`` (in the input's order), a part at a time; None if none."""
    f: m.StoredFile | None = None
    buf = bytearray()
    seq = size = 0
    after = 0
    while True:
        page = uow.batches.lines_of(b.id, states=states, after=after, limit=500)
        if not page:
            break
        for line in page:
            after = line.line
            buf += output_line(line)
            if len(buf) >= part_bytes:
                f = f or uow.files.add(_output_file(b, filename, now, expires))
                uow.files.add_part(f, seq, bytes(buf))
                seq, size = seq + 1, size + len(buf)
                buf.clear()
            uow.session.expunge(line)  # one page of lines in memory at a time
    if buf:
        f = f or uow.files.add(_output_file(b, filename, now, expires))
        uow.files.add_part(f, seq, bytes(buf))
        size += len(buf)
    if f is None:
        return None
    f.bytes = size
    return f.id


def _output_file(b: m.Batch, filename: str, now: dt.datetime, expires: dt.datetime) -> m.StoredFile:
    return m.StoredFile(id=new_id("file-"), tenant_id=b.tenant_id, api_key_id=b.api_key_id, purpose="batch_output",
                        filename=filename, created_at=now, expires_at=expires)


def delete_expired_files(db: Database) -> int:
    with db.system() as uow:
        n = uow.files.delete_expired(dt.datetime.now(dt.UTC))
        uow.commit()
    return n
