"""Fuzzing ``/v1`` from the gateway's own OpenAPI document: whatever a client sends, no 5xx.

The gateway app runs under uvicorn in this process (real Postgres, Redis, and the stub engine as its
upstream: the thing under test is the gateway's input handling). Schemathesis generates valid and
invalid requests for every operation; every answer must be a non-5xx with a body in OpenAI's shape
for errors.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from baton.control.keys import KeyService
from baton.core.db import Database
from tests.integration.gateway.conftest import Catalogue, TenantKey, create_tenant_key

MAX_EXAMPLES = 60


@pytest.fixture(scope="module")
def fuzz_key(catalogue: Catalogue, db: Database, keys: KeyService) -> TenantKey:
    return create_tenant_key(db, keys, [catalogue.small, catalogue.big])


def _schema(gateway_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{gateway_url}/openapi.json")


def _operations(gateway_url: str) -> list[Any]:
    schema = _schema(gateway_url)
    return [op.ok() for op in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_makes_the_gateway_fail(gateway_url: str, fuzz_key: TenantKey, catalogue: Catalogue,
                                           mode: GenerationMode) -> None:
    operations = [op for op in _operations(gateway_url) if op.path.startswith("/v1/")]
    assert {op.path for op in operations} >= {"/v1/models", "/v1/chat/completions", "/v1/completions"}
    failures: list[str] = []
    for operation in operations:
        strategy = operation.as_strategy(generation_mode=mode)

        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            body = case.body
            if mode is GenerationMode.POSITIVE and isinstance(body, dict) and "model" in body:
                body["model"] = catalogue.big  # reach the upstream too, not only the model check
            response = case.call(headers=fuzz_key.headers, timeout=30)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}")
            assert response.status_code < 500, response.text
            if response.status_code >= 400:
                err = response.json().get("error")
                assert isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err), response.text

        given(strategy)(run)()
    assert failures == []
