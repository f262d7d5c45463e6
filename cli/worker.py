"""``baton worker``: the Celery worker with its beat scheduler embedded (reconcile, usage roll-up, key expiry)."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command(name="worker")(worker)


def worker(
    concurrency: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
    beat: Annotated[bool, typer.Option(help="Run the beat scheduler in this worker (periodic jobs).")] = True,
    beat_only: Annotated[bool, typer.Option("--beat-only", help="Run only the beat scheduler (no worker).")] = False,
) -> None:
    """Run the background jobs: reconcile after every change and periodically (drift repair), roll usage up
    per tenant and day, expire keys. Every run is recorded in the jobs table."""
    from baton.control.celery_app import run_beat, run_worker
    from baton.core.settings import load_settings

    if beat_only:
        run_beat(load_settings(), loglevel=loglevel)
    else:
        run_worker(load_settings(), concurrency=concurrency, loglevel=loglevel, beat=beat)
