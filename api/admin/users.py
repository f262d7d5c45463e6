"""A tenant's console users (admins and members); passwords kept as argon2 hashes. Adapters over
:class:`baton.control.tenancy.Tenancy`."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from baton.control.tenancy import NewUser, UserChanges, UserView
from baton.core.passwords import hash_password

from ._common import actor
from .deps import Admin, Ctx
from .problems import ProblemRoute
from .schemas import UserCreate, UserUpdate

router = APIRouter(prefix="/tenants/{tenant_id}/users", tags=["users"], route_class=ProblemRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=UserView)
def create_user(*, tenant_id: uuid.UUID, body: UserCreate, ctx: Ctx, who: Admin) -> UserView:
    new = NewUser(email=body.email, password_hash=hash_password(body.password), role=body.role)
    return ctx.control.tenancy.create_user(actor(who), tenant_id, new)


@router.get("", response_model=list[UserView])
def list_users(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin) -> list[UserView]:
    return list(ctx.control.tenancy.list_users(tenant_id))


@router.patch("/{user_id}", response_model=UserView)
def update_user(*, tenant_id: uuid.UUID, user_id: uuid.UUID, body: UserUpdate, ctx: Ctx, who: Admin) -> UserView:
    changes = UserChanges(role=body.role, disabled=body.disabled,
                          password_hash=hash_password(body.password) if body.password is not None else None)
    return ctx.control.tenancy.update_user(actor(who), tenant_id, user_id, changes)


@router.delete("/{user_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_user(*, tenant_id: uuid.UUID, user_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    ctx.control.tenancy.delete_user(actor(who), tenant_id, user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
