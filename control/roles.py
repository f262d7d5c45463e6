"""What each role inside a tenant may do, checked by the use cases themselves (whichever surface calls).

A tenant's admins manage its keys, ask for models and cancel its batches; its members read the
organisation's pages (its batches and their files too) and use the playground (a 15-minute key of their
own). A caller that is not a tenant's console user (an operator, an admin token, the CLI on the host)
passes no role: each of those surfaces authenticates its callers as operators before it reaches a use case.
"""

from __future__ import annotations

import enum

from baton.core import errors
from baton.core import models as m


class TenantAction(enum.StrEnum):
    MANAGE_KEYS = "create, rotate or revoke API keys"
    REQUEST_ACCESS = "ask for access to models"
    USE_PLAYGROUND = "use the playground"
    CANCEL_BATCHES = "cancel batches"


ALLOWED: dict[m.UserRole, frozenset[TenantAction]] = {
    m.UserRole.TENANT_ADMIN: frozenset(TenantAction),
    m.UserRole.TENANT_MEMBER: frozenset({TenantAction.USE_PLAYGROUND}),
    m.UserRole.OPERATOR: frozenset(TenantAction),
}

_NAMES = {m.UserRole.TENANT_ADMIN: "admin", m.UserRole.TENANT_MEMBER: "member", m.UserRole.OPERATOR: "operator"}


def may(role: m.UserRole | None, action: TenantAction) -> bool:
    return role is None or action in ALLOWED.get(role, frozenset())


def authorize(role: m.UserRole | None, action: TenantAction) -> None:
    """Raises :class:`errors.PermissionDeniedError` (403 on every surface) if ``role`` may not do ``action``."""
    if not may(role, action):
        raise errors.PermissionDeniedError(
            f"A {_NAMES.get(role, str(role)) if role else 'user'} of this organisation cannot {action.value}; "
            "ask one of its admins.")
