"""``/v1``: the OpenAI-compatible endpoints."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from baton.api.gateway.principals import Principal
from baton.api.gateway.schemas import (
    ERROR_RESPONSES,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelList,
    ModelObject,
    completion_responses,
)
from baton.api.gateway.service import Gateway

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
    call = await gateway.prepare_chat(principal, _exclude(body))
    return await gateway.forward(principal, call, traceparent=traceparent, auth_ns=_auth_ns(request))


@router.post("/completions", response_model=None, responses=completion_responses(Completion),
             summary="Create a text completion (streaming or not)")
async def completions(
    body: CompletionRequest, principal: PrincipalDep, gateway: GatewayDep, request: Request,
    traceparent: TraceparentHeader = None,
) -> Response:
    call = await gateway.prepare_completion(principal, _exclude(body))
    return await gateway.forward(principal, call, traceparent=traceparent, auth_ns=_auth_ns(request))
