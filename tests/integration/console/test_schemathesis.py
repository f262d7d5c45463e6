"""Fuzzing ``/console/api`` from its own OpenAPI document (the real console router, real Postgres and
Redis), signed in as an operator with the session's CSRF token: whatever the browser (or anyone holding
a session) sends, no 5xx, and every error is a problem document in words.

Positive cases reach the use cases behind the routes: path ids of models, deployments and policies are
swapped for real ones (except on ``DELETE``), so the planner, the deployment validation and the SLO
policies see generated bodies, not only a 404. Bounded: a few examples per operation (well under two
minutes in all).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from baton.api.console.auth import COOKIE_NAME, CSRF_HEADER
from baton.core.db import Database

from .conftest import Session, add_model

#: Examples per operation and mode (``BATON_FUZZ_EXAMPLES`` for a longer hunt).
MAX_EXAMPLES = int(os.environ.get("BATON_FUZZ_EXAMPLES", "10"))
#: Ending the session would leave the rest of the run signed out.
SKIPPED = {("POST", "/console/api/logout")}


@pytest.fixture()
def real_ids(operator: Session, db: Database) -> dict[str, str]:
    model = add_model(db)
    dep = operator.post("/console/api/ops/deployments", json={"name": f"fz-{uuid.uuid4().hex[:8]}",
                                                             "model_id": str(model.id)})
    pol = operator.post("/console/api/ops/slo-policies", json={"name": f"fz-{uuid.uuid4().hex[:8]}",
                                                               "ttft_ms": 500, "tpot_ms": 50})
    assert dep.status_code == 201 and pol.status_code == 201, (dep.text, pol.text)
    return {"model_id": str(model.id), "deployment_id": dep.json()["id"], "policy_id": pol.json()["id"]}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_console_request_makes_the_api_fail(console_app: FastAPI, operator: Session, real_ids: dict[str, str],
                                               mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", console_app)
    operations = [op.ok() for op in schema.get_all_operations()]
    operations = [op for op in operations
                  if op.path.startswith("/console/api/") and (op.method.upper(), op.path) not in SKIPPED]
    assert {"/console/api/ops/models/{model_id}/plan", "/console/api/ops/deployments/{deployment_id}",
            "/console/api/ops/slo-policies/{policy_id}"} <= {op.path for op in operations}
    cookie = operator.client.cookies.get(COOKIE_NAME)
    assert cookie
    headers = {CSRF_HEADER: operator.csrf}
    failures: list[str] = []
    seen: set[str] = set()
    try:
        _fuzz(operations, mode, headers, cookie, real_ids, failures, seen)
    finally:
        # generated sign-ins fail: they must not throttle the test client's address for the tests after
        redis = console_app.state.console.redis
        for key in redis.scan_iter("baton:console:login:*"):
            redis.delete(key)
    assert len(seen) > 20, seen
    assert failures == []


def _fuzz(operations: list[Any], mode: GenerationMode, headers: dict[str, str], cookie: str,
          real_ids: dict[str, str], failures: list[str], seen: set[str]) -> None:
    for operation in operations:
        strategy = operation.as_strategy(generation_mode=mode)

        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            if mode is GenerationMode.POSITIVE and case.method.upper() != "DELETE" and case.path_parameters:
                for name in list(case.path_parameters):
                    if name in real_ids:
                        case.path_parameters[name] = real_ids[name]
            try:
                response = case.call_and_validate(headers=headers, cookies={COOKIE_NAME: cookie},
                                                  checks=[not_a_server_error])
            except AssertionError:
                raise
            except Exception as exc:  # a failed check: keep going, report them all at the end
                failures.append(f"{case.method} {case.formatted_path}: {type(exc).__name__}: {str(exc)[:400]}")
                return
            if os.environ.get("BATON_FUZZ_LOG"):
                with open(os.environ["BATON_FUZZ_LOG"], "a") as log:
                    log.write(f"{case.method} {case.operation.path} {response.status_code}\n")
            if response.status_code >= 400:
                ctype = response.headers.get("content-type")
                ctype = ctype[0] if isinstance(ctype, list) else ctype
                assert ctype and ctype.startswith("application/problem+json"), (case.formatted_path, response.text)
                doc = response.json()
                assert doc["status"] == response.status_code and doc["title"] and doc["detail"], doc
                assert "Input should" not in doc["detail"], doc  # plain words, never pydantic's

        try:
            given(strategy)(run)()
        except Unsatisfiable:
            # No invalid request exists for this operation (no parameters, no body): nothing to fuzz.
            assert mode is GenerationMode.NEGATIVE, operation.path
            continue
        seen.add(operation.path)
