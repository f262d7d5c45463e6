"""``/v1``: the OpenAI-compatible endpoints."""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response
from starlette.routing import Match

from baton.api.gateway import responses
from baton.api.gateway.principals import Principal
from baton.api.gateway.responses import ResponseRequest
from baton.api.gateway.schemas import (
    ERROR_RESPONSES,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    CreateEmbeddingResponse,
    EmbeddingRequest,
    ModelList,
    ModelObject,
    completion_responses,
)
from baton.api.gateway.service import Gateway
from baton.core import errors

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])

_bearer = HTTPBearer(auto_error=False, description="A tenant API key (`bt_live_...`).")


async def get_gateway(request: Request) -> Gateway:
    """Async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, once per request."""
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_principal(
    request: Request,
    gateway: GatewayDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    header = f"Bearer {credentials.credentials}" if credentials is not None else None
    if gateway.tracer is None:
        return await gateway.principals.authenticate(header)
    start = time.time_ns()
    principal = await gateway.principals.authenticate(header)
    request.state.auth_ns = (start, time.time_ns())  # the gateway.auth span, written with the request's
    return principal


def _auth_ns(request: Request) -> tuple[int, int] | None:
    return getattr(request.state, "auth_ns", None)


PrincipalDep = Annotated[Principal, Depends(get_principal)]
TraceparentHeader = Annotated[str | None, Header(include_in_schema=False)]


def _exclude(model: ChatCompletionRequest | CompletionRequest) -> dict[str, object]:
    return model.model_dump(mode="json", exclude_unset=True, exclude_none=False)


@router.get("/models", response_model=ModelList, responses={401: ERROR_RESPONSES[401], 403: ERROR_RESPONSES[403]},
            summary="List the models this key may use")
async def list_models(principal: PrincipalDep) -> ModelList:
    return ModelList(data=[ModelObject(id=g.name, created=g.created) for g in
                           sorted(principal.models.values(), key=lambda g: g.name)])


@router.get("/models/{model}", response_model=ModelObject, responses=ERROR_RESPONSES, summary="Describe one model")
async def get_model(model: str, principal: PrincipalDep) -> ModelObject:
    grant = principal.model(model)
    return ModelObject(id=grant.name, created=grant.created)


@router.post("/chat/completions", response_model=None, responses=completion_responses(ChatCompletion),
             summary="Create a chat completion (streaming or not)")
async def chat_completions(
    body: ChatCompletionRequest, principal: PrincipalDep, gateway: GatewayDep, request: Request,
    traceparent: TraceparentHeader = None,
) -> Response:
    return await gateway.serve("chat/completions", principal, _exclude(body), traceparent=traceparent,
                               auth_ns=_auth_ns(request))


@router.post("/completions", response_model=None, responses=completion_responses(Completion),
             summary="Create a text completion (streaming or not)")
async def completions(
    body: CompletionRequest, principal: PrincipalDep, gateway: GatewayDep, request: Request,
    traceparent: TraceparentHeader = None,
) -> Response:
    return await gateway.serve("completions", principal, _exclude(body), traceparent=traceparent,
                               auth_ns=_auth_ns(request))


@router.post("/embeddings", response_model=None,
             responses={200: {"model": CreateEmbeddingResponse}, **ERROR_RESPONSES},
             summary="Create embeddings (embedding models of the catalogue)")
async def embeddings(
    body: EmbeddingRequest, principal: PrincipalDep, gateway: GatewayDep, request: Request,
    traceparent: TraceparentHeader = None,
) -> Response:
    payload = body.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    return await gateway.serve("embeddings", principal, payload, traceparent=traceparent, auth_ns=_auth_ns(request))


@router.post("/responses", response_model=None, responses=ERROR_RESPONSES,
             summary="Create a model response (Responses API, text; streaming or not)")
async def create_response(
    body: ResponseRequest, principal: PrincipalDep, gateway: GatewayDep, request: Request,
    traceparent: TraceparentHeader = None,
) -> Response:
    out: Response = await responses.create(gateway, principal, body, traceparent=traceparent,
                                           auth_ns=_auth_ns(request))
    return out


def _store(gateway: Gateway) -> responses.ResponseStore:
    if gateway.responses is None:
        raise errors.UnavailableError("Stored responses are not available on this gateway.")
    return gateway.responses


@router.get("/responses/{response_id}", responses=ERROR_RESPONSES, summary="A stored response")
async def get_response(response_id: str, principal: PrincipalDep, gateway: GatewayDep) -> Response:
    body = await _store(gateway).get(principal.tenant_id, response_id)
    return Response(orjson.dumps(body), media_type="application/json")


@router.delete("/responses/{response_id}", responses=ERROR_RESPONSES, summary="Delete a stored response")
async def delete_response(response_id: str, principal: PrincipalDep, gateway: GatewayDep) -> dict[str, Any]:
    await _store(gateway).delete(principal.tenant_id, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


# -- what /v1 does not serve -------------------------------------------------------------------------

#: Endpoints of OpenAI's API that this gateway may not serve, and what to do instead.
NOT_YET: dict[str, str] = {
    "batches": "The Batch API is turned off on this gateway (`gateway.batch.enabled`): send the requests one at "
               "a time to /v1/chat/completions.",
    "files": "The Files API is turned off on this gateway (it comes with the Batch API, `gateway.batch.enabled`).",
}

fallback = APIRouter(prefix="/v1", include_in_schema=False)


def _served(app: Any) -> list[str]:
    out = []
    for route in app.routes:
        path = getattr(route, "path", "")
        if path.startswith("/v1/") and getattr(route, "include_in_schema", True):
            out += [f"{m} {path}" for m in sorted(getattr(route, "methods", ()) or ()) if m != "HEAD"]
    return out


@fallback.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(rest: str, request: Request) -> Response:
    """Any other path under ``/v1``: 404 in OpenAI's shape, naming what is served (docs/openai.md); a served
    path asked with another method: 405."""
    for route in request.app.routes:
        if getattr(route, "path", "").startswith("/v1/") and route.matches(request.scope)[0] is Match.PARTIAL:
            allowed = ", ".join(sorted(m for m in getattr(route, "methods", ()) if m != "HEAD"))
            raise MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}; use {allowed}.",
                                        headers={"allow": allowed})
    first = rest.split("/", 1)[0]
    why = NOT_YET.get(first, f"Baton does not serve {request.method} /v1/{rest}.")
    raise errors.NotFoundError(f"{why} Served here: {'; '.join(_served(request.app))} (see docs/openai.md).")


class MethodNotAllowedError(errors.ClientError):
    status = 405
    code = "method_not_allowed"
    title = "Method not allowed"
