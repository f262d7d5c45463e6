from __future__ import annotations

import pytest

from baton.core.errors import ConfigurationError
from baton.core.settings import load_settings


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_GATEWAY__PORT", "9123")
    monkeypatch.setenv("BATON_DB__APP_ROLE", "svc")
    s = load_settings()
    assert s.gateway.port == 9123
    assert s.db.app_role == "svc"
    assert s.db.service_url().startswith("postgresql+psycopg://svc@")


def test_production_refuses_development_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # no var/baton.env from a local `baton up`
    monkeypatch.delenv("BATON_SECURITY__KEY_SECRET", raising=False)  # the tests' own (tests/conftest.py)
    monkeypatch.setenv("BATON_ENV", "prod")
    with pytest.raises(ConfigurationError, match="KEY_SECRET"):
        load_settings()
    monkeypatch.setenv("BATON_SECURITY__KEY_SECRET", "x" * 40)
    monkeypatch.setenv("BATON_SECURITY__SESSION_SECRET", "y" * 40)
    assert load_settings().env == "prod"


def test_the_cli_finds_the_stacks_settings_from_any_folder_inside_the_checkout(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from baton.core.settings import load_settings, stack_env_file

    monkeypatch.delenv("BATON_STATE_DIR", raising=False)
    monkeypatch.delenv("BATON_SECURITY__KEY_SECRET", raising=False)
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "baton.env").write_text("BATON_SECURITY__KEY_SECRET=from-the-stack\n")
    deep = tmp_path / "docs" / "notes"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert stack_env_file() == tmp_path / "var" / "baton.env"
    s = load_settings()
    assert s.security.key_secret.get_secret_value() == "from-the-stack" and s.state_dir == tmp_path / "var"
    elsewhere = tmp_path / "other"
    (elsewhere / "state").mkdir(parents=True)
    monkeypatch.setenv("BATON_STATE_DIR", str(elsewhere / "state"))
    assert stack_env_file() is None  # $BATON_STATE_DIR names the stack: no search
