"""The console's wiring: built once from the settings and the database, kept on ``app.state.console``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from baton.api.console.auth import LoginThrottle, SessionService
from baton.control.keys import KeyEvents, KeyService, RedisKeyEvents
from baton.core import errors
from baton.core.db import Database
from baton.core.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ConsoleContext:
    settings: Settings
    db: Database
    sessions: SessionService
    keys: KeyService
    throttle: LoginThrottle
    redis: Any | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings, db: Database, *, redis_client: Any | None = None,
                      key_events: KeyEvents | None = None) -> ConsoleContext:
        if redis_client is None:
            import redis

            redis_client = redis.Redis.from_url(settings.redis.url, socket_timeout=2, socket_connect_timeout=2)
        events = key_events or RedisKeyEvents(redis_client)
        return cls(
            settings=settings, db=db,
            sessions=SessionService(db, settings.security.session_secret.get_secret_value()),
            keys=KeyService(db, settings, events=events),
            throttle=LoginThrottle(redis_client),
            redis=redis_client,
        )


def get_context(request: Request) -> ConsoleContext:
    """``app.state.console``, or one built on first use from ``app.state.settings`` and ``app.state.db``."""
    state = request.app.state
    ctx = getattr(state, "console", None)
    if ctx is None:
        settings = getattr(state, "settings", None)
        db = getattr(state, "db", None)
        if settings is None or db is None:
            raise errors.ConfigurationError("The console is not wired (app.state.console).")
        ctx = ConsoleContext.from_settings(settings, db)
        state.console = ctx
    assert isinstance(ctx, ConsoleContext)
    return ctx
