"""Fuzzing ``/admin/v1`` from its own OpenAPI document (real Postgres): whatever an admin sends, no 5xx,
and every error is an RFC 9457 problem document."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from .conftest import ADMIN_TOKEN

MAX_EXAMPLES = 12
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_admin_request_makes_the_api_fail(admin_app: FastAPI, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", admin_app)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) > 40
    failures: list[str] = []
    for operation in operations:
        strategy = operation.as_strategy(generation_mode=mode)

        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            case.headers = {**(case.headers or {}), **HEADERS}
            response = case.call()
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                f"{case.body!r:.300} {response.text[:300]}")
                return
            if response.status_code >= 400:
                ctype = response.headers.get("content-type")
                ctype = ctype[0] if isinstance(ctype, list) else ctype
                assert ctype.startswith("application/problem+json"), response.text
                doc = response.json()
                assert doc["status"] == response.status_code and doc["title"] and doc["type"]

        given(strategy)(run)()
    assert failures == []
