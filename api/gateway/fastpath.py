"""The gateway's hot routes without the web framework's per-request machinery.

``POST /v1/chat/completions`` and ``POST /v1/completions`` carry nearly all of a gateway's traffic.
Through FastAPI each pays for route matching over every route of the app, dependency solving (the
gateway, the key, the bearer scheme, the ``traceparent`` header), request objects and two more send
wrappers per streamed token: more than the gateway's own work on a short request. :class:`FastPath`
serves a well-formed request of those two routes itself, in the same steps the routes take
(authenticate, validate the body against the same schema, then ``Gateway.serve``, the pipeline's one entrance),
and leaves everything else to the app: any other route, and any request that is not the plain case
(no or another kind of ``Authorization`` header, a key that does not authenticate, a body that is not
a valid JSON object of the schema, a content type other than ``application/json`` or none). Those go
to the FastAPI route with the body already read, so every error a client can get is the one the route
gives, in the same order.

Errors raised after that point (limits, routing, the upstream) are answered by the same functions as
the app's exception handlers.
"""

from __future__ import annotations

import time

import orjson
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baton.api.errors import baton_error_response, http_error_response
from baton.api.gateway.schemas import ChatCompletionRequest, CompletionRequest
from baton.core import errors

#: path -> (the body's schema, the endpoint :meth:`Gateway.serve` serves)
ROUTES: dict[str, tuple[type[BaseModel], str]] = {
    "/v1/chat/completions": (ChatCompletionRequest, "chat/completions"),
    "/v1/completions": (CompletionRequest, "completions"),
}


class FastPath:
    """ASGI middleware in front of the app (inside the body-size limit): see the module doc."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        authorization = headers.get(b"authorization")
        ctype = headers.get(b"content-type")
        if (authorization is None or not authorization.startswith(b"Bearer ") or b" " in authorization[7:]
                or ctype is None or ctype.split(b";", 1)[0].strip().lower() != b"application/json"):
            await self.app(scope, receive, send)
            return
        try:
            body = await _read(receive)
        except HTTPException as exc:  # the body-size limit
            await http_error_response(Request(scope), exc)(scope, receive, send)
            return
        handled = await self._serve(scope, receive, send, route, body, authorization=authorization.decode("latin-1"),
                                    traceparent=headers.get(b"traceparent"))
        if not handled:
            await self.app(scope, _replay(body, receive), send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send,
                     route: tuple[type[BaseModel], str],
                     body: bytes, *, authorization: str, traceparent: bytes | None) -> bool:
        """Serves the request; False (nothing sent) when it is not the plain case."""
        gateway = scope["app"].state.gateway
        schema, endpoint = route
        start = time.time_ns()
        try:
            principal = await gateway.principals.authenticate(authorization)
        except errors.BatonError:
            return False
        auth_ns = (start, time.time_ns()) if gateway.tracer is not None else None
        try:
            data = orjson.loads(body)
            model = schema.model_validate(data) if isinstance(data, dict) else None
        except (orjson.JSONDecodeError, ValidationError):
            model = None
        if model is None:
            return False
        try:
            response = await gateway.serve(endpoint, principal,
                                           model.model_dump(mode="json", exclude_unset=True, exclude_none=False),
                                           auth_ns=auth_ns,
                                           traceparent=traceparent.decode("latin-1") if traceparent else None)
        except errors.BatonError as exc:
            response = baton_error_response(Request(scope), exc)
        await response(scope, receive, send)
        return True


def _headers(scope: Scope) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in (b"authorization", b"content-type", b"traceparent"):
            if name in out:  # a repeated header: the framework's reading decides
                return {}
            out[name] = value
    return out


async def _read(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that gives the body already read first, then what the server sends (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
