"""Alembic environment: metadata from baton.core; runs as the schema owner."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from baton.core.models import Base
from baton.core.settings import load_settings

config = context.config
target_metadata = Base.metadata


def _settings_url_and_role() -> tuple[str, str]:
    x = context.get_x_argument(as_dictionary=True)
    settings = load_settings()
    url = x.get("url") or config.attributes.get("url") or settings.db.url
    role = x.get("app_role") or config.attributes.get("app_role") or settings.db.app_role
    return url, role


def run_migrations_offline() -> None:
    url, role = _settings_url_and_role()
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, compare_type=True)
    context.config.attributes["app_role"] = role
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url, role = _settings_url_and_role()
    context.config.attributes["app_role"] = role
    connectable = config.attributes.get("connection")
    if connectable is not None:
        context.configure(connection=connectable, target_metadata=target_metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
