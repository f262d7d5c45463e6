"""``/v1/files`` and ``/v1/batches``: the Batch API in OpenAI's shapes (docs/batch.md), tenant-scoped.

A file is stored a part at a time (the upload spools to disk, never whole in memory; its parts go to
Postgres in one transaction) and read back the same way. A batch's lines run in the gateways' batch
runners (:mod:`baton.api.gateway.batch_runner`), below every interactive request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response, StreamingResponse

from baton.api.gateway.routes import PrincipalDep
from baton.api.gateway.schemas import ERROR_RESPONSES
from baton.control import batches as use
from baton.core import errors
from baton.core.db import Database
from baton.core.settings import BatchSettings

router = APIRouter(prefix="/v1", tags=["Batch API"])


def _db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def _settings(request: Request) -> BatchSettings:
    settings: BatchSettings = request.app.state.settings.gateway.batch
    return settings


DbDep = Annotated[Database, Depends(_db)]
SettingsDep = Annotated[BatchSettings, Depends(_settings)]


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


# -- files ----------------------------------------------------------------------------------------------


@router.post("/files", responses=ERROR_RESPONSES, summary="Upload a file (purpose `batch`: a batch's requests, JSONL)")
async def create_file(file: Annotated[UploadFile, File(description="The JSONL file")],
                      purpose: Annotated[str, Form(description="`batch`")], *, principal: PrincipalDep, db: DbDep,
                      settings: SettingsDep) -> Response:
    try:
        body = await asyncio.to_thread(
            use.store_file, db, tenant_id=principal.tenant_id, key_id=principal.key_id, purpose=purpose,
            filename=file.filename or "upload.jsonl", source=file.file, part_bytes=settings.part_bytes,
            max_bytes=settings.max_file_bytes, max_lines=settings.max_lines)
    finally:
        await file.close()
    return _json(body)


@router.get("/files", responses=ERROR_RESPONSES, summary="List your files")
async def list_files(*, principal: PrincipalDep, db: DbDep, purpose: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000, after: str | None = None,
                     order: Literal["asc", "desc"] = "desc") -> Response:
    return _json(await asyncio.to_thread(use.list_files, db, principal.tenant_id, purpose=purpose, after=after,
                                         limit=limit, order=order))


@router.get("/files/{file_id}", responses=ERROR_RESPONSES, summary="Describe one file")
async def get_file(file_id: str, principal: PrincipalDep, db: DbDep) -> Response:
    return _json(await asyncio.to_thread(use.get_file, db, principal.tenant_id, file_id))


@router.get("/files/{file_id}/content", responses=ERROR_RESPONSES, summary="A file's bytes")
async def file_content(file_id: str, principal: PrincipalDep, db: DbDep) -> Response:
    await asyncio.to_thread(use.get_file, db, principal.tenant_id, file_id)  # 404 before the stream starts
    parts: Iterator[bytes] = use.read_parts(db, principal.tenant_id, file_id)
    return StreamingResponse(parts, media_type="application/octet-stream")


@router.delete("/files/{file_id}", responses=ERROR_RESPONSES, summary="Delete a file")
async def delete_file(file_id: str, principal: PrincipalDep, db: DbDep) -> Response:
    return _json(await asyncio.to_thread(use.delete_file, db, principal.tenant_id, file_id))


# -- batches --------------------------------------------------------------------------------------------


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=64)
    endpoint: str = Field(description="`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings` or "
                                      "`/v1/responses`")
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)


@router.post("/batches", responses=ERROR_RESPONSES, summary="Create a batch from an uploaded file")
async def create_batch(req: BatchRequest, principal: PrincipalDep, db: DbDep, settings: SettingsDep,
                       request: Request) -> Response:
    for key, value in (req.metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise errors.ValidationError("Metadata keys are at most 64 characters and values at most 512.",
                                         param="metadata")
    allowed = [name for name, grant in principal.models.items()
               if (grant.kind == "embed") == (req.endpoint == "/v1/embeddings")]
    body = await asyncio.to_thread(
        use.create_batch, db, tenant_id=principal.tenant_id, key_id=principal.key_id,
        req=use.NewBatch(req.input_file_id, req.endpoint, req.completion_window, req.metadata), allowed=allowed,
        max_lines=settings.max_lines)
    _poke(request)
    return _json(body)


@router.get("/batches", responses=ERROR_RESPONSES, summary="List your batches, newest first")
async def list_batches(principal: PrincipalDep, db: DbDep, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                       after: str | None = None) -> Response:
    return _json(await asyncio.to_thread(use.list_batches, db, principal.tenant_id, after=after, limit=limit))


@router.get("/batches/{batch_id}", responses=ERROR_RESPONSES, summary="A batch, with its progress")
async def get_batch(batch_id: str, principal: PrincipalDep, db: DbDep) -> Response:
    return _json(await asyncio.to_thread(use.get_batch, db, principal.tenant_id, batch_id))


@router.post("/batches/{batch_id}/cancel", responses=ERROR_RESPONSES, summary="Cancel a batch")
async def cancel_batch(batch_id: str, principal: PrincipalDep, db: DbDep, request: Request) -> Response:
    body = await asyncio.to_thread(use.cancel_batch, db, principal.tenant_id, batch_id)
    _poke(request)  # the batch ends as soon as its running lines have
    return _json(body)


def _poke(request: Request) -> None:
    runner = getattr(request.app.state, "batch_runner", None)
    if runner is not None:
        runner.poke()
