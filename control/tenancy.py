"""Tenancy use cases: organisations (sign-up, create, change, suspend, delete), their console users,
model grants, rate limits, access requests, the tenant's overview, and the admin tokens of
``/admin/v1`` (see :mod:`baton.control.services` for the contract every use case keeps).

A new organisation gets the models ``tenancy.default_models`` names (``["*"]``: every model in the
catalogue). Where that grants nothing, sign-up files an access request for any model: the operators'
queue (:meth:`Tenancy.access_requests`, oldest first) until one approves it (granting a model) or
declines it. A tenant may also ask for a particular model (:meth:`Tenancy.request_access`). A grant,
however it is made, answers the tenant's pending requests it satisfies (those for that model and those
for any model). API keys themselves are :class:`~baton.control.keys.KeyService`'s (``control.keys``).

Every method that changes something takes the :class:`~baton.control.usecase.Actor` it acts for,
writes its audit rows in its own transaction and, after the commit, tells the gateways what they must
forget (``notify.invalidate``). What it returns is a frozen view, copied before the unit of work closes.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from baton.control.audit import audit, snapshot
from baton.control.catalogue import ModelView
from baton.control.keys import KeyService
from baton.control.roles import TenantAction, authorize
from baton.control.usecase import Actor, Notifier
from baton.control.views import WIRE_SCHEMA, Page, Precondition, check
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database, UnitOfWork
from baton.core.repositories import SYSTEM_ACTOR_PREFIX
from baton.core.secrets import ADMIN_PREFIX, hash_secret, new_secret, visible_prefix
from baton.core.settings import Settings

log = logging.getLogger(__name__)

AccessState = Literal["ready", "waiting"]
TenantStatusName = Literal["active", "suspended"]
TenantRole = Literal["tenant_admin", "tenant_member"]
RequestState = Literal["pending", "approved", "declined"]

#: Who the audit log names for the grants sign-up makes from ``tenancy.default_models``.
DEFAULT_GRANT_ACTOR = f"{SYSTEM_ACTOR_PREFIX}default-grant"


# --- commands ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SignUp:
    organisation: str
    tenant_name: str
    email: str
    password_hash: str


@dataclass(frozen=True, slots=True)
class NewTenant:
    name: str
    display_name: str
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TenantChanges:
    """Fields to change; ``None`` leaves one as it is."""

    display_name: str | None = None
    settings: dict[str, Any] | None = None
    status: TenantStatusName | None = None

    def items(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if "status" in out:
            out["status"] = m.TenantStatus(out["status"])
        return out


@dataclass(frozen=True, slots=True)
class NewUser:
    email: str
    password_hash: str
    role: TenantRole = "tenant_member"


@dataclass(frozen=True, slots=True)
class UserChanges:
    """Fields to change; ``None`` leaves one as it is."""

    role: TenantRole | None = None
    disabled: bool | None = None
    password_hash: str | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """Rate limits and the per-request cost cap; ``None``: no limit of that kind."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None
    max_tokens_per_request: int | None = None


@dataclass(frozen=True, slots=True)
class RequestAccess:
    """A tenant asks for a model (``model_id`` None: any model, the operators choose)."""

    model_id: uuid.UUID | None = None
    note: str | None = None


# --- views ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TenantView:
    id: uuid.UUID
    name: str
    display_name: str
    status: str
    created_at: dt.datetime
    settings: dict[str, Any]
    version: int
    updated_at: dt.datetime

    @classmethod
    def of(cls, t: m.Tenant) -> TenantView:
        return cls(id=t.id, name=t.name, display_name=t.display_name, status=m.TenantStatus(t.status).value,
                   created_at=t.created_at, settings=dict(t.settings or {}), version=t.version,
                   updated_at=t.updated_at)


@dataclass(frozen=True, slots=True)
class UserView:
    id: uuid.UUID
    tenant_id: uuid.UUID | None
    email: str
    role: str
    disabled: bool
    created_at: dt.datetime
    last_login_at: dt.datetime | None

    @classmethod
    def of(cls, u: m.User) -> UserView:
        return cls(id=u.id, tenant_id=u.tenant_id, email=u.email, role=m.UserRole(u.role).value,
                   disabled=u.disabled, created_at=u.created_at, last_login_at=u.last_login_at)


