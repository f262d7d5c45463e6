"""``baton keys`` as a script uses it, on real Postgres: create, list --json (whole ids), revoke by the
listed id; and from a folder with no stack settings, a clear refusal instead of a key no gateway takes."""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from baton.cli.main import app
from baton.core import models as m


def _env(settings) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"BATON_ENV": "test", "BATON_DB__URL": settings.db.url, "BATON_DB__APP_ROLE": settings.db.app_role,
            "BATON_DB__APP_URL": settings.db.service_url(), "BATON_REDIS__URL": settings.redis.url,
            "BATON_SECURITY__KEY_SECRET": settings.security.key_secret.get_secret_value()}


def test_keys_are_scriptable_create_list_json_revoke(settings, db) -> None:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        t = uow.tenants.add(m.Tenant(name=f"cli-{uuid.uuid4().hex[:8]}", display_name="CLI"))
        uow.commit()
        name = t.name
    runner = CliRunner()
    env = _env(settings)
    made = runner.invoke(app, ["keys", "create", "-t", name, "--name", "ci"], env=env)
    assert made.exit_code == 0, made.output
    listed = runner.invoke(app, ["keys", "list", "-t", name, "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    [row] = [json.loads(line) for line in listed.output.splitlines()]
    assert row["name"] == "ci" and row["state"] == "active" and str(uuid.UUID(row["id"])) == row["id"]
    # rotate --json: the successor's id and secret in one object, as create --json gives them
    rotated = runner.invoke(app, ["keys", "rotate", "-t", name, row["id"], "--overlap-hours", "0", "--json"], env=env)
    assert rotated.exit_code == 0, rotated.output
    new = json.loads(rotated.output)
    assert new["id"] != row["id"] and new["secret"].startswith("bt_") and new["state"] == "active"
    made2 = runner.invoke(app, ["keys", "create", "-t", name, "--name", "ci2", "--json"], env=env)
    second = json.loads(made2.output)
    assert second["name"] == "ci2" and second["secret"] != new["secret"]
    for key_id in (new["id"], second["id"]):
        gone = runner.invoke(app, ["keys", "revoke", "-t", name, key_id], env=env)
        assert gone.exit_code == 0, gone.output
    assert all(json.loads(line)["state"] != "active" for line in
               runner.invoke(app, ["keys", "list", "-t", name, "--json"], env=env).output.splitlines())


def test_keys_refuse_to_sign_with_the_development_secret_when_no_stack_is_found(settings, tmp_path,
                                                                                 monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BATON_SECURITY__KEY_SECRET", raising=False)
    monkeypatch.delenv("BATON_STATE_DIR", raising=False)
    env = {k: v for k, v in _env(settings).items() if k != "BATON_SECURITY__KEY_SECRET"}
    out = CliRunner().invoke(app, ["keys", "create", "-t", "anyone", "--name", "x"], env=env)
    assert out.exit_code == 2 and "No stack settings found" in out.output
