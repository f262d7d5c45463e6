"""Shared fixtures: one fresh Postgres database per test run, migrated, dropped at the end."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

pytest_plugins = ["tests.stages", "tests.shared_stack"]

ROOT = Path(__file__).resolve().parents[1]
PG_SERVER = os.environ.get("BATON_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
APP_ROLE = os.environ.get("BATON_TEST_APP_ROLE", "baton_app")
#: The key secret of every test database's keys, in this process's environment too: whatever loads Baton's
#: settings here or in a process started from here (a bench, a CLI call) signs keys as the tests' gateways
#: check them (a process with another secret refuses to mint keys beside theirs: ``key_secret_mismatch``).
TEST_KEY_SECRET = "test-key-secret"
os.environ["BATON_SECURITY__KEY_SECRET"] = TEST_KEY_SECRET


def _admin_engine():  # type: ignore[no-untyped-def]
    return create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")


def create_database(name: str) -> str:
    eng = _admin_engine()
    with eng.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    return f"{PG_SERVER}/{name}"


def drop_database(name: str) -> None:
    eng = _admin_engine()
    with eng.connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :d AND pid <> pg_backend_pid()"
            ),
            {"d": name},
        )
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    eng.dispose()


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["url"] = url
    cfg.attributes["app_role"] = APP_ROLE
    return cfg


@contextmanager
def migrated_database(prefix: str = "baton_test") -> Iterator[str]:
    """Owner URL of a new database migrated to head; dropped on exit."""
    from alembic import command

    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
    url = create_database(name)
    try:
        command.upgrade(alembic_config(url), "head")
        yield url
    finally:
        drop_database(name)


@contextmanager
def own_database(prefix: str):  # type: ignore[no-untyped-def]
    """A test module's own migrated database: its settings and its service-role :class:`Database` (for a
    module whose checks look at *every* row, which the session's database shares with other tests)."""
    from baton.core.db import Database

    with migrated_database(prefix) as url:
        settings = settings_for(url)
        db = Database.for_services(settings)
        try:
            yield settings, db
        finally:
            db.dispose()


def settings_for(pg_url: str):  # type: ignore[no-untyped-def]
    """Baton's settings for tests against the database at ``pg_url`` (the service role for serving)."""
    from baton.core.settings import load_settings

    app_url = make_url(pg_url).set(username=APP_ROLE).render_as_string(hide_password=False)
    return load_settings(
        env="test",
        db={"url": pg_url, "app_role": APP_ROLE, "app_url": app_url},
        security={"key_secret": TEST_KEY_SECRET, "session_secret": "test-session-secret"},
    )


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """Owner URL of a database made for this test run and migrated to head."""
    with migrated_database() as url:
        yield url


@pytest.fixture(scope="session")
def settings(pg_url: str):  # type: ignore[no-untyped-def]
    return settings_for(pg_url)


@pytest.fixture(scope="session")
def db(settings):  # type: ignore[no-untyped-def]
    """The service-role database (row-level security applies)."""
    from baton.core.db import Database

    database = Database.for_services(settings)
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def owner_db(settings):  # type: ignore[no-untyped-def]
    from baton.core.db import Database

    database = Database.for_owner(settings)
    yield database
    database.dispose()


@pytest.fixture(autouse=True, scope="module")
def _no_orphaned_engines() -> Iterator[None]:
    """After each module, ends vLLM engine processes whose parent died (a killed replica's engine), so
    a long suite's memory stays flat. Only orphans: live engines of running fixtures are untouched."""
    yield
    try:
        import psutil
    except ImportError:
        return
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        try:
            cmd = proc.info["cmdline"] or []
            if cmd and cmd[0].startswith("VLLM::") and proc.info["ppid"] == 1:
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
