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
    monkeypatch.setenv("BATON_ENV", "prod")
    with pytest.raises(ConfigurationError, match="KEY_SECRET"):
        load_settings()
    monkeypatch.setenv("BATON_SECURITY__KEY_SECRET", "x" * 40)
    monkeypatch.setenv("BATON_SECURITY__SESSION_SECRET", "y" * 40)
    assert load_settings().env == "prod"
