"""A tenant's console users (admins and members); passwords kept as argon2 hashes."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from baton.control.audit import snapshot
from baton.core import errors
from baton.core import models as m

from ._common import audit
from .deps import Admin, Ctx
from .problems import ProblemRoute
from .schemas import UserCreate, UserPublic, UserUpdate

router = APIRouter(prefix="/tenants/{tenant_id}/users", tags=["users"], route_class=ProblemRoute)


def _hash(password: str) -> str:
    from argon2 import PasswordHasher

    return PasswordHasher().hash(password)


def _require(uow: object, tenant_id: uuid.UUID, user_id: uuid.UUID) -> m.User:
    user: m.User | None = uow.users.get(user_id)  # type: ignore[attr-defined]
    if user is None or user.tenant_id != tenant_id:
        raise errors.NotFoundError(f"No user with id {user_id} in this tenant.")
    return user


@router.post("", status_code=status.HTTP_201_CREATED, response_model=UserPublic)
def create_user(*, tenant_id: uuid.UUID, body: UserCreate, ctx: Ctx, who: Admin) -> UserPublic:
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        user = uow.users.add(m.User(tenant_id=tenant_id, email=body.email, password_hash=_hash(body.password),
                                    role=m.UserRole(body.role)))
        audit(uow, who, "user.create", "user", user.id, tenant_id=tenant_id, after=user)
        uow.commit()
        return UserPublic.model_validate(user)


@router.get("", response_model=list[UserPublic])
def list_users(*, tenant_id: uuid.UUID, ctx: Ctx, who: Admin) -> list[UserPublic]:
    with ctx.db.system() as uow:
        uow.tenants.require(tenant_id)
        return [UserPublic.model_validate(u) for u in uow.users.for_tenant(tenant_id)]


@router.patch("/{user_id}", response_model=UserPublic)
def update_user(*, tenant_id: uuid.UUID, user_id: uuid.UUID, body: UserUpdate, ctx: Ctx, who: Admin) -> UserPublic:
    with ctx.db.system() as uow:
        user = _require(uow, tenant_id, user_id)
        before = snapshot(user)
        if body.role is not None:
            user.role = m.UserRole(body.role)
        if body.disabled is not None:
            user.disabled = body.disabled
        if body.password is not None:
            user.password_hash = _hash(body.password)
        uow.flush()
        after = snapshot(user) or {}
        if body.password is not None:
            after["password_changed"] = True
        audit(uow, who, "user.update", "user", user.id, tenant_id=tenant_id, before=before, after=after)
        uow.commit()
        return UserPublic.model_validate(user)


@router.delete("/{user_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_user(*, tenant_id: uuid.UUID, user_id: uuid.UUID, ctx: Ctx, who: Admin) -> Response:
    with ctx.db.system() as uow:
        user = _require(uow, tenant_id, user_id)
        before = snapshot(user)
        uow.users.delete(user)
        audit(uow, who, "user.delete", "user", user_id, tenant_id=tenant_id, before=before)
        uow.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
