"""The chaos harness itself, against a real gateway process on Postgres and Redis with the stub engine
as upstream (no Ray): the ledger sees clean completions, the client drops it injects come back as
``cancelled`` in the request records, and every accepted request has its usage record."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from baton.bench.procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def endpoint(settings, db, tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # type: ignore[no-untyped-def]
    from baton.bench.chaos.stack import Endpoint
    from baton.control.keys import KeyService
    from baton.core import models as m

    logs = tmp_path_factory.mktemp("harness")
    stub_port, gw_port = free_port(), free_port()
    stub = Proc("stub", [sys.executable, "-m", "tests.integration.gateway.stub_upstream", "--port", str(stub_port)],
                cwd=ROOT, log_path=logs / "stub.log").start()
    name = f"stub-chaos-{uuid.uuid4().hex[:6]}"
    env = {"BATON_ENV": "test", "BATON_DB__URL": settings.db.url, "BATON_DB__APP_ROLE": settings.db.app_role,
           "BATON_DB__APP_URL": settings.db.service_url(), "BATON_REDIS__URL": settings.redis.url,
           "BATON_SECURITY__KEY_SECRET": settings.security.key_secret.get_secret_value(),
           "BATON_GATEWAY__UPSTREAMS": json.dumps({name: f"http://127.0.0.1:{stub_port}/v1"})}
    gw = Proc("gateway", [sys.executable, "-m", "baton.cli.main", "gateway", "run", "--port", str(gw_port)],
              env=env, cwd=ROOT, log_path=logs / "gateway.log").start()
    try:
        stub.wait_http(f"http://127.0.0.1:{stub_port}/v1/models", timeout_s=30)
        gw.wait_http(f"http://127.0.0.1:{gw_port}/healthz", timeout_s=60)
        with db.system() as uow:
            uow.models.add(m.Model(name=name, source="/nonexistent", context_length=4096, num_layers=2,
                                   num_kv_heads=2, head_dim=32, dtype="float32"))
            t = uow.tenants.add(m.Tenant(name=name, display_name=name))
            uow.commit()
            model = uow.models.by_name(name)
            uow.tenant_models.grant(t.id, model.id)
            uow.commit()
            tenant_id = t.id
        key = KeyService(db, settings).issue(tenant_id=tenant_id, name="chaos", created_by="test").secret
        yield Endpoint(gateway_url=f"http://127.0.0.1:{gw_port}", api_key=key, model=name, app="none",
                       tenant_id=tenant_id, db=db)
    finally:
        gw.stop()
        stub.stop()


def test_drops_are_cancelled_and_everything_is_metered(endpoint) -> None:
    from baton.bench.chaos.drill import DrillConfig, run_drill

    cfg = DrillConfig(kills=0, stalls=0, tier_downs=0, drops=3, prompts=3, concurrency=3, max_tokens=40,
                      gap_s=(0.3, 0.8), duration_s=3, tail_s=1, extra_body={"stub_token_delay": 0.05})
    result = run_drill(endpoint, cfg, log=lambda _m: None)
    assert result["faults_fired"] == {"drop": 3}, result["faults"]
    assert result["cancelled"] == 3
    assert result["completed"] == result["sent"] - 3 > 0
    assert result["lost"] == result["truncated_200s"] == result["duplicated_tokens"] == 0
    assert result["text_mismatches"] == 0 and result["token_unit"] == "char"
    assert result["postgres"]["checked"] == result["sent"]
    assert result["usage_records_ok"] and result["record_states_ok"], result["postgres"]
    assert result["ok"], result["invariants"]


def test_a_stream_the_engine_cuts_is_a_readable_failure_not_a_truncated_200(endpoint) -> None:
    from baton.bench.chaos.drill import DrillConfig, LoadDriver
    from baton.bench.chaos.ledger import Baseline, judge

    cfg = DrillConfig(max_tokens=10, token_ids=False, extra_body={"stub_cut_after": 4})
    drv = LoadDriver(endpoint, cfg, ["hello"])

    async def one():  # type: ignore[no-untyped-def]
        try:
            return await drv.send(0)
        finally:
            await drv.close()

    rec = asyncio.run(one())
    v = judge(rec, Baseline(text="tok " * 10))
    assert rec.http_status == 200
    assert v.state == "failed" and v.error, v
    assert v.duplicated == v.mismatched == 0 and v.text_ok
    # what the stream never sent (6 of 10 tokens, in characters) is missing, not forgiven as a prefix
    assert v.missing == v.missing_tail == len("tok " * 6), v

