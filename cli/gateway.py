"""``baton gateway``: run the OpenAI-compatible gateway (and whatever else ``baton.api`` mounts)."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="The OpenAI-compatible gateway.", no_args_is_help=True)


@app.command("run")
def run(
    host: Annotated[str | None, typer.Option("--host", help="Bind address (default: BATON_GATEWAY__HOST).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Bind port (default: BATON_GATEWAY__PORT).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Worker processes (each one event loop).")] = 1,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
) -> None:
    """Serve /v1 (and /admin/v1, the console when installed) with uvicorn, uvloop and httptools.

    Settings come from BATON_* variables. Workers share rate limits and revocations through Redis."""
    import uvicorn

    from baton.core.settings import load_settings

    settings = load_settings()  # fail here, once, on bad settings rather than in every worker
    uvicorn.run(
        "baton.api.app:create_app_from_env",
        factory=True,
        host=host or settings.gateway.host,
        port=port or settings.gateway.port,
        workers=workers,
        loop="uvloop",
        http="baton.api.server:DeadlineProtocol",  # httptools with read deadlines
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=int(settings.gateway.shutdown_grace_s),
        timeout_keep_alive=max(1, round(settings.gateway.keep_alive_s)),
    )
