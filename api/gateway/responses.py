"""``/v1/responses``: OpenAI's Responses API (text), served by Baton's gateway over its chat path.

Why here: Ray Serve LLM's ingress has no Responses endpoint, and vLLM's own implementation would run
behind Baton's chat relay without its keys, limits, metering, resume or tracing. So a Responses request
becomes a chat completion (``instructions`` as the system message, the stored conversation of
``previous_response_id`` before the new input, ``max_output_tokens`` as ``max_tokens``) that goes through
the same :meth:`Gateway.prepare_chat` and :meth:`Gateway.forward` as ``/v1/chat/completions``; its answer
is turned back into a Response object, or a stream of Responses events (``response.created`` ...
``response.output_text.delta`` ... ``response.completed``) built from the chat chunks as they pass.

With ``store`` (OpenAI's default: true) the answer and its conversation are kept in Postgres
(``stored_responses``, tenant-scoped under row-level security) until ``gateway.responses_retention_days``
have passed: ``GET``/``DELETE /v1/responses/{id}`` and a later ``previous_response_id`` find it. As in
OpenAI's API, the ``instructions`` of an earlier response are not carried into the next one.

Served: text input (a string, or messages whose content is text), ``instructions``, ``max_output_tokens``,
``temperature``, ``top_p``, ``text.format`` (text, JSON object, JSON schema), ``metadata``, ``user``,
``stream``, ``store``, ``previous_response_id``. Refused with a 400 naming the field: tools, reasoning,
background mode, non-text input.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from baton.api.gateway.sse import SSEFrames, events
from baton.api.gateway.tokens import InvalidTextError, surrogate_path
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database

log = logging.getLogger(__name__)

_INT32 = 2**31 - 1


class ResponseRequest(BaseModel):
    """``POST /v1/responses``"""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, max_length=200)
    input: str | list[dict[str, Any]] = Field(..., description="Text, or a list of messages whose content is text.")
    instructions: str | None = Field(None, description="A system message for this response only.")
    max_output_tokens: int | None = Field(None, ge=1, le=_INT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: StrictBool | None = False
    store: StrictBool | None = True
    previous_response_id: str | None = Field(None, max_length=64)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = Field(None, max_length=256)
    text: dict[str, Any] | None = None
    # accepted with the values that mean "nothing special" (the SDK may send them)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = None
    service_tier: Literal["auto", "default"] | None = None
    reasoning: dict[str, Any] | None = None
    background: StrictBool | None = None


#: The chat request's fields a refusal may name, as a Responses request calls them.
_CHAT_FIELDS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                "messages": "input"}


def _unsupported(message: str, param: str) -> errors.ValidationError:
    return errors.ValidationError(message, param=param)


_TEXT_PARTS = {"input_text", "output_text", "text"}
_ROLES = {"user", "assistant", "system", "developer"}


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's ``input`` as chat messages (text only)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not value:
        raise errors.ValidationError("Give at least one input item.", param="input")
    out = []
    for i, item in enumerate(value):
        kind = item.get("type", "message")
        if kind != "message":
            raise _unsupported(f"Input items of type '{kind}' are not supported; send messages with text.",
                               f"input[{i}].type")
        role = item.get("role")
        if role not in _ROLES:
            raise errors.ValidationError(f"Choose one of: {', '.join(sorted(_ROLES))}.", param=f"input[{i}].role")
        content = item.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS or not isinstance(
                        part.get("text"), str):
                    raise _unsupported("Only text content is supported (parts of type input_text).",
                                       f"input[{i}].content[{j}]")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise errors.ValidationError("This must be text or a list of text parts.", param=f"input[{i}].content")
        out.append({"role": role, "content": content})
    return out


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "response",
                                                        "schema": fmt["schema"], "strict": bool(fmt.get("strict"))}}
    raise errors.ValidationError("Use a format of type text, json_object or json_schema (with a schema).",
                                 param="text.format")


def check_request(req: ResponseRequest) -> None:
    """What Baton does not serve through this endpoint yet: a 400 naming the field."""
    if req.tools:
        raise _unsupported("Tools are not supported through the Responses API yet; use /v1/chat/completions.",
                           "tools")
    if isinstance(req.tool_choice, dict) or req.tool_choice not in (None, "none", "auto"):
        raise _unsupported("Tools are not supported through the Responses API yet.", "tool_choice")
    if req.reasoning:
        raise _unsupported("Reasoning settings are not supported.", "reasoning")
    if req.background:
        raise _unsupported("Background responses are not supported.", "background")
    if req.include:
        raise _unsupported("No extra output can be included.", "include")


def chat_payload(req: ResponseRequest, history: list[dict[str, Any]],
                 new: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion that answers ``req``."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history + new
    payload: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.max_output_tokens is not None:
        payload["max_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p", "user"):
        value = getattr(req, name)
        if value is not None:
            payload[name] = value
    fmt = _response_format(req.text)
    if fmt is not None:
        payload["response_format"] = fmt
    if req.stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    return payload


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(chat_usage, dict):
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    prompt, completion = int(chat_usage.get("prompt_tokens") or 0), int(chat_usage.get("completion_tokens") or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0)},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


@dataclass
class Draft:
    """One response being made: what its object says, filled in as the answer arrives."""

    req: ResponseRequest
    id: str
    message_id: str
    created_at: int
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    @classmethod
    def of(cls, req: ResponseRequest) -> Draft:
        return cls(req=req, id=new_id("resp"), message_id=new_id("msg"), created_at=int(time.time()))

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def item(self, status: str) -> dict[str, Any]:
        content = [self.part()] if status != "in_progress" else []
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant", "content": content}

    @property
    def status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def body(self, status: str | None = None) -> dict[str, Any]:
        status = status or self.status
        req = self.req
        done = status in ("completed", "incomplete")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": req.model, "output": [self.item(status)] if done else [],
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "previous_response_id": req.previous_response_id,
            "store": bool(req.store), "metadata": req.metadata or {}, "user": req.user, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "truncation": "disabled",
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "usage": self.usage if done else None,
        }


class ResponseStore:
    """Stored responses in Postgres (blocking calls run in a worker thread)."""

    def __init__(self, db: Database, *, retention_days: float) -> None:
        self.db = db
        self.retention = dt.timedelta(days=retention_days)

    def _conversation(self, tenant_id: Any, response_id: str) -> list[dict[str, Any]] | None:
        with self.db.tenant(tenant_id) as uow:
            row = uow.responses.live(response_id, dt.datetime.now(dt.UTC))
            return list(row.conversation) if row is not None else None

    async def conversation(self, tenant_id: Any, response_id: str) -> list[dict[str, Any]]:
        """The conversation of a stored response, for ``previous_response_id`` (404 when gone)."""
        found = await asyncio.to_thread(self._conversation, tenant_id, response_id)
        if found is None:
            raise errors.NotFoundError(f"Previous response with id '{response_id}' not found.",
                                       param="previous_response_id")
        return found

    def _save(self, row: m.StoredResponse) -> None:
        with self.db.tenant(row.tenant_id) as uow:
            uow.responses.add(row)
            uow.commit()

    async def save(self, *, tenant_id: Any, key_id: Any, draft: Draft, conversation: list[dict[str, Any]]) -> bool:
        """Keeps the finished response; False (logged) if Postgres refused: the client still gets its answer."""
        now = dt.datetime.now(dt.UTC)
        row = m.StoredResponse(id=draft.id, tenant_id=tenant_id, api_key_id=key_id, model=draft.req.model,
                               previous_response_id=draft.req.previous_response_id,
                               conversation=[*conversation, {"role": "assistant", "content": draft.text}],
                               body=draft.body(), created_at=now, expires_at=now + self.retention)
        try:
            await asyncio.to_thread(self._save, row)
        except Exception as exc:  # the answer is already the client's; only later look-ups miss it
            log.error("response %s not stored (%s)", draft.id, type(exc).__name__)
            return False
        return True

    def _get(self, tenant_id: Any, response_id: str) -> dict[str, Any] | None:
        with self.db.tenant(tenant_id) as uow:
            row = uow.responses.live(response_id, dt.datetime.now(dt.UTC))
            return dict(row.body) if row is not None else None

    async def get(self, tenant_id: Any, response_id: str) -> dict[str, Any]:
        found = await asyncio.to_thread(self._get, tenant_id, response_id)
        if found is None:
            raise errors.NotFoundError(f"No response with id '{response_id}'.", param="response_id")
        return found

    def _delete(self, tenant_id: Any, response_id: str) -> bool:
        with self.db.tenant(tenant_id) as uow:
            row = uow.responses.live(response_id, dt.datetime.now(dt.UTC))
            if row is None:
                return False
            uow.responses.delete(row)
            uow.commit()
            return True

    async def delete(self, tenant_id: Any, response_id: str) -> None:
        if not await asyncio.to_thread(self._delete, tenant_id, response_id):
            raise errors.NotFoundError(f"No response with id '{response_id}'.", param="response_id")


def _event(kind: str, seq: int, fields: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, "sequence_number": seq, **fields}) \
        + b"\n\n"


class ResponsesStream(Response):
    """Wraps the chat relay (an ASGI response) and turns its chat chunks into Responses events as they pass;
    the relay keeps doing the resume, metering and tracing. On the chat stream's end the response is stored
    (when asked) before ``response.completed`` is sent, so a follow-up can name it at once."""

    def __init__(self, relay: Any, draft: Draft, *, on_done: Any) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = getattr(relay, "raw_headers", [])
        self.relay = relay
        self.draft = draft
        self.on_done = on_done  # async (draft) -> None, called once with the finished draft
        self.seq = 0
        self.frames = SSEFrames()
        self.failed = False

    def _ev(self, kind: str, **fields: Any) -> bytes:
        out = _event(kind, self.seq, fields)
        self.seq += 1
        return out

    def _opening(self) -> bytes:
        d = self.draft
        where = {"item_id": d.message_id, "output_index": 0, "content_index": 0}
        return (self._ev("response.created", response=d.body("in_progress"))
                + self._ev("response.in_progress", response=d.body("in_progress"))
                + self._ev("response.output_item.added", output_index=0, item=d.item("in_progress"))
                + self._ev("response.content_part.added", **where,
                           part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))

    async def _closing(self) -> bytes:
        d = self.draft
        where = {"item_id": d.message_id, "output_index": 0, "content_index": 0}
        head = (self._ev("response.output_text.done", **where, text=d.text, logprobs=[])
                + self._ev("response.content_part.done", **where, part=d.part())
                + self._ev("response.output_item.done", output_index=0, item=d.item(d.status)))
        await self.on_done(d)
        kind = "response.completed" if d.status == "completed" else "response.incomplete"
        return head + self._ev(kind, response=d.body())

    async def _translate(self, data: bytes) -> bytes:
        out = b""
        for raw in events(self.frames.feed(data)):
            out += await self._one(raw)
        return out

    async def _one(self, raw: bytes) -> bytes:
        is_error = False
        payload = b""
        for line in raw.split(b"\n"):
            if line.startswith(b"event:") and line[6:].strip() == b"error":
                is_error = True
            elif line.startswith(b"data:"):
                payload += line[5:].strip()
        if not payload:
            return b""
        if payload == b"[DONE]":
            return b"" if self.failed else await self._closing()
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if is_error or (isinstance(obj, dict) and "error" in obj):
            self.failed = True
            err = obj.get("error", {}) if isinstance(obj, dict) else {}
            message = err.get("message") if isinstance(err, dict) else None
            code = err.get("code") if isinstance(err, dict) else None
            failed = {**self.draft.body("failed"), "error": {"code": code or "server_error",
                                                             "message": message or "The model failed to answer."}}
            return self._ev("error", code=code, message=message, param=None) + self._ev("response.failed",
                                                                                          response=failed)
        out = b""
        if isinstance(obj.get("usage"), dict):
            self.draft.usage = usage_of(obj["usage"])
        for choice in obj.get("choices") or ():
            delta = (choice.get("delta") or {}).get("content")
            if delta:
                self.draft.text += delta
                out += self._ev("response.output_text.delta", item_id=self.draft.message_id, output_index=0,
                                content_index=0, delta=delta, logprobs=[])
            if choice.get("finish_reason"):
                self.draft.finish_reason = choice["finish_reason"]
        return out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def translated(message: Message) -> None:
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": self._opening(), "more_body": True})
                return
            if message["type"] == "http.response.body":
                body = await self._translate(message.get("body", b""))
                if body or not message.get("more_body", False):
                    await send({**message, "body": body})
                return
            await send(message)

        await self.relay(scope, receive, translated)


async def create(gateway: Any, principal: Any, req: ResponseRequest, *, traceparent: str | None,
                 auth_ns: tuple[int, int] | None, line: Any = None) -> Any:
    """One ``POST /v1/responses``: a Response object, or the stream of its events. ``line``: the
    :class:`~baton.api.gateway.service.BatchLineRef` it runs as a batch line (None: a client's request)."""
    check_request(req)
    store: ResponseStore | None = gateway.responses
    if (req.store or req.previous_response_id) and store is None:
        raise errors.UnavailableError("Stored responses are not available on this gateway.")
    principal.model(req.model)  # an unknown model is a 404 before any look-up
    history: list[dict[str, Any]] = []
    if req.previous_response_id:
        assert store is not None
        history = await store.conversation(principal.tenant_id, req.previous_response_id)
    new = input_messages(req.input)
    try:
        call = await gateway.prepare_chat(principal, chat_payload(req, history, new))
    except InvalidTextError:  # name the field of this request, not of the chat request it became
        raise InvalidTextError(surrogate_path(req.model_dump(exclude_none=True))) from None
    except errors.ClientError as exc:  # the same: a limit names the chat field it was checked on
        name = _CHAT_FIELDS.get(exc.param or "")
        if name is None:
            raise
        exc.message = exc.message.replace(f"`{exc.param}`", f"`{name}`")
        exc.args = (exc.message,)
        exc.param = name
        raise
    draft = Draft.of(req)

    async def done(d: Draft) -> None:
        if req.store and store is not None:
            await store.save(tenant_id=principal.tenant_id, key_id=principal.key_id, draft=d,
                             conversation=history + new)

    answer = await gateway.forward(principal, call, traceparent=traceparent, auth_ns=auth_ns, line=line)
    if req.stream:
        return ResponsesStream(answer, draft, on_done=done)
    data = orjson.loads(answer.body)
    choice = (data.get("choices") or [{}])[0]
    draft.text = (choice.get("message") or {}).get("content") or ""
    draft.finish_reason = choice.get("finish_reason")
    draft.usage = usage_of(data.get("usage"))
    await done(draft)
    return Response(orjson.dumps(draft.body()), media_type="application/json")