@dataclass(frozen=True, slots=True)
class RateLimitView:
    id: uuid.UUID
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_concurrency: int | None
    max_tokens_per_request: int | None
    updated_at: dt.datetime

    @classmethod
    def of(cls, r: m.RateLimit) -> RateLimitView:
        return cls(id=r.id, tenant_id=r.tenant_id, api_key_id=r.api_key_id, requests_per_minute=r.requests_per_minute,
                   tokens_per_minute=r.tokens_per_minute, max_concurrency=r.max_concurrency,
                   max_tokens_per_request=r.max_tokens_per_request, updated_at=r.updated_at)


@dataclass(frozen=True, slots=True)
class AdminTokenView:
    id: uuid.UUID
    name: str
    prefix: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None

    @classmethod
    def of(cls, t: m.AdminToken) -> AdminTokenView:
        return cls(id=t.id, name=t.name, prefix=t.prefix, created_at=t.created_at, revoked_at=t.revoked_at)

    def audit_form(self) -> dict[str, Any]:
        return {"id": str(self.id), "name": self.name, "prefix": self.prefix,
                "created_at": self.created_at.isoformat(),
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None}


@dataclass(frozen=True, slots=True)
class IssuedAdminToken:
    """A new admin token and its secret: shown once, kept nowhere."""

    token: AdminTokenView
    secret: str


@dataclass(frozen=True, slots=True)
class AccessRequestView:
    __pydantic_config__ = WIRE_SCHEMA
    id: uuid.UUID
    tenant_id: uuid.UUID
    model_id: uuid.UUID | None
    """The model asked for; null: any model, the operator chooses."""
    model: str | None
    note: str | None
    state: RequestState
    requested_by: str
    requested_at: dt.datetime
    resolved_at: dt.datetime | None
    resolved_by: str | None
    reason: str | None
    #: Filled in for the operators' lists.
    tenant_name: str | None = None
    tenant_display_name: str | None = None

    @classmethod
    def of(cls, r: m.AccessRequest, *, model: str | None = None, tenant: m.Tenant | None = None) -> AccessRequestView:
        state: RequestState = m.AccessRequestState(r.state).value
        return cls(id=r.id, tenant_id=r.tenant_id, model_id=r.model_id, model=model, note=r.note, state=state,
                   requested_by=r.requested_by, requested_at=r.requested_at, resolved_at=r.resolved_at,
                   resolved_by=r.resolved_by, reason=r.reason,
                   tenant_name=tenant.name if tenant else None,
                   tenant_display_name=tenant.display_name if tenant else None)


@dataclass(frozen=True, slots=True)
class SignedUp:
    tenant: TenantView
    user_id: uuid.UUID
    email: str
    role: m.UserRole
    granted: tuple[str, ...]
    #: The access request sign-up filed because it granted nothing (None when it granted a model).
    request: AccessRequestView | None = None


@dataclass(frozen=True, slots=True)
class TenantSummary:
    """A tenant as the operators' list shows it: with its models and how many users it has."""

    tenant: TenantView
    models: tuple[str, ...]
    users: int
    #: Its oldest pending access request, if any.
    pending_request: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class Access:
    """What a tenant may call: ``waiting`` until an operator grants it a model."""

    state: AccessState
    models: tuple[str, ...]
    since: dt.datetime
    #: The tenant's pending requests, oldest first.
    pending: tuple[AccessRequestView, ...] = ()


@dataclass(frozen=True, slots=True)
class Overview:
    """The tenant's home page: who it is, what it may call, how many keys work."""

    tenant: TenantView
    access: Access
    #: Standard keys that work now (playground keys are the playground's, and short-lived).
    live_keys: int


@dataclass(frozen=True, slots=True)
class Waiting:
    """One organisation in the access queue."""

    tenant: TenantView
    users: tuple[str, ...]
    request: AccessRequestView | None = None


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    """A model of the catalogue as a tenant sees it: whether it may use it, or has asked to."""

    id: uuid.UUID
    name: str
    context_length: int
    dtype: str
    params_b: float | None
    granted: bool
    requested: bool


# --- the use cases ----------------------------------------------------------------------------------

#: A tenant's setting while its sign-up awaits an operator (``tenancy.signup_review``): its admin user's id,
#: enabled when the tenant is resumed.
SIGNUP_REVIEW_USER = "signup_review_user"

