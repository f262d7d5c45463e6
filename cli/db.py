"""``baton db``: schema migrations (run as the schema owner)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Database schema: upgrade, downgrade, current revision.", no_args_is_help=True)


def _config(url: str | None):  # type: ignore[no-untyped-def]
    from pathlib import Path

    from alembic.config import Config

    from baton.core.settings import load_settings

    root = Path(__file__).resolve().parents[1]
    cfg = Config(str(root / "alembic.ini"))
    cfg.set_main_option("script_location", str(root / "migrations"))
    settings = load_settings()
    cfg.attributes["url"] = url or settings.db.url
    cfg.attributes["app_role"] = settings.db.app_role
    return cfg


URL = typer.Option(None, "--url", help="Owner connection URL (default: BATON_DB__URL).")


@app.command()
def upgrade(revision: str = typer.Argument("head", help="Target revision."), url: str | None = URL) -> None:
    """Create the database if missing, then upgrade the schema to REVISION."""
    from alembic import command

    cfg = _config(url)
    ensure_database(cfg.attributes["url"])
    command.upgrade(cfg, revision)
    typer.echo(f"schema at {revision}")


@app.command()
def downgrade(revision: str = typer.Argument(..., help="Target revision, e.g. base or -1."),
              url: str | None = URL) -> None:
    """Downgrade the schema to REVISION."""
    from alembic import command

    command.downgrade(_config(url), revision)
    typer.echo(f"schema at {revision}")


@app.command()
def current(url: str | None = URL,
            as_json: bool = typer.Option(False, "--json", help="Print {\"revision\": ..., \"head\": ...,"
                                                              " \"up_to_date\": ...} for scripts.")) -> None:
    """Print the schema's current revision."""
    from alembic import command

    cfg = _config(url)
    if not as_json:
        command.current(cfg)
        return
    import json

    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    engine = create_engine(cfg.attributes["url"])
    try:
        with engine.connect() as conn:
            revision = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(cfg).get_current_head()
    typer.echo(json.dumps({"revision": revision, "head": head, "up_to_date": revision == head}))


def ensure_database(url: str) -> None:
    """Creates the database named in ``url`` when it does not exist (needs CREATEDB on the owner)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :d"),
                                 {"d": target.database})
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    finally:
        admin.dispose()
