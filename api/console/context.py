"""The console's wiring: the control plane, sessions and the login throttle, made from the process's
composition root (``app.state.services``) and kept on ``app.state.console``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from baton.api.console.auth import LoginThrottle, SessionService
from baton.control.keys import KeyService
from baton.control.services import ControlPlane
from baton.core import errors
from baton.core.db import Database
from baton.core.settings import Settings

if TYPE_CHECKING:
    from baton.api.composition import AppServices

log = logging.getLogger(__name__)


@dataclass
class ConsoleContext:
    settings: Settings
    db: Database
    control: ControlPlane
    sessions: SessionService
    throttle: LoginThrottle
    redis: Any | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> KeyService:
        return self.control.keys

    @classmethod
    def of(cls, services: AppServices) -> ConsoleContext:
        s = services.settings
        return cls(
            settings=s, db=services.db, control=services.control,
            sessions=SessionService(services.db, s.security.session_secret.get_secret_value()),
            throttle=LoginThrottle(services.redis), redis=services.redis,
        )


def get_context(request: Request) -> ConsoleContext:
    """``app.state.console``, else the one made from ``app.state.services``."""
    state = request.app.state
    ctx = getattr(state, "console", None)
    if ctx is None:
        services = getattr(state, "services", None)
        if services is None:
            raise errors.ConfigurationError("The console is not wired (app.state.services).")
        ctx = ConsoleContext.of(services)
        state.console = ctx
    assert isinstance(ctx, ConsoleContext)
    return ctx