def _grant_form(tenant_id: uuid.UUID, model_id: uuid.UUID) -> dict[str, Any]:
    return {"tenant_id": str(tenant_id), "model_id": str(model_id)}


def _require_user(uow: UnitOfWork, tenant_id: uuid.UUID, user_id: uuid.UUID) -> m.User:
    user = uow.users.get(user_id)
    if user is None or user.tenant_id != tenant_id:
        raise errors.NotFoundError(f"No user with id {user_id} in this tenant.")
    return user


class Tenancy:
    def __init__(self, settings: Settings, db: Database, notify: Notifier, keys: KeyService) -> None:
        self.settings, self.db, self.notify, self.keys = settings, db, notify, keys

    # -- sign-up -----------------------------------------------------------------------------------

    def _default_models(self, uow: UnitOfWork) -> list[m.Model]:
        names = self.settings.tenancy.default_models
        if not names:
            return []
        if "*" in names:
            return list(uow.models.list())
        found = [uow.models.by_name(n) for n in names]
        missing = [n for n, mod in zip(names, found, strict=True) if mod is None]
        if missing:
            log.warning("tenancy.default_models names models the catalogue does not have: %s", ", ".join(missing))
        return [mod for mod in found if mod is not None]

    def sign_up(self, actor: Actor, cmd: SignUp, *, review: bool = False) -> SignedUp | None:
        """Creates the tenant, its first admin user and the default grants in one transaction; with no
        default grant, a pending access request for any model instead.

        With ``review`` (``tenancy.signup_review``) the answer does not say whether the email was known: for a
        registered email nothing happens (None, audited); otherwise the organisation is made suspended and its
        admin user disabled, so that signing in fails exactly as for an unknown email until an operator
        resumes the tenant (:meth:`set_status`), which enables that user. A taken tenant id is a 409 in both
        modes (a tenant id is a public name the person must change)."""
        with self.db.system() as uow:
            if uow.tenants.by_name(cmd.tenant_name) is not None:
                raise errors.ConflictError("This tenant id is taken; choose another.", param="tenant_name")
            if uow.users.by_email(cmd.email) is not None:
                if review:
                    audit(uow, actor, "tenant.signup_refused", "user", None,
                          after={"tenant_name": cmd.tenant_name, "reason": "email already registered"})
                    uow.commit()
                    return None
                raise errors.ConflictError("A user with this email already exists; sign in instead.", param="email")
            status = m.TenantStatus.SUSPENDED if review else m.TenantStatus.ACTIVE
            t = uow.tenants.add(m.Tenant(name=cmd.tenant_name, display_name=cmd.organisation.strip(), status=status))
            user = uow.users.add(m.User(tenant_id=t.id, email=cmd.email, password_hash=cmd.password_hash,
                                        role=m.UserRole.TENANT_ADMIN, disabled=review))
            if review:
                uow.flush()
                t.settings = {**(t.settings or {}), SIGNUP_REVIEW_USER: str(user.id)}
            audit(uow, actor, "tenant.signup", "tenant", t.id, tenant_id=t.id, after=t)
            audit(uow, actor, "user.create", "user", user.id, tenant_id=t.id, after=user)
            granted = []
            for mod in self._default_models(uow):
                uow.tenant_models.grant(t.id, mod.id)
                audit(uow, Actor(DEFAULT_GRANT_ACTOR, actor.request_id), "tenant_model.grant", "tenant_model",
                      mod.id, tenant_id=t.id, after=_grant_form(t.id, mod.id))
                granted.append(mod.name)
            request = None
            if not granted:
                row = uow.access_requests.add(m.AccessRequest(tenant_id=t.id, model_id=None,
                                                              requested_by=actor.name))
                audit(uow, actor, "access_request.create", "access_request", row.id, tenant_id=t.id, after=row)
                request = AccessRequestView.of(row)
            uow.commit()
            out = SignedUp(tenant=TenantView.of(t), user_id=user.id, email=user.email, role=user.role,
                           granted=tuple(granted), request=request)
        return out

    # -- tenants -----------------------------------------------------------------------------------

    def create_tenant(self, actor: Actor, new: NewTenant) -> TenantView:
        with self.db.system() as uow:
            t = uow.tenants.add(m.Tenant(name=new.name, display_name=new.display_name, settings=dict(new.settings)))
            audit(uow, actor, "tenant.create", "tenant", t.id, tenant_id=t.id, after=t)
            uow.commit()
            return TenantView.of(t)

    def get_tenant(self, tenant_id: uuid.UUID) -> TenantView:
        with self.db.system() as uow:
            return TenantView.of(uow.tenants.require(tenant_id))

    def list_tenants(self, *, status: m.TenantStatus | None = None, name_contains: str | None = None,
                     limit: int = 50, offset: int = 0) -> Page[TenantView]:
        with self.db.system() as uow:
            stmt = uow.tenants.query(status=status, name_contains=name_contains)
            rows, total = uow.tenants.page(stmt, limit=limit, offset=offset)
            return Page([TenantView.of(t) for t in rows], total, limit, offset)

    def summaries(self, *, limit: int = 500) -> list[TenantSummary]:
        """Tenants by name, each with its models, its number of users and its oldest pending request."""
        with self.db.system() as uow:
            rows, _ = uow.tenants.page(uow.tenants.query(), limit=limit, offset=0)
            ids = [t.id for t in rows]
            models = uow.models.names_by_tenant(ids)
            users = uow.users.emails_by_tenant(ids)
            pending = uow.access_requests.pending_by_tenant(ids)
            return [TenantSummary(TenantView.of(t), tuple(models.get(t.id, ())), len(users.get(t.id, ())),
                                  pending[t.id].id if t.id in pending else None) for t in rows]

    def update_tenant(self, actor: Actor, tenant_id: uuid.UUID, changes: TenantChanges, *,
                      expect: Precondition | None = None) -> TenantView:
        """Renames, changes settings or status; a change of status reaches every gateway at once."""
        return self._change(actor, tenant_id, changes.items(), "tenant.update", expect)

    def set_status(self, actor: Actor, tenant_id: uuid.UUID, status: m.TenantStatus, *,
                   expect: Precondition | None = None) -> TenantView:
        """Suspends or resumes: a suspended tenant's keys stop working at once (every gateway is told)."""
        action = "tenant.suspend" if status is m.TenantStatus.SUSPENDED else "tenant.resume"
        return self._change(actor, tenant_id, {"status": status}, action, expect)

    def suspend(self, actor: Actor, tenant_id: uuid.UUID, *, expect: Precondition | None = None) -> TenantView:
        return self.set_status(actor, tenant_id, m.TenantStatus.SUSPENDED, expect=expect)

    def resume(self, actor: Actor, tenant_id: uuid.UUID, *, expect: Precondition | None = None) -> TenantView:
        return self.set_status(actor, tenant_id, m.TenantStatus.ACTIVE, expect=expect)

    def _change(self, actor: Actor, tenant_id: uuid.UUID, values: dict[str, Any], action: str,
                expect: Precondition | None) -> TenantView:
        with self.db.system() as uow:
            t = uow.tenants.require(tenant_id)
            check(expect, t.version)
            before = snapshot(t)
            for k, v in values.items():
                setattr(t, k, v)
            pending = (t.settings or {}).get(SIGNUP_REVIEW_USER)
            if values.get("status") == m.TenantStatus.ACTIVE and pending:
                # an operator resumed an organisation that signed up under review: its admin may sign in now
                t.settings = {k: v for k, v in t.settings.items() if k != SIGNUP_REVIEW_USER}
                user = uow.users.get(uuid.UUID(str(pending)))
                if user is not None and user.tenant_id == t.id and user.disabled:
                    user_before = snapshot(user)
                    user.disabled = False
                    audit(uow, actor, "user.enable", "user", user.id, tenant_id=t.id, before=user_before, after=user)
            if values:
                uow.flush()
                audit(uow, actor, action, "tenant", t.id, tenant_id=t.id, before=before, after=t)
            uow.commit()
            out = TenantView.of(t)
        if "status" in values:
            self.notify.invalidate("tenant", tenant_id)
        return out

    def delete_tenant(self, actor: Actor, tenant_id: uuid.UUID, *, expect: Precondition | None = None,
                      force: bool = False) -> None:
        """Deletes the tenant with its users, keys, grants, limits, requests and usage. A tenant with live API
        keys (its clients may be calling) is only deleted with ``force`` (409 otherwise): suspend it first
        to see who notices, or revoke its keys."""
        with self.db.system() as uow:
            t = uow.tenants.require(tenant_id)
            check(expect, t.version)
            keys = uow.api_keys.for_tenant(tenant_id, include_revoked=True)
            now = dt.datetime.now(dt.UTC)
            live = [k for k in keys if k.revoked_at is None and (k.expires_at is None or k.expires_at > now)]
            if live and not force:
                raise errors.ConflictError(
                    f"The tenant {t.name} has {len(live)} live API keys: deleting it cuts off every client that "
                    "uses them. Revoke them, or delete it with force.", param="force")
            key_ids = [k.id for k in keys]
            before = {**(snapshot(t) or {}), "api_keys": [str(k) for k in key_ids]}
            uow.tenants.delete(t)
            audit(uow, actor, "tenant.delete", "tenant", tenant_id, tenant_id=tenant_id, before=before)
            uow.commit()
        self.notify.invalidate("tenant", tenant_id)
        for k in key_ids:
            self.notify.invalidate("key", k)

    # -- users -------------------------------------------------------------------------------------

    def create_user(self, actor: Actor, tenant_id: uuid.UUID, new: NewUser) -> UserView:
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            user = uow.users.add(m.User(tenant_id=tenant_id, email=new.email, password_hash=new.password_hash,
                                        role=m.UserRole(new.role)))
            audit(uow, actor, "user.create", "user", user.id, tenant_id=tenant_id, after=user)
            uow.commit()
            return UserView.of(user)

    def list_users(self, tenant_id: uuid.UUID) -> list[UserView]:
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            return [UserView.of(u) for u in uow.users.for_tenant(tenant_id)]

    def update_user(self, actor: Actor, tenant_id: uuid.UUID, user_id: uuid.UUID, changes: UserChanges) -> UserView:
        with self.db.system() as uow:
            user = _require_user(uow, tenant_id, user_id)
            before = snapshot(user)
            if changes.role is not None:
                user.role = m.UserRole(changes.role)
            if changes.disabled is not None:
                user.disabled = changes.disabled
            ended = 0
            if changes.password_hash is not None:
                user.password_hash = changes.password_hash
                # whoever knew the old password is signed out everywhere, as disabling the user does
                ended = uow.console_sessions.end_for_user(user.id)
            uow.flush()
            after = snapshot(user) or {}
            if changes.password_hash is not None:
                after["password_changed"] = True
                after["sessions_ended"] = ended
            audit(uow, actor, "user.update", "user", user.id, tenant_id=tenant_id, before=before, after=after)
            uow.commit()
            return UserView.of(user)

    def delete_user(self, actor: Actor, tenant_id: uuid.UUID, user_id: uuid.UUID) -> None:
        with self.db.system() as uow:
            user = _require_user(uow, tenant_id, user_id)
            before = snapshot(user)
            uow.users.delete(user)
            audit(uow, actor, "user.delete", "user", user_id, tenant_id=tenant_id, before=before)
            uow.commit()

    # -- model grants ------------------------------------------------------------------------------

    def list_grants(self, tenant_id: uuid.UUID) -> list[ModelView]:
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            return [ModelView.of(r) for r in uow.models.for_tenant(tenant_id)]

    def model_id(self, ref: str | uuid.UUID) -> uuid.UUID:
        """A model named by its id or by its name (as the CLI and the console name it)."""
        if isinstance(ref, uuid.UUID):
            return ref
        try:
            return uuid.UUID(ref)
        except ValueError:
            pass
        with self.db.system() as uow:
            found = uow.models.by_name(ref)
            if found is None:
                raise errors.NotFoundError(f"No model with the id or name {ref!r}.")
            return found.id

    def grant_model(self, actor: Actor, tenant_id: uuid.UUID, model_id: uuid.UUID) -> None:
        """Lets the tenant use the model (idempotent), answering the pending requests it satisfies;
        every gateway forgets what it cached of the tenant."""
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            uow.models.require(model_id)
            self._grant(uow, actor, tenant_id, model_id)
            uow.commit()
        self.notify.invalidate("tenant", tenant_id)

    def _grant(self, uow: UnitOfWork, actor: Actor, tenant_id: uuid.UUID, model_id: uuid.UUID) -> None:
        """The grant, and the pending requests it answers (approved by the same actor)."""
        if uow.tenant_models.get((tenant_id, model_id)) is None:
            uow.tenant_models.grant(tenant_id, model_id)
            audit(uow, actor, "tenant_model.grant", "tenant_model", model_id, tenant_id=tenant_id,
                  after=_grant_form(tenant_id, model_id))
        now = dt.datetime.now(dt.UTC)
        for req in uow.access_requests.satisfied_by(tenant_id, model_id):
            before = snapshot(req)
            req.model_id, req.state = model_id, m.AccessRequestState.APPROVED
            req.resolved_at, req.resolved_by = now, actor.name
            uow.flush()
            audit(uow, actor, "access_request.approve", "access_request", req.id, tenant_id=tenant_id,
                  before=before, after=req)

    def revoke_model(self, actor: Actor, tenant_id: uuid.UUID, model_id: uuid.UUID) -> None:
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            if not uow.tenant_models.revoke(tenant_id, model_id):
                raise errors.NotFoundError("The tenant has no grant for this model.")
            audit(uow, actor, "tenant_model.revoke", "tenant_model", model_id, tenant_id=tenant_id,
                  before=_grant_form(tenant_id, model_id))
            uow.commit()
        self.notify.invalidate("tenant", tenant_id)

    # -- rate limits -------------------------------------------------------------------------------

    def set_rate_limit(self, actor: Actor, tenant_id: uuid.UUID, limits: Limits, *,
                       key_id: uuid.UUID | None = None) -> RateLimitView:
        """Limits for the whole tenant (``key_id`` None) or for one of its keys, on top of the tenant's."""
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            if key_id is not None:
                key = uow.api_keys.get(key_id)
                if key is None or key.tenant_id != tenant_id:
                    raise errors.NotFoundError(f"No API key with id {key_id}.")
            existing = [r for r in uow.rate_limits.for_tenant(tenant_id) if r.api_key_id == key_id]
            before = snapshot(existing[0]) if existing else None
            row = uow.rate_limits.upsert(tenant_id, key_id, requests_per_minute=limits.requests_per_minute,
                                         tokens_per_minute=limits.tokens_per_minute,
                                         max_concurrency=limits.max_concurrency,
                                         max_tokens_per_request=limits.max_tokens_per_request)
            audit(uow, actor, "rate_limit.set", "rate_limit", row.id, tenant_id=tenant_id, before=before, after=row)
            uow.commit()
            out = RateLimitView.of(row)
        self.notify.invalidate("tenant", tenant_id)
        return out

    def list_rate_limits(self, tenant_id: uuid.UUID) -> list[RateLimitView]:
        with self.db.system() as uow:
            uow.tenants.require(tenant_id)
            return [RateLimitView.of(r) for r in uow.rate_limits.for_tenant(tenant_id)]

    def delete_rate_limit(self, actor: Actor, tenant_id: uuid.UUID, limit_id: uuid.UUID) -> None:
        with self.db.system() as uow:
            row = uow.rate_limits.get(limit_id)
            if row is None or row.tenant_id != tenant_id:
                raise errors.NotFoundError(f"No rate limit with id {limit_id}.")
            before = snapshot(row)
            uow.rate_limits.delete(row)
            audit(uow, actor, "rate_limit.delete", "rate_limit", limit_id, tenant_id=tenant_id, before=before)
            uow.commit()
        self.notify.invalidate("tenant", tenant_id)

    # -- access ------------------------------------------------------------------------------------

    def access(self, tenant_id: uuid.UUID) -> Access:
        with self.db.tenant(tenant_id) as uow:
            return self._access(uow, uow.tenants.require(tenant_id))

    def _access(self, uow: UnitOfWork, t: m.Tenant) -> Access:
        # chat models first: the console's first example calls the first one with chat.completions
        names = tuple(mod.name for mod in sorted(uow.models.for_tenant(t.id),
                                                 key=lambda mod: ((mod.kind or "generate") == "embed", mod.name)))
        rows = uow.access_requests.scalars(uow.access_requests.query(tenant_id=t.id,
                                                                     state=m.AccessRequestState.PENDING))
        model_names = uow.models.names() if any(r.model_id for r in rows) else {}
        pending = tuple(AccessRequestView.of(r, model=model_names.get(r.model_id) if r.model_id else None)
                        for r in rows)
        return Access(state="ready" if names else "waiting", models=names, since=t.created_at, pending=pending)

    def overview(self, tenant_id: uuid.UUID) -> Overview:
        """What the tenant's home page shows (a brand-new tenant with no model, key or traffic included)."""
        now = dt.datetime.now(dt.UTC)
        with self.db.tenant(tenant_id) as uow:
            t = uow.tenants.require(tenant_id)
            access = self._access(uow, t)
            live = sum(1 for k in uow.api_keys.for_tenant(tenant_id)
                       if k.kind is m.KeyKind.STANDARD and (k.expires_at is None or k.expires_at > now))
            return Overview(tenant=TenantView.of(t), access=access, live_keys=live)

    def catalogue(self, tenant_id: uuid.UUID) -> list[CatalogueEntry]:
        """Every model of the catalogue, and whether the tenant may use it or has asked for it."""
        with self.db.tenant(tenant_id) as uow:
            uow.tenants.require(tenant_id)
            granted = {mod.id for mod in uow.models.for_tenant(tenant_id)}
            asked = {r.model_id for r in uow.access_requests.scalars(
                uow.access_requests.query(tenant_id=tenant_id, state=m.AccessRequestState.PENDING))}
            return [CatalogueEntry(id=mod.id, name=mod.name, context_length=mod.context_length, dtype=mod.dtype,
                                   params_b=mod.params_b, granted=mod.id in granted, requested=mod.id in asked)
                    for mod in uow.models.list()]

    def request_access(self, actor: Actor, tenant_id: uuid.UUID, cmd: RequestAccess) -> AccessRequestView:
        """Files a request for a model (or any model) for the operators to answer (a tenant's admins only)."""
        authorize(actor.role, TenantAction.REQUEST_ACCESS)
        note = (cmd.note or "").strip() or None
        if note is not None and len(note) > 1000:
            raise errors.ValidationError("A note has at most 1000 characters.", param="note")
        with self.db.tenant(tenant_id) as uow:
            uow.tenants.require(tenant_id)
            model = None
            if cmd.model_id is not None:
                model = uow.models.get(cmd.model_id)
                if model is None:
                    raise errors.NotFoundError(f"No model with id {cmd.model_id}.", param="model_id")
                if uow.tenant_models.get((tenant_id, model.id)) is not None:
                    raise errors.ConflictError("Your organisation may already use this model.", param="model_id")
            if uow.access_requests.pending(tenant_id, cmd.model_id) is not None:
                what = "this model" if model is not None else "a model"
                raise errors.ConflictError(f"A request for {what} is already waiting for an operator.")
            row = uow.access_requests.add(m.AccessRequest(tenant_id=tenant_id, model_id=cmd.model_id, note=note,
                                                          requested_by=actor.name))
            audit(uow, actor, "access_request.create", "access_request", row.id, tenant_id=tenant_id, after=row)
            uow.commit()
            return AccessRequestView.of(row, model=model.name if model else None)

    def tenant_requests(self, tenant_id: uuid.UUID) -> list[AccessRequestView]:
        """The tenant's own requests, newest first."""
        with self.db.tenant(tenant_id) as uow:
            rows = uow.access_requests.scalars(uow.access_requests.query(tenant_id=tenant_id))
            names = uow.models.names() if rows else {}
            return [AccessRequestView.of(r, model=names.get(r.model_id) if r.model_id else None) for r in rows]

    def access_requests(self, *, state: m.AccessRequestState | None = m.AccessRequestState.PENDING,
                        tenant_id: uuid.UUID | None = None, limit: int = 200, offset: int = 0,
                        ) -> Page[AccessRequestView]:
        """The operators' queue: pending requests oldest first (``state`` None: all, newest first)."""
        with self.db.system() as uow:
            stmt = uow.access_requests.query(tenant_id=tenant_id, state=state)
            rows, total = uow.access_requests.page(stmt, limit=limit, offset=offset)
            return Page(self._views(uow, rows), total, limit, offset)

    def _views(self, uow: UnitOfWork, rows: Sequence[m.AccessRequest]) -> list[AccessRequestView]:
        tenants = uow.tenants.by_ids(list({r.tenant_id for r in rows}))
        names = uow.models.names() if any(r.model_id for r in rows) else {}
        return [AccessRequestView.of(r, model=names.get(r.model_id) if r.model_id else None,
                                     tenant=tenants.get(r.tenant_id)) for r in rows]

    def _pending(self, uow: UnitOfWork, request_id: uuid.UUID) -> m.AccessRequest:
        row = uow.access_requests.get_for_update(request_id)
        if row is None:
            raise errors.NotFoundError(f"No access request with id {request_id}.")
        if row.state is not m.AccessRequestState.PENDING:
            raise errors.ConflictError(f"This request was already {m.AccessRequestState(row.state).value}.")
        return row

    def approve_access(self, actor: Actor, request_id: uuid.UUID, *,
                       model_id: uuid.UUID | None = None) -> AccessRequestView:
        """Grants the requested model (for a request for any model: ``model_id``, the operator's choice).
        An answered request cannot be answered again (409)."""
        with self.db.system() as uow:
            row = self._pending(uow, request_id)
            if row.model_id is not None and model_id is not None and model_id != row.model_id:
                raise errors.ValidationError("This request names its model: approve it as it is, or decline it.",
                                             param="model_id")
            chosen = row.model_id or model_id
            if chosen is None:
                raise errors.ValidationError("This request is for any model: choose the model to grant.",
                                             param="model_id")
            uow.models.require(chosen)
            before = snapshot(row)
            row.model_id, row.state = chosen, m.AccessRequestState.APPROVED
            row.resolved_at, row.resolved_by = dt.datetime.now(dt.UTC), actor.name
            uow.flush()
            audit(uow, actor, "access_request.approve", "access_request", row.id, tenant_id=row.tenant_id,
                  before=before, after=row)
            self._grant(uow, actor, row.tenant_id, chosen)
            uow.commit()
            out = self._views(uow, [row])[0]
        self.notify.invalidate("tenant", out.tenant_id)
        return out

    def decline_access(self, actor: Actor, request_id: uuid.UUID, *, reason: str | None = None) -> AccessRequestView:
        reason = (reason or "").strip() or None
        if reason is not None and len(reason) > 1000:
            raise errors.ValidationError("A reason has at most 1000 characters.", param="reason")
        with self.db.system() as uow:
            row = self._pending(uow, request_id)
            before = snapshot(row)
            row.state, row.reason = m.AccessRequestState.DECLINED, reason
            row.resolved_at, row.resolved_by = dt.datetime.now(dt.UTC), actor.name
            uow.flush()
            audit(uow, actor, "access_request.decline", "access_request", row.id, tenant_id=row.tenant_id,
                  before=before, after=row)
            uow.commit()
            return self._views(uow, [row])[0]

    def access_queue(self) -> list[Waiting]:
        """Active organisations that have no model grant yet, oldest first, each with its oldest pending
        request (None: it has not asked)."""
        with self.db.system() as uow:
            rows = uow.tenants.without_grants()
            ids = [t.id for t in rows]
            users = uow.users.emails_by_tenant(ids)
            pending = uow.access_requests.pending_by_tenant(ids)
            views = {v.tenant_id: v for v in self._views(uow, list(pending.values()))}
            return [Waiting(tenant=TenantView.of(t), users=tuple(users.get(t.id, ())), request=views.get(t.id))
                    for t in rows]

    # -- admin tokens ------------------------------------------------------------------------------

    def create_admin_token(self, actor: Actor, name: str) -> IssuedAdminToken:
        """A credential for ``/admin/v1``; its secret is in the result only."""
        secret = new_secret(ADMIN_PREFIX)
        digest = hash_secret(self.settings.security.key_secret.get_secret_value(), secret)
        with self.db.system() as uow:
            row = uow.admin_tokens.add(m.AdminToken(name=name, prefix=visible_prefix(secret), token_hash=digest))
            audit(uow, actor, "admin_token.create", "admin_token", row.id, after=row)
            uow.commit()
            return IssuedAdminToken(token=AdminTokenView.of(row), secret=secret)

    def list_admin_tokens(self) -> list[AdminTokenView]:
        with self.db.system() as uow:
            return [AdminTokenView.of(r) for r in uow.admin_tokens.list()]

    def revoke_admin_token(self, actor: Actor, token_id: uuid.UUID) -> None:
        """Revokes at once (idempotent)."""
        with self.db.system() as uow:
            row = uow.admin_tokens.require(token_id)
            if row.revoked_at is None:
                before = AdminTokenView.of(row).audit_form()
                row.revoked_at = dt.datetime.now(dt.UTC)
                uow.flush()
                audit(uow, actor, "admin_token.revoke", "admin_token", row.id, before=before, after=row)
                uow.commit()
