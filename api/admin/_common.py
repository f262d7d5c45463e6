"""What the tenancy routes of ``/admin/v1`` share: the admin principal as the control plane's actor."""

from __future__ import annotations

from baton.control.usecase import Actor

from .deps import AdminPrincipal


def actor(who: AdminPrincipal) -> Actor:
    """The :class:`~baton.control.usecase.Actor` an admin request acts as (``admin:<token name>``)."""
    return Actor(name=who.actor, request_id=who.request_id)
