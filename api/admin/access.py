"""Access requests: organisations asking for a model (sign-up files one when no model is granted by
default), answered by an operator with a grant or a reason. Adapters over
:class:`baton.control.tenancy.Tenancy`; the console's operator pages call the same use cases."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from baton.control.tenancy import AccessRequestView
from baton.core import models as m

from ._common import actor
from .deps import Admin, Ctx, Paging
from .problems import ProblemRoute
from .schemas import AccessApprove, AccessDecline, Page

router = APIRouter(prefix="/access-requests", tags=["access requests"], route_class=ProblemRoute)


@router.get("", response_model=Page[AccessRequestView])
def list_access_requests(*, ctx: Ctx, who: Admin, paging: Paging,
                         state: Annotated[Literal["pending", "approved", "declined", "all"], Query()] = "pending",
                         tenant_id: Annotated[uuid.UUID | None, Query()] = None) -> Page[AccessRequestView]:
    """Pending requests oldest first (the queue); answered ones (``state``) newest first."""
    page = ctx.control.tenancy.access_requests(state=None if state == "all" else m.AccessRequestState(state),
                                               tenant_id=tenant_id, limit=paging.limit, offset=paging.offset)
    return Page(data=list(page.items), count=page.total, limit=page.limit, offset=page.offset)


@router.post("/{request_id}/approve", response_model=AccessRequestView)
def approve_access(*, request_id: uuid.UUID, ctx: Ctx, who: Admin,
                   body: AccessApprove | None = None) -> AccessRequestView:
    """Grants the model and answers the request (409 once it is answered)."""
    return ctx.control.tenancy.approve_access(actor(who), request_id,
                                              model_id=(body or AccessApprove()).model_id)


@router.post("/{request_id}/decline", response_model=AccessRequestView)
def decline_access(*, request_id: uuid.UUID, ctx: Ctx, who: Admin,
                   body: AccessDecline | None = None) -> AccessRequestView:
    """Declines the request with a reason the organisation sees (409 once it is answered)."""
    return ctx.control.tenancy.decline_access(actor(who), request_id,
                                              reason=(body or AccessDecline()).reason)
