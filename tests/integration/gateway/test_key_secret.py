"""A process whose key secret is not the one the live keys were made with says so instead of minting keys no
gateway accepts or answering every key with 401: ``baton keys create`` exits 1 naming both secrets'
fingerprints (never a secret), and a real ``baton gateway run`` process reports itself misconfigured on
``/healthz`` (503) and answers a key with 503 ``key_secret_mismatch``, while its log says why. Once the keys of
the other secret are revoked, the new secret may begin. On a database of the module's own (the session's holds
other tests' live keys)."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from baton.bench.procs import Proc, free_port
from baton.cli.main import app
from baton.control.keys import KeyService
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database
from baton.core.secrets import secret_fingerprint
from tests.conftest import own_database

ROOT = Path(__file__).resolve().parents[3]
OTHER = "another-key-secret-entirely"


@pytest.fixture(scope="module")
def own() -> Iterator[tuple[Any, Database]]:
    """The live keys of the session's database are other tests' (the check looks at every one)."""
    with own_database("baton_test_key_secret") as own:
        yield own


def _env(settings: Any, secret: str) -> dict[str, str]:
    return {"BATON_ENV": "test", "BATON_DB__URL": settings.db.url, "BATON_DB__APP_ROLE": settings.db.app_role,
            "BATON_DB__APP_URL": settings.db.service_url(), "BATON_REDIS__URL": settings.redis.url,
            "BATON_SECURITY__KEY_SECRET": secret}


def _other(settings: Any) -> Any:
    return settings.model_copy(update={"security": settings.security.model_copy(
        update={"key_secret": type(settings.security.key_secret)(OTHER)})})


def test_a_process_with_another_key_secret_refuses_to_mint_and_to_check_keys(own, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings, db = own
    with db.system() as uow:
        tenant = uow.tenants.add(m.Tenant(name=f"ks-{uuid.uuid4().hex[:8]}", display_name="KS"))
        uow.commit()
    ours = KeyService(db, settings)
    issued = ours.issue(tenant_id=tenant.id, name="first", created_by="test")
    mine, theirs = secret_fingerprint(OTHER), ours.fingerprint

    # the service layer: no key is made, the message names both fingerprints and neither secret
    with pytest.raises(errors.KeySecretMismatchError) as refused:
        KeyService(db, _other(settings)).issue(tenant_id=tenant.id, name="second", created_by="test")
    message = refused.value.message
    assert mine in message and theirs in message and OTHER not in message and "test-key-secret" not in message
    # the CLI, as a script would meet it: exit 1 and the sentence
    out = CliRunner().invoke(app, ["keys", "create", "-t", tenant.name, "--name", "cli"], env=_env(settings, OTHER))
    assert out.exit_code == 1 and mine in out.output and "bt_live_" not in out.output, out.output
    assert len(ours.list(tenant_id=tenant.id)) == 1

    # a gateway process with the other secret: misconfigured on /healthz, a key gets 503 with no internals
    port = free_port()
    gw = Proc("gateway", [sys.executable, "-m", "baton.cli.main", "gateway", "run", "--port", str(port)],
              env=_env(settings, OTHER), cwd=ROOT, log_path=tmp_path / "gateway.log").start()
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert gw.alive(), gw.log_tail()
            try:
                health = httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, gw.log_tail()
                time.sleep(0.5)
        assert health.status_code == 503 and health.json()["status"] == "misconfigured", health.text
        r = httpx.get(f"{base}/v1/models", headers={"authorization": f"Bearer {issued.secret}"}, timeout=10)
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "key_secret_mismatch" and theirs not in error["message"], error
        log = (tmp_path / "gateway.log").read_text()
        assert "API keys cannot be checked" in log and mine in log and OTHER not in log, log[-2000:]
    finally:
        gw.stop()

    # once the other secret's keys are revoked, this secret may begin (and its key carries its fingerprint)
    ours.revoke(tenant_id=tenant.id, key_id=issued.key.id, actor="test")
    fresh = KeyService(db, _other(settings)).issue(tenant_id=tenant.id, name="second", created_by="test")
    with db.system() as uow:
        row = uow.api_keys.get(fresh.key.id)
        assert row is not None and row.secret_fingerprint == mine
    with pytest.raises(errors.KeySecretMismatchError):  # and now the first secret is the stranger
        ours.issue(tenant_id=tenant.id, name="third", created_by="test")
