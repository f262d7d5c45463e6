"""The console: a self-service web UI for tenants and operators, served by Baton's API process.

``baton.api.console.router:router`` holds the JSON API (``/console/api``) and the built front end
(``/console/``, from ``web/dist``). :func:`mount_console` wires it into an app explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from baton.core.db import Database
    from baton.core.settings import Settings


def mount_console(app: FastAPI, settings: Settings, db: Database | None = None, **context: Any) -> None:
    """Includes the console's routes in ``app``. With ``db`` the console's context is built now;
    otherwise on the first request, from ``app.state.settings`` and ``app.state.db``."""
    from baton.api.console.context import ConsoleContext
    from baton.api.console.router import router

    app.include_router(router)
    if db is not None:
        ctx = ConsoleContext.from_settings(settings, db, **{k: v for k, v in context.items()
                                                            if k in ("redis_client", "key_events")})
        if "static_dir" in context:
            ctx.extra["static_dir"] = context["static_dir"]
        app.state.console = ctx
