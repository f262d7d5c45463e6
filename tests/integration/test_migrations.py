"""The migration chain on an empty database, and agreement between migration and models."""

from __future__ import annotations

import os
import secrets

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from baton.core.models import TENANT_SCOPED_TABLES, Base
from tests.conftest import APP_ROLE, alembic_config, create_database, drop_database


@pytest.fixture()
def empty_db():  # type: ignore[no-untyped-def]
    name = f"baton_mig_{os.getpid()}_{secrets.token_hex(3)}"
    url = create_database(name)
    yield url
    drop_database(name)


def test_upgrade_downgrade_upgrade_on_an_empty_database(empty_db: str) -> None:
    cfg = alembic_config(empty_db)
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "base")
    engine = create_engine(empty_db)
    with engine.connect() as conn:
        left = set(inspect(conn).get_table_names()) - {"alembic_version"}
    assert left == set()
    command.upgrade(cfg, "head")
    with engine.connect() as conn:
        assert set(Base.metadata.tables) <= set(inspect(conn).get_table_names())
    engine.dispose()


def test_autogenerate_finds_no_difference(pg_url: str) -> None:
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == []


def test_service_role_is_bound_by_row_level_security(pg_url: str) -> None:
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        role = conn.execute(
            text("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = :r"), {"r": APP_ROLE}
        ).one()
        assert role == (False, False)
        owners = conn.execute(
            text("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
        ).scalars().all()
        assert APP_ROLE not in owners
        rls = dict(conn.execute(text(
            "SELECT relname, relrowsecurity FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
        )).all())
    engine.dispose()
    for table in (*TENANT_SCOPED_TABLES, "tenants"):
        assert rls[table], f"{table} has no row-level security"


def test_db_current_json_says_whether_the_schema_is_at_head(pg_url) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from baton.cli.main import app

    out = CliRunner().invoke(app, ["db", "current", "--url", pg_url, "--json"])
    assert out.exit_code == 0, out.output
    state = json.loads(out.output)
    assert state["up_to_date"] is True and state["revision"] == state["head"] and state["head"].startswith("00")
